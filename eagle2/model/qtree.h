// A speculative cycle's work around the forwards, as arrays: the draft tree's pool, the auto
// budget's rule (the rate of a tree, a call's price by width), the rerank, the verification's
// layout and the commit of the accepted K/V. Plain loops over a few hundred
// numbers: what the Python reference does with lists and numpy (policies/eagle2.py, auto.py,
// cycle/layout.py, llama.KVCache.commit), without an interpreter between the
// draft calls. qforward.cpp's qf_draft_tree drives the drafting with the draft head's step; the
// tests hold each piece to its Python twin.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <vector>

namespace qt {

// A draft call's seconds by its width as the caller has learnt them (auto.CallPrices, which learns
// from the seconds qf_draft_tree returns): NaN where never seen, read between seen widths linearly
// and beyond them flat. Read-only here: a cycle's choices depend on what it was given.
struct Prices {
    const double* s;   // [n] seconds by width
    int n;
    double price(int w, double fallback) const {
        int lo = -1, hi = -1;
        for (int i = 1; i < n; ++i)
            if (!std::isnan(s[i])) {
                if (i <= w) lo = i;
                if (i >= w && hi < 0) hi = i;
            }
        if (lo < 0 && hi < 0) return fallback;
        if (lo < 0) return s[hi];
        if (hi < 0 || hi == lo) return s[lo];
        return (s[hi] - s[lo]) / (hi - lo) * (w - lo) + s[lo];  // np.interp's order
    }
};

// A draft path value's acceptance estimate once calibrated to what the target accepted: its odds
// times `odds` (auto.AcceptanceOdds), p k / (p k + 1 - p); k = 1 is the value itself (EAGLE-2's
// premise). Products and quotients only: numpy computes the same bits (policies/auto.py calibrated).
inline double calibrated(double p, double odds) {
    const double pk = p * odds;
    return pk / (pk + (1.0 - p));
}

// The N <= max_n (the root and the N-1 best of `desc`, sorted best first) with the best expected
// tokens per second (1 + their sum) / (spent + t(N)), the first of equal rates (auto.best_rate).
inline int best_rate(const std::vector<double>& desc, double spent, const double* tn, int max_n, double* rate) {
    const int m = std::min<int>((int)desc.size() + 1, max_n);
    double cum = 0, best = -std::numeric_limits<double>::infinity();
    int arg = 0;
    for (int i = 0; i < m; ++i) {
        const double r = (1.0 + cum) / (spent + tn[i]);
        if (r > best) best = r, arg = i;
        if (i < (int)desc.size()) cum += desc[i];
    }
    if (rate) *rate = best;
    return arg + 1;
}

// The beam width whose draft call makes the best rate, 0 for none (AutoBudgetPolicy.expand_width
// and auto.best_rates): for each width w in {0} and {min(w, nb): w = 1, 2, 4, 8, 16}, the tree's
// candidates are the pool's values (`pool`, best first) and the predicted children of the w best
// beam nodes, calibrated(beam[r] * rank_prob[j]) (r < w, j < k), zeros after (a zero adds only time); the rate
// is best_rate's at spent + the price of a call of width w. The first of equal rates wins (the
// narrowest). The candidates are merged, not sorted again for each width.
inline int best_width(const std::vector<double>& pool, const double* beam, int nb, const double* rank_prob, int k,
                      double odds, double spent, const Prices& prices, double call_guess, const double* tn,
                      int max_n) {
    std::vector<int> widths{0};
    for (int w : {1, 2, 4, 8, 16}) widths.push_back(std::min(w, nb));
    std::sort(widths.begin(), widths.end());
    widths.erase(std::unique(widths.begin(), widths.end()), widths.end());
    std::vector<std::pair<double, int>> kids;  // (predicted value, its beam row), best first
    kids.reserve((size_t)widths.back() * k);
    for (int r = 0; r < widths.back(); ++r)
        for (int j = 0; j < k; ++j) kids.emplace_back(calibrated(beam[r] * rank_prob[j], odds), r);
    std::stable_sort(kids.begin(), kids.end(), [](const auto& a, const auto& b) { return a.first > b.first; });
    const int m = std::min<int>((int)pool.size() + widths.back() * k + 1, max_n);
    int arg = 0;
    double best = -std::numeric_limits<double>::infinity();
    for (int w : widths) {
        const double t = spent + (w ? prices.price(w, call_guess) : 0.0);
        size_t i = 0, j = 0;
        double cum = 0;
        for (int n = 0; n < m; ++n) {  // N = n + 1: the root and the n best candidates
            const double r = (1.0 + cum) / (t + tn[n]);
            if (r > best) best = r, arg = w;
            while (j < kids.size() && kids[j].second >= w) ++j;
            const bool from_pool = i < pool.size() && (j >= kids.size() || pool[i] >= kids[j].first);
            cum += from_pool ? pool[i++] : j < kids.size() ? kids[j++].first : 0.0;
        }
    }
    return arg;
}

// The pool kept for verification: the n-1 best non-root nodes by value (ties: shallower, then
// earlier), closed under parents (Eagle2Policy.rerank). kept[0], the root, always.
inline void rerank(int pool, const float* values, const int32_t* depths, const int32_t* parents, int n, uint8_t* kept) {
    std::vector<int> idx(pool > 0 ? pool - 1 : 0);
    for (int i = 1; i < pool; ++i) idx[i - 1] = i;
    const int keep = std::max(0, std::min(n - 1, pool - 1));
    std::partial_sort(idx.begin(), idx.begin() + keep, idx.end(), [&](int a, int b) {
        if (values[a] != values[b]) return values[a] > values[b];
        if (depths[a] != depths[b]) return depths[a] < depths[b];
        return a < b;
    });
    std::memset(kept, 0, pool);
    kept[0] = 1;
    for (int j = 0; j < keep; ++j) kept[idx[j]] = 1;
    for (int i = 0; i < pool; ++i)
        for (int p = kept[i] ? parents[i] : -1; p >= 0 && !kept[p]; p = parents[p]) kept[p] = 1;
}

// The kept nodes laid out for one target forward (cycle/layout.py): verify order (by depth, then
// pool index: parents first), each one's parent's verify position (-1: the root) and the mask
// [T, T] of ancestors and self. Returns T.
inline int layout(int pool, const uint8_t* kept, const int32_t* depths, const int32_t* parents, int32_t* order,
                  int32_t* parent_pos, uint8_t* mask, int cap) {
    int T = 0;
    for (int i = 0; i < pool; ++i)
        if (kept[i]) order[T++] = i;
    if (T > cap) return -1;
    std::stable_sort(order, order + T, [&](int a, int b) { return depths[a] < depths[b]; });
    std::vector<int32_t> pos_of(pool, -1);
    for (int i = 0; i < T; ++i) pos_of[order[i]] = i;
    std::memset(mask, 0, (size_t)T * T);
    for (int i = 0; i < T; ++i) {
        const int p = parents[order[i]];
        parent_pos[i] = p >= 0 ? pos_of[p] : -1;
        if (parent_pos[i] >= 0) std::memcpy(mask + (size_t)i * T, mask + (size_t)parent_pos[i] * T, T);
        mask[(size_t)i * T + i] = 1;
    }
    return T;
}

// Keep the K/V rows at `slots` (ascending, slots[i] >= length + i) of every plane [planes, cap,
// row bytes], moved to length, length + 1, ... (llama.KVCache.commit).
inline void commit_rows(uint8_t* base, int64_t planes, int cap, int row_bytes, int length, const int64_t* slots,
                        int n) {
    for (int64_t p = 0; p < planes; ++p) {
        uint8_t* plane = base + (size_t)p * cap * row_bytes;
        for (int i = 0; i < n; ++i)
            if (slots[i] != length + i)
                std::memmove(plane + (size_t)(length + i) * row_bytes, plane + (size_t)slots[i] * row_bytes, row_bytes);
    }
}

}  // namespace qt
