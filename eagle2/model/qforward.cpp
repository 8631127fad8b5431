// The target's forward in the GGUF's own precision, and the EAGLE-3 draft head's layer beside it
// (eagle2/model/quantized.py drives both through ctypes, which lets go of the GIL; qlib.py builds the
// library and mirrors its structs).
//
// qblocks.h holds the weights' blocks and the activations' int8 rows, qmatmul.h the integer
// kernels (one per instruction set, chosen once), qattention.h the float parts (each beside its
// scalar reference), qprobe.h the micro-kernels `profile` measures this machine with.
//
// One call is one OpenMP parallel region: the threads run every layer together and meet at
// barriers (after each matmul, after the norms, after attention), instead of a region per matmul
// with the norms and quantisation serial between them. Work is split by whole outputs (each
// computed by one thread, never split sums) and by whole rows, so a row's results are the same
// bits whether it runs alone (plain decoding) or as row k of a tree (speculative decoding), at any
// thread count and with any instruction set: greedy identity by construction, not by margin.
//
// Built with -mavx2 -mfma -mf16c -ffp-contract=off (no fused multiply-add the code does not spell
// out); the wider dot products are chosen at run time. Threads come from OpenMP, the runtime torch
// itself loads.
#include "qattention.h"
#include "qblocks.h"
#include "qmatmul.h"
#include "qprobe.h"
#include "qtree.h"

#include <omp.h>

#include <chrono>
#include <cstddef>
#include <string>

extern "C" {

struct QLayer {
    const float* attn_norm;  // [D]
    QMat q, k, v, o;
    const float* ffn_norm;   // [D]
    QMat gate, up, down;
};

struct QModel {
    int32_t D, H, KV, hd, F, L;
    float eps;
    int32_t vocab;
    const QLayer* layers;  // [L]
    const float* norm;     // [D] final norm
    QMat lm_head;
    QMat embed;            // [vocab, D] the token embedding's blocks (tied models: lm_head's)
};

struct QHead3 {  // the EAGLE-3 draft head's layer (Q8_0 matrices, q/k/v reading 2 x D)
    int32_t D, H, KV, hd, F, norm_before_residual;
    float eps;
    int32_t pad_;
    const float *input_norm, *hidden_norm, *post_norm;
    QMat q, k, v, o, gate, up, down;
};

struct QDraft {  // the EAGLE-3 draft head as one draft step runs it
    QHead3 layer;
    QMat fc;               // [D, width]: the target's states side by side to D (data null: none)
    QMat embed;            // [vocab, D] the token embedding's blocks (the target's, when shared)
    const float* norm;     // [D] the final norm
    QMat lm;               // [V_draft, D] the draft vocabulary's LM head
    const int64_t* ids;    // [V_draft] each draft index's target id, or null (the same)
    int32_t vocab, pad_;
};

// How many children of each drafted node a tree call ranks (tree_modes.TREE_TOPK): a policy's top_k
// is at most this.
constexpr int QT_TOPK = 16;
// How a tree grows (QTreeIn.budget) and which N the auto budget verifies (QTreeIn.explore): the
// numbers of tree_modes.TreeBudget and tree_modes.Explore, which qf_layout lists.
enum TreeBudget : int32_t {
    BUDGET_EAGLE2 = 0,  // every beam node, depth levels, the total_tokens - 1 best kept
    BUDGET_AUTO = 1,    // the auto budget: width by rate each level, N by rate
    BUDGET_AUTO_N = 2,  // N by rate only
};
enum Explore : int32_t { EXPLORE_BEST = 0, EXPLORE_DOUBLE = 1, EXPLORE_HALF = 2 };

struct QTreeIn {  // one cycle's drafting (qf_draft_tree): the root's reading, the head's cache, the rule
    int64_t root;              // the root token
    const float* root_g;       // [D] the head's predicted feature at the root
    const float* root_vals;    // [n_root] the root's best children: log-probs, best first
    const int64_t* root_ids;   // [n_root] their target ids
    int32_t n_root, top_k, depth, total_tokens;  // top_k <= QT_TOPK
    int32_t committed, base_pos;  // the head cache's committed length (the first tree slot), the root pair's position
    int32_t cap, rope_rows;    // the head cache's slots, its RoPE tables' rows
    uint16_t *kc, *vc;         // the head's cache [KV, cap, hd] in fp16
    const float *cos, *sin;    // the head's RoPE tables [rope_rows, hd]
    int32_t budget;            // a TreeBudget
    int32_t explore_depth;     // the budget: one call at least below the root's children this cycle
    int32_t explore;           // an Explore: the budget verifies the best N, twice it or half of it
    int32_t max_width;         // prices has max_width + 1 entries
    double spent0;             // the cycle's seconds spent drafting before this call
    double call_guess;         // a call's price before any was measured
    double decay;              // the prices' running mean
    const double* tn;          // [total_tokens] t(N) in seconds, N = 1, 2, ...
    const double* rank_prob;   // [top_k] a child's draft probability by its rank
    double* prices;            // [max_width + 1] a call's seconds by width (NaN: none seen), updated
    int32_t threads, pad_;
};

struct QTreeOut {  // the pool (index 0: the root) and what verification reads, in caller's arrays
    int32_t cap_nodes, cap_verify;  // the arrays' capacities
    int64_t* tokens;
    int32_t *parents, *depths, *ranks;
    float *logp, *values;
    int32_t* levels;
    uint8_t* kept;
    int32_t* beam;             // [cap_nodes] each level's beam nodes, one level after another
    double* rank_sum;          // [top_k] the draft probabilities of the children of rank r below the
    int32_t* rank_count;       // root's children, summed, and how many (what the budget learns from)
    int32_t* beam_len;         // [depth + 1] how many at each level
    int32_t* order;            // [cap_verify] verify position -> pool index
    int32_t* parent_pos;       // [cap_verify] the parent's verify position (-1: the root)
    uint8_t* mask;             // [cap_verify, cap_verify] ancestors and self, row stride n_verify
    int32_t n, n_beams, draft_calls, n_verify, best_n, pad_;
    double expected;           // the budget's expected tokens at best_n (1 for EAGLE-2)
    double head_s;             // seconds in the draft head's steps (the rest of the call: the tree's work)
};

}  // extern "C"

namespace {

using namespace qf;

// ------------------------------------------------------------------ where a call's time goes

// What `profile` splits a forward into (qlib.OPS names them in this order).
enum Op { OP_QKV, OP_O, OP_GATE_UP, OP_DOWN, OP_LM_HEAD, OP_ATTENTION, OP_QUANTISE, OP_FLOAT, OP_WAIT, N_OPS };

// One thread's seconds per op, when the caller asks (acc non-null); otherwise nothing is read.
struct Clock {
    double* acc;
    std::chrono::steady_clock::time_point t;
    explicit Clock(double* a) : acc(a) {
        if (acc) t = std::chrono::steady_clock::now();
    }
    void lap(int op) {
        if (!acc) return;
        const auto now = std::chrono::steady_clock::now();
        acc[op] += std::chrono::duration<double>(now - t).count();
        t = now;
    }
};

// A thread of the call's team.
struct Team {
    int tid, nt;
    Clock clock;
    std::vector<float> scores, acc, kbuf;  // attention's (attention_block sizes them)
    std::vector<Query> queries;
    // the work since the last lap was `op`; then wait for the whole team
    void sync(int op) {
        clock.lap(op);
#pragma omp barrier
        clock.lap(OP_WAIT);
    }
    // this thread's share [lo, hi) of n items, in whole granules
    void share(int n, int granule, int& lo, int& hi) const {
        const int64_t units = (n + granule - 1) / granule;
        lo = std::min<int64_t>(n, units * tid / nt * granule);
        hi = std::min<int64_t>(n, units * (tid + 1) / nt * granule);
    }
};

// One call's working buffers for T rows (a call's own: concurrent calls share nothing).
struct Buffers {
    std::vector<float> h, q, k, v, att, g, u;
    QRows attn_in, mlp_in, att_q, mid_q;  // the matmuls' quantised inputs
    Buffers(int T, int Din, int D, int H, int KV, int hd, int F)
        : h((size_t)T * Din), q((size_t)T * H * hd), k((size_t)T * KV * hd), v((size_t)T * KV * hd),
          att((size_t)T * H * hd), g((size_t)T * F), u((size_t)T * F) {
        attn_in.resize(T, Din);
        mlp_in.resize(T, D);
        if ((H * hd) % QK == 0) att_q.resize(T, H * hd);
        mid_q.resize(T, F);
    }
};

// Several matrices reading the same rows, their groups of 16 outputs side by side; this thread's
// share of all of them: y_i (+)= x @ w_i^T.
void matmul_shared(Team& tm, const QMat* const* ws, float* const* ys, int count, const QRows& x, bool add = false) {
    int total = 0;
    for (int i = 0; i < count; ++i) total += groups_of(*ws[i]);
    int lo, hi;
    tm.share(total, 1, lo, hi);
    for (int i = 0, first = 0; i < count; first += groups_of(*ws[i]), ++i) {
        const int G = groups_of(*ws[i]);
        matmul_groups(*ws[i], std::max(lo - first, 0), std::min(hi - first, G), x, ys[i], ws[i]->N, add);
    }
}

void matmul_share(Team& tm, const QMat& w, const QRows& x, float* y, bool add) {
    const QMat* ws[1] = {&w};
    matmul_shared(tm, ws, &y, 1, x, add);
}

// Each row's visible cache slots in order of position: the `committed` ones, then its visible
// new rows (slots committed.. in `order`, filtered by `visible` [T, W] or causal when null).
// -1 when a row would see more keys than the cache holds (a caller's bug).
int visible_slots(int T, int committed, int W, const uint8_t* visible, const std::vector<int>& order,
                  int cap, std::vector<std::vector<int32_t>>& slots) {
    slots.assign(T, {});
    for (int t = 0; t < T; ++t) {
        std::vector<int32_t>& r = slots[t];
        r.reserve(committed + W);
        for (int j = 0; j < committed; ++j) r.push_back(j);
        for (int j : order)
            if (visible ? visible[(size_t)t * W + j] != 0 : j <= W - T + t) r.push_back(committed + j);
        if ((int)r.size() > cap) return -1;
    }
    return 0;
}

// One work item of attention: the queries i0..i1-1 of kv head `kv` (query i: row i / group, its
// head i % group of the kv head's group), which share the cache's first `shared` keys (read and
// converted from fp16 once for them all), and how many query-key pairs it holds.
struct AttendItem {
    int kv, i0, i1, shared;
    int64_t cost;
};

constexpr int ROW_BLOCK = 32;  // causal rows a prefill's item takes (3 x 32 queries for SmolLM2)

// The work items of T rows' attention. A few rows (a tree, a plain step): each kv head's queries
// in a few chunks, enough for every thread to have two, all sharing the committed keys. Many causal
// rows (a prefill): blocks of ROW_BLOCK rows, each sharing every key before its first row, so that
// a prompt's keys are converted once a block instead of read in fp16 by every query. Either way a
// query's arithmetic is attend_queries' one sequence: its bits do not depend on its item.
std::vector<AttendItem> attend_items(int T, int KV, int group, int nt, int start, int shared, bool causal,
                                     const std::vector<std::vector<int32_t>>& slots) {
    std::vector<AttendItem> items;
    auto add = [&](int kv, int i0, int i1, int sh) {
        int64_t cost = 0;
        for (int i = i0; i < i1; ++i) cost += (int64_t)slots[i / group].size();
        items.push_back(AttendItem{kv, i0, i1, sh, cost});
    };
    const int per_kv = T * group;
    if (causal && T > 2 * ROW_BLOCK) {
        for (int c = 0; c < KV; ++c)
            for (int t0 = 0; t0 < T; t0 += ROW_BLOCK)
                add(c, t0 * group, std::min(T, t0 + ROW_BLOCK) * group, start + t0);
    } else {
        const int chunks = std::max(1, std::min(per_kv, (2 * nt + KV - 1) / KV));
        for (int c = 0; c < KV; ++c)
            for (int k = 0; k < chunks; ++k) add(c, per_kv * k / chunks, per_kv * (k + 1) / chunks, shared);
    }
    return items;
}

// This thread's items [lo, hi): consecutive items of about equal cost (a prefill's blocks grow
// with their row; an item goes to the thread its cost's midpoint falls in).
void share_by_cost(const std::vector<AttendItem>& items, int tid, int nt, int& lo, int& hi) {
    int64_t total = 0;
    for (const AttendItem& it : items) total += it.cost;
    lo = hi = (int)items.size();
    int64_t before = 0;
    for (int j = 0; j < (int)items.size(); before += items[j++].cost) {
        const int owner = total ? (int)std::min<int64_t>(nt - 1, (2 * before + items[j].cost) * nt / (2 * total))
                                : (int)((int64_t)j * nt / (int64_t)items.size());
        if (owner == tid && lo == (int)items.size()) lo = j;
        if (owner > tid) {
            hi = j;
            break;
        }
    }
    if (lo > hi) lo = hi;
}

struct Attention {  // what one layer's attention reads
    const QMat *q, *k, *v;
    uint16_t *kl, *vl;  // the layer's cache [KV, cap, hd]
};

// The attention of T rows whose input is b.attn_in: q, k, v; RoPE; the new K/V stored in fp16 at
// slots start + t; each query over its slots (the first `shared` of them, slots 0..shared-1, the
// same for every row); the output, quantised, in b.att_q.
void attention_block(Team& tm, const Attention& a, Buffers& b, int T, int H, int KV, int hd, const float* cos,
                     const float* sin, int cap, int start, int shared, bool causal,
                     const std::vector<std::vector<int32_t>>& slots, size_t longest) {
    {
        const QMat* ws[3] = {a.q, a.k, a.v};
        float* ys[3] = {b.q.data(), b.k.data(), b.v.data()};
        matmul_shared(tm, ws, ys, 3, b.attn_in);
    }
    tm.sync(OP_QKV);
    const size_t head_stride = (size_t)cap * hd;
    int lo, hi;
    tm.share(T * (H + KV), 1, lo, hi);
    for (int item = lo; item < hi; ++item) {  // RoPE, and the new K/V into the cache
        const int t = item / (H + KV), j = item % (H + KV);
        const float *c = cos + (size_t)t * hd, *s = sin + (size_t)t * hd;
        if (j < H) {
            rope_head(b.q.data() + ((size_t)t * H + j) * hd, hd, c, s);
        } else {
            float* kr = b.k.data() + ((size_t)t * KV + j - H) * hd;
            rope_head(kr, hd, c, s);
            to_half(kr, a.kl + (j - H) * head_stride + (size_t)(start + t) * hd, hd);
            to_half(b.v.data() + ((size_t)t * KV + j - H) * hd, a.vl + (j - H) * head_stride + (size_t)(start + t) * hd, hd);
        }
    }
    tm.sync(OP_FLOAT);
    const float scale = 1.f / std::sqrt((float)hd);
    const int group = H / KV, width = H * hd;
    const bool quantise_heads = hd % QK == 0;  // a head's output is whole blocks: quantise it here
    const std::vector<AttendItem> items = attend_items(T, KV, group, tm.nt, start, shared, causal, slots);
    int most = 0;
    for (const AttendItem& it : items) most = std::max(most, it.i1 - it.i0);
    const size_t stride = score_stride(longest);
    tm.scores.resize(most * stride);
    tm.acc.resize((size_t)most * hd);
    tm.kbuf.resize((size_t)KEY_CHUNK * hd);
    share_by_cost(items, tm.tid, tm.nt, lo, hi);
    for (int item = lo; item < hi; ++item) {
        const AttendItem& it = items[item];
        const int c = it.kv;
        tm.queries.clear();
        for (int i = it.i0; i < it.i1; ++i) {
            const int t = i / group, hh = c * group + i % group;
            tm.queries.push_back(Query{b.q.data() + ((size_t)t * H + hh) * hd, b.att.data() + (size_t)t * width + hh * hd,
                                       slots[t].data(), (int)slots[t].size()});
        }
        attend_queries(tm.queries.data(), (int)tm.queries.size(), it.shared, a.kl + c * head_stride,
                       a.vl + c * head_stride, hd, scale, tm.scores.data(), stride, tm.acc.data(), tm.kbuf.data(),
                       attention_wide());
        if (quantise_heads) {
            tm.clock.lap(OP_ATTENTION);
            for (int i = it.i0; i < it.i1; ++i) {
                const int t = i / group, hh = c * group + i % group;
                quantise_blocks(b.att.data() + (size_t)t * width, hh * hd / QK, (hh + 1) * hd / QK, t, b.att_q);
            }
            tm.clock.lap(OP_QUANTISE);
        }
    }
    tm.sync(OP_ATTENTION);
    if (!quantise_heads) {  // heads narrower than a block: whole rows, once every head is done
        tm.share(T, 1, lo, hi);
        for (int t = lo; t < hi; ++t) quantise_row(b.att.data() + (size_t)t * width, width, t, b.att_q);
        tm.sync(OP_QUANTISE);
    }
}

struct Mlp {  // what the rest of a layer reads
    const QMat *o, *gate, *up, *down;
    const float* norm;  // before the MLP
};

// x += o_proj(att); x += down(silu(gate(n)) * up(n)) with n = norm(x): the rest of a layer.
void mlp_block(Team& tm, const Mlp& m, Buffers& b, float* x, int T, int D, int F, float eps) {
    matmul_share(tm, *m.o, b.att_q, x, true);
    tm.sync(OP_O);
    int lo, hi;
    tm.share(T, 1, lo, hi);
    for (int t = lo; t < hi; ++t) {
        rmsnorm_row(x + (size_t)t * D, m.norm, b.h.data() + (size_t)t * D, D, eps);
        tm.clock.lap(OP_FLOAT);
        quantise_row(b.h.data() + (size_t)t * D, D, t, b.mlp_in);
    }
    tm.sync(OP_QUANTISE);
    // gate and up for the same outputs, then their SiLU product quantised: whole blocks of 32
    tm.share(groups_of(*m.gate), QK / GROUP, lo, hi);
    matmul_groups(*m.gate, lo, hi, b.mlp_in, b.g.data(), F, false);
    matmul_groups(*m.up, lo, hi, b.mlp_in, b.u.data(), F, false);
    tm.clock.lap(OP_GATE_UP);
    for (int t = 0; t < T && lo < hi; ++t) {
        float* gt = b.g.data() + (size_t)t * F;
        silu_mul(gt + lo * GROUP, b.u.data() + (size_t)t * F + lo * GROUP, (size_t)(hi - lo) * GROUP);
        tm.clock.lap(OP_FLOAT);
        quantise_blocks(gt, lo * GROUP / QK, hi * GROUP / QK, t, b.mid_q);
        tm.clock.lap(OP_QUANTISE);
    }
    tm.sync(OP_QUANTISE);
    matmul_share(tm, *m.down, b.mid_q, x, true);
    tm.sync(OP_DOWN);
}

double* thread_prof(double* prof, int tid) { return prof ? prof + (size_t)tid * N_OPS : nullptr; }

}  // namespace

extern "C" {

// ------------------------------------------------------------------ the checked boundary

// The structs' sizes and field offsets, and the constants the Python side shares (tree_modes.py,
// qlib.TOPK_MAX), "name=value;..." (qlib.py compares its mirrors with them when it loads
// the library).
const char* qf_layout() {
    static const std::string s = [] {
        std::string o;
        auto add = [&](const char* name, size_t v) { o += std::string(name) + "=" + std::to_string(v) + ";"; };
#define QF_SIZE(S) add(#S, sizeof(S))
#define QF_AT(S, F) add(#S "." #F, offsetof(S, F))
        QF_SIZE(QMat), QF_AT(QMat, data), QF_AT(QMat, bias), QF_AT(QMat, N), QF_AT(QMat, type);
        QF_SIZE(QLayer), QF_AT(QLayer, q), QF_AT(QLayer, ffn_norm), QF_AT(QLayer, down);
        QF_SIZE(QModel), QF_AT(QModel, eps), QF_AT(QModel, vocab), QF_AT(QModel, layers), QF_AT(QModel, lm_head);
        QF_AT(QModel, embed);
        QF_SIZE(QHead3), QF_AT(QHead3, input_norm), QF_AT(QHead3, q), QF_AT(QHead3, down);
        QF_SIZE(QDraft), QF_AT(QDraft, fc), QF_AT(QDraft, embed), QF_AT(QDraft, lm), QF_AT(QDraft, ids);
        QF_AT(QDraft, vocab);
        QF_SIZE(QTreeIn), QF_AT(QTreeIn, committed), QF_AT(QTreeIn, kc), QF_AT(QTreeIn, budget);
        QF_AT(QTreeIn, spent0), QF_AT(QTreeIn, tn), QF_AT(QTreeIn, threads);
        QF_SIZE(QTreeOut), QF_AT(QTreeOut, tokens), QF_AT(QTreeOut, beam), QF_AT(QTreeOut, rank_count);
        QF_AT(QTreeOut, n), QF_AT(QTreeOut, expected);
        add("const.TOPK_MAX", TOPK_MAX), add("const.QT_TOPK", QT_TOPK);
        add("const.BUDGET_EAGLE2", BUDGET_EAGLE2), add("const.BUDGET_AUTO", BUDGET_AUTO);
        add("const.BUDGET_AUTO_N", BUDGET_AUTO_N), add("const.EXPLORE_BEST", EXPLORE_BEST);
        add("const.EXPLORE_DOUBLE", EXPLORE_DOUBLE), add("const.EXPLORE_HALF", EXPLORE_HALF);
#undef QF_AT
#undef QF_SIZE
        return o;
    }();
    return s.c_str();
}

int qf_block_bytes(int type) { return block_bytes(type); }

// Rows of a packed matrix as floats (the embedding as a table, made on demand: LANTERN's
// neighbours, the tests). Returns -1 for a row outside it.
int qf_rows(const QMat* w, const int64_t* rows, int n, float* out) {
    for (int i = 0; i < n; ++i) {
        if (rows[i] < 0 || rows[i] >= w->N) return -1;
        dequantise_row(*w, (int)rows[i], out + (size_t)i * w->K);
    }
    return 0;
}
int qf_ops() { return N_OPS; }

// Which integer dot product runs: 0 AVX2, 1 AVX-VNNI, 2 AVX512-VNNI (the CPU's best by default).
int qf_isa() { return isa_choice().load(); }
int qf_supports(int which) { return cpu_has(which) ? 1 : 0; }
// Only between calls (tests, EAGLE2_Q4_KERNELS); -1 for a path this CPU lacks.
int qf_set_isa(int which) {
    if (!cpu_has(which)) return -1;
    isa_choice().store(which);
    return 0;
}

// y [M, N] = x [M, K] @ w^T, x quantised per block first (the tests', the heads' matmuls).
void qf_matmul(const QMat* w, const float* x, int M, float* y, int threads) {
    QRows xq;
    xq.resize(M, w->K);
    for (int r = 0; r < M; ++r) quantise_row(x + (size_t)r * w->K, w->K, r, xq);
#pragma omp parallel num_threads(threads) if (threads > 1)
    {
        Team tm{omp_get_thread_num(), omp_get_num_threads(), Clock(nullptr), {}};
        matmul_share(tm, *w, xq, y, false);
    }
}

// The same in plain C++, one scalar step at a time: what every kernel must equal bit for bit.
void qf_matmul_ref(const QMat* w, const float* x, int M, float* y) {
    QRows xq;
    xq.resize(M, w->K);
    for (int r = 0; r < M; ++r) quantise_row(x + (size_t)r * w->K, w->K, r, xq);
    matmul_reference(*w, xq, y, w->N, false);
}

// This machine, measured (profile's roofline): int8 GMAC/s of one instruction set's inner step (0
// where the CPU lacks it), fp32 multiply-adds a second (G/s), and GB/s read from a buffer of `bytes`.
double qf_int8_peak(int which, int threads) { return int8_peak_gmacs(which, threads); }
double qf_fma_peak(int threads) { return fma_peak_gflops(threads); }
double qf_read_gbs(int64_t bytes, int threads, int repeats) { return read_gbs((size_t)bytes, threads, repeats); }

// The target's forward for T new tokens written at cache slots start..start+T-1.
//   tokens [T] (< vocab); x [T, D] out: the post-norm features.
//   cos, sin [rows, hd]: the RoPE tables (a token at position p reads row p < rows).
//   kc, vc: the cache [L, KV, cap, hd] in fp16, like llama.cpp's (the new K/V are written into it,
//   uncommitted); attention reads half the bytes fp32 would, and rows stay independent of the batch.
//   positions [T]; visible [T, T] (1 where new row t sees new row j: ancestors and self) or null
//   for causal order. Every committed slot 0..start-1 is visible to every row.
//   taps [ntaps]: layers (L: the last one's output) whose entering state goes to aux [T, ntaps D],
//   side by side in that order (what an EAGLE-3 head reads); aux null when ntaps is 0.
//   logits: [T, vocab] for the LM head's outputs of every row, or null; best [T] (with logits, or
//   null): each row's argmax, the first of equal values as torch.argmax.
//   prof: [threads, qf_ops()] seconds added per op and thread, or null.
// Returns 0; -1 when a query would see more keys than the cache holds (a caller's bug), -2 for a
// token or a position outside the tables, -3 for a tap outside 0..L or named twice, -4 for a head
// size attention does not take (head_dim_ok: multiples of 8 up to 128).
int qf_forward(const QModel* md, const int64_t* tokens, float* x, int T, const float* cos, const float* sin, int rows,
               uint16_t* kc, uint16_t* vc, int cap, int start, const int64_t* positions, const uint8_t* visible,
               const int32_t* taps, int ntaps, float* aux, float* logits, int64_t* best, int threads, double* prof) {
    const int D = md->D, H = md->H, KV = md->KV, hd = md->hd, F = md->F;
    if (!head_dim_ok(hd)) return -4;
    if (start < 0 || T < 1 || start + T > cap) return -1;
    for (int t = 0; t < T; ++t)
        if (tokens[t] < 0 || tokens[t] >= md->vocab || positions[t] < 0 || positions[t] >= rows) return -2;
    std::vector<int> tap_of(md->L + 1, -1);  // the aux column of the state entering layer l
    for (int k = 0; k < ntaps; ++k) {  // each column filled exactly once, or nothing runs
        if (taps[k] < 0 || taps[k] > md->L || tap_of[taps[k]] != -1) return -3;
        tap_of[taps[k]] = k;
    }
    std::vector<float> cs((size_t)T * hd), sn((size_t)T * hd);  // the rows of the tables at the positions
    for (int t = 0; t < T; ++t) {
        std::memcpy(cs.data() + (size_t)t * hd, cos + (size_t)positions[t] * hd, sizeof(float) * hd);
        std::memcpy(sn.data() + (size_t)t * hd, sin + (size_t)positions[t] * hd, sizeof(float) * hd);
    }
    std::vector<int> order(T);  // new rows by position (a stable sort: ties keep their order)
    for (int j = 0; j < T; ++j) order[j] = j;
    std::stable_sort(order.begin(), order.end(), [&](int a, int b) { return positions[a] < positions[b]; });
    std::vector<std::vector<int32_t>> slots;
    if (visible_slots(T, start, T, visible, order, cap, slots) != 0) return -1;
    // causal rows in order of position: row t's keys are slots 0..start+t (a prefill's blocks)
    const bool causal = visible == nullptr && std::is_sorted(positions, positions + T);
    size_t longest = 0;
    for (const auto& r : slots) longest = std::max(longest, r.size());
    Buffers b(T, D, D, H, KV, hd, F);
    const size_t layer_stride = (size_t)KV * cap * hd;
#pragma omp parallel num_threads(threads) if (threads > 1)
    {
        const int tid = omp_get_thread_num();
        Team tm{tid, omp_get_num_threads(), Clock(thread_prof(prof, tid)), {}};
        int lo, hi;
        tm.share(T, 1, lo, hi);  // rows
        for (int t = lo; t < hi; ++t) dequantise_row(md->embed, (int)tokens[t], x + (size_t)t * D);
        auto tap = [&](int l, int t) {
            if (tap_of[l] >= 0)
                std::memcpy(aux + ((size_t)t * ntaps + tap_of[l]) * D, x + (size_t)t * D, sizeof(float) * D);
        };
        for (int l = 0; l < md->L; ++l) {
            const QLayer& ly = md->layers[l];
            for (int t = lo; t < hi; ++t) {
                tap(l, t);
                rmsnorm_row(x + (size_t)t * D, ly.attn_norm, b.h.data() + (size_t)t * D, D, md->eps);
                tm.clock.lap(OP_FLOAT);
                quantise_row(b.h.data() + (size_t)t * D, D, t, b.attn_in);
            }
            tm.sync(OP_QUANTISE);
            attention_block(tm, Attention{&ly.q, &ly.k, &ly.v, kc + l * layer_stride, vc + l * layer_stride}, b, T, H,
                            KV, hd, cs.data(), sn.data(), cap, start, start, causal, slots, longest);
            mlp_block(tm, Mlp{&ly.o, &ly.gate, &ly.up, &ly.down, ly.ffn_norm}, b, x, T, D, F, md->eps);
        }
        for (int t = lo; t < hi; ++t) {
            float* xt = x + (size_t)t * D;
            tap(md->L, t);
            rmsnorm_row(xt, md->norm, b.h.data() + (size_t)t * D, D, md->eps);
            std::memcpy(xt, b.h.data() + (size_t)t * D, sizeof(float) * D);
            tm.clock.lap(OP_FLOAT);
            if (logits) quantise_row(xt, D, t, b.mlp_in);
        }
        if (logits) {
            tm.sync(OP_QUANTISE);
            matmul_share(tm, md->lm_head, b.mlp_in, logits, false);
            if (best) {  // each row's argmax (greedy acceptance reads only these)
                tm.sync(OP_LM_HEAD);
                for (int t = lo; t < hi; ++t) best[t] = argmax_row(logits + (size_t)t * md->vocab, md->vocab);
                tm.clock.lap(OP_FLOAT);
            } else {
                tm.clock.lap(OP_LM_HEAD);
            }
        }
    }
    return 0;
}

// One draft step of the EAGLE-3 head (head3.Eagle3Head) for T pairs written at its cache slots
// start..start+T-1, in one call: the hidden input (fc of the target's states side by side, or a
// fed-back output as it is), the layer (attention over [input_norm(embed(token));
// hidden_norm(hidden)], the residual stream the hidden state, normed first with
// norm_before_residual, then the MLP), the final norm, the draft LM head, log-softmax and each
// row's top k. Drafts need no exactness: this saves the torch calls a draft step otherwise makes.
//   tokens [T] target ids (< vocab); features [T, width], width = D or fc's input.
//   kc, vc: the head's cache [KV, cap, hd] in fp16. Slots before `committed` are visible to every
//   row; slots committed..start+T-1 follow tree [T, start + T - committed] (null: causal, start ==
//   committed).
//   g [T, D] out: the layer's output (before the final norm), what children feed back.
//   logp [T - lm_from, V_draft] out: log-probabilities of rows lm_from..T-1; top_vals, top_ids
//   [T - lm_from, k] out (k may be 0): the k best in order, ties to the lower index, ids as target
//   ids. Rows before lm_from run the layer only (absorbing a context reads its last row's).
// Returns 0; -1 when the slots exceed the cache, -2 for a token or width it cannot take or lm_from
// outside 0..T-1, -3 for a top k above TOPK_MAX, -4 for a head size attention does not take (head_dim_ok).
int qf_draft(const QDraft* m, const int64_t* tokens, const float* features, int width, int T, const float* cos,
             const float* sin, uint16_t* kc, uint16_t* vc, int cap, int committed, int start, const uint8_t* tree,
             float* g, float* logp, int k, float* top_vals, int64_t* top_ids, int lm_from, int threads) {
    const QHead3& ly = m->layer;
    const int D = ly.D, H = ly.H, KV = ly.KV, hd = ly.hd, F = ly.F, V = m->lm.N;
    if (!head_dim_ok(hd)) return -4;
    if (committed < 0 || start < committed || T < 1 || start + T > cap) return -1;
    const bool fc = width != D;
    if ((fc && (!m->fc.data || m->fc.K != width)) || k < 0 || k > V || lm_from < 0 || lm_from >= T) return -2;
    if (k > TOPK_MAX) return -3;
    for (int t = 0; t < T; ++t)
        if (tokens[t] < 0 || tokens[t] >= m->vocab) return -2;
    const int W = start + T - committed;
    std::vector<int> order(W);
    for (int j = 0; j < W; ++j) order[j] = j;
    std::vector<std::vector<int32_t>> slots;
    if (visible_slots(T, committed, W, tree, order, cap, slots) != 0) return -1;
    size_t longest = 0;
    for (const auto& r : slots) longest = std::max(longest, r.size());
    Buffers b(T, 2 * D, D, H, KV, hd, F);
    std::vector<float> hidden(fc ? (size_t)T * D : 0), hn((size_t)T * D);
    const float* hid = fc ? hidden.data() : features;
    QRows fc_in, lm_in;
    if (fc) fc_in.resize(T, width);
    lm_in.resize(T - lm_from, D);
#pragma omp parallel num_threads(threads) if (threads > 1)
    {
        Team tm{omp_get_thread_num(), omp_get_num_threads(), Clock(nullptr), {}};
        int lo, hi;
        tm.share(T, 1, lo, hi);
        if (fc) {
            for (int t = lo; t < hi; ++t) quantise_row(features + (size_t)t * width, width, t, fc_in);
            tm.sync(OP_QUANTISE);
            matmul_share(tm, m->fc, fc_in, hidden.data(), false);
            tm.sync(OP_QKV);
        }
        for (int t = lo; t < hi; ++t) {  // h: [T, 2D] = [input_norm(emb) | hidden_norm(hidden)]
            float* ht = b.h.data() + (size_t)t * 2 * D;
            dequantise_row(m->embed, (int)tokens[t], ht + D);  // the row, then its norm in front of it
            rmsnorm_row(ht + D, ly.input_norm, ht, D, ly.eps);
            rmsnorm_row(hid + (size_t)t * D, ly.hidden_norm, hn.data() + (size_t)t * D, D, ly.eps);
            std::memcpy(ht + D, hn.data() + (size_t)t * D, sizeof(float) * D);
            quantise_row(ht, 2 * D, t, b.attn_in);
            std::memcpy(g + (size_t)t * D, ly.norm_before_residual ? hn.data() + (size_t)t * D : hid + (size_t)t * D,
                        sizeof(float) * D);
        }
        tm.sync(OP_QUANTISE);
        attention_block(tm, Attention{&ly.q, &ly.k, &ly.v, kc, vc}, b, T, H, KV, hd, cos, sin, cap, start, committed,
                        tree == nullptr && start == committed, slots, longest);
        mlp_block(tm, Mlp{&ly.o, &ly.gate, &ly.up, &ly.down, ly.post_norm}, b, g, T, D, F, ly.eps);
        int rlo, rhi;  // the rows that get log-probabilities, this thread's share
        tm.share(T - lm_from, 1, rlo, rhi);
        for (int r = rlo; r < rhi; ++r) {
            const size_t t = (size_t)(lm_from + r);
            rmsnorm_row(g + t * D, m->norm, b.h.data() + t * D, D, ly.eps);
            quantise_row(b.h.data() + t * D, D, r, lm_in);
        }
        tm.sync(OP_QUANTISE);
        matmul_share(tm, m->lm, lm_in, logp, false);
        tm.sync(OP_LM_HEAD);
        for (int r = rlo; r < rhi; ++r) {
            float* row = logp + (size_t)r * V;
            log_softmax_row(row, V);
            if (k) top_k_row(row, V, k, m->ids, top_vals + (size_t)r * k, top_ids + (size_t)r * k);
        }
    }
    return 0;
}

// One cycle's draft tree in one call (policies/eagle2.py's EAGLE-2 and policies/auto.py's budget,
// the same decisions without Python between the draft calls). From the root's children (the head's
// reading, given), level by level: the budget (BUDGET_AUTO) weighs each width w of the beam by the
// tree's best expected tokens per second once a call of that width is paid (its price learnt per
// width in `prices`), EAGLE-2 (BUDGET_EAGLE2) and the N-only budget (BUDGET_AUTO_N) take the whole beam; qf_draft runs the
// chosen beam nodes (each sees the committed context, its ancestors and itself), their top_k
// children join the pool with path values, and the top_k best of the level are the next beam. Then
// the N verified: the total_tokens best (EAGLE-2) or the rate's best N, twice or half of it when the
// budget explores (EXPLORE_DOUBLE, EXPLORE_HALF); the rerank keeps the N-1 best nodes and the layout orders them for the
// target. Returns 0; -3 when the arrays are too small or the arguments out of range, -4 for a head
// size attention does not take (head_dim_ok), before any work; else what qf_draft returned.
int qf_draft_tree(const QDraft* m, const QTreeIn* in, QTreeOut* out) {
    const auto t_entry = std::chrono::steady_clock::now();
    auto now = [&] {  // the cycle's drafting seconds so far
        return in->spent0 + std::chrono::duration<double>(std::chrono::steady_clock::now() - t_entry).count();
    };
    const int D = m->layer.D, hd = m->layer.hd, k = in->top_k;
    if (!head_dim_ok(hd)) return -4;
    if (k < 1 || k > QT_TOPK || in->depth < 0 || in->total_tokens < 1 || in->n_root < 0) return -3;
    const int kk = std::min(in->n_root, k);
    int n = 0;
    for (int r = 0; r < k; ++r) out->rank_sum[r] = 0, out->rank_count[r] = 0;
    auto add = [&](int64_t tok, int parent, int depth, int rank, float lp, float val, int level) {
        out->tokens[n] = tok, out->parents[n] = parent, out->depths[n] = depth, out->ranks[n] = rank;
        out->logp[n] = lp, out->values[n] = val, out->levels[n] = level;
        if (level >= 1 && rank < k) out->rank_sum[rank] += std::exp((double)lp), ++out->rank_count[rank];
        return n++;
    };
    if (1 + kk + (int64_t)in->depth * k * k > out->cap_nodes) return -3;
    add(in->root, -1, 0, 0, 0.f, 0.f, -1);
    std::vector<int> beam(kk), rows;
    std::vector<float> beam_vals(kk), beam_g((size_t)kk * D);
    std::vector<int> beam_slot(kk, -1);  // the head cache's tree slot of each beam node (-1: the root's pair)
    for (int j = 0; j < kk; ++j) {
        beam[j] = add(in->root_ids[j], 0, 1, j, in->root_vals[j], in->root_vals[j], 0);
        beam_vals[j] = in->root_vals[j];
        std::memcpy(beam_g.data() + (size_t)j * D, in->root_g, sizeof(float) * D);
    }
    int nb_out = 0, n_beams = 0;
    auto push_beam = [&] {
        for (int b : beam) out->beam[nb_out++] = b;
        out->beam_len[n_beams++] = (int)beam.size();
    };
    push_beam();
    qt::Prices prices{in->prices, in->max_width + 1, in->decay};
    double level_t0 = 0, head_s = 0;
    int width = 0, used = 0, calls = 1;  // the root's call already ran
    const int max_slots = in->depth * k;
    std::vector<uint8_t> anc((size_t)max_slots * max_slots), tree;
    std::vector<float> g((size_t)k * D), top_v((size_t)k * QT_TOPK), cs((size_t)k * hd), sn((size_t)k * hd);
    std::vector<int64_t> top_i((size_t)k * QT_TOPK), toks(k);
    const int V = m->lm.N;
    // the draft's log-probs [k, V], which the tree reads only through each row's top k: one buffer
    // per calling thread, kept (a fresh half-megabyte each call cost its page faults every cycle)
    static thread_local std::vector<float> lp;
    if (lp.size() < (size_t)k * V) lp.resize((size_t)k * V);
    // the pool's values as acceptance estimates, best first, and the beam's children predicted
    auto pool_desc = [&] {
        std::vector<double> v(n - 1);
        for (int i = 1; i < n; ++i) v[i - 1] = std::exp((double)out->values[i]);
        std::sort(v.begin(), v.end(), std::greater<double>());
        return v;
    };
    auto choose_width = [&](int level) {  // AutoBudgetPolicy.expand_width
        const double t = now();
        if (width) prices.observe(width, t - level_t0);
        level_t0 = t, width = 0;
        const int nb = (int)beam.size();
        if (in->budget != BUDGET_AUTO) return width = nb;
        std::vector<double> beam_p(nb);
        for (int r = 0; r < nb; ++r) beam_p[r] = std::exp((double)beam_vals[r]);
        width = qt::best_width(pool_desc(), beam_p.data(), nb, in->rank_prob, k, t, prices, in->call_guess, in->tn,
                               in->total_tokens);
        if (width == 0 && in->explore_depth && level == 1) width = 1;
        return width;
    };
    for (int level = 1; level <= in->depth; ++level) {
        const int w = choose_width(level);
        if (w == 0) break;
        if (w < (int)beam.size()) {  // the w best of the beam (it is in value order)
            beam.resize(w), beam_vals.resize(w), beam_slot.resize(w);
            nb_out -= out->beam_len[n_beams - 1] - w;
            out->beam_len[n_beams - 1] = w;
        }
        const int s0 = used;
        tree.assign((size_t)w * (s0 + w), 0);
        for (int j = 0; j < w; ++j) {
            const int node = beam[j], ps = beam_slot[j], pos = in->base_pos + out->depths[node];
            if (pos < 0 || pos >= in->rope_rows) return -2;
            toks[j] = out->tokens[node];
            std::memcpy(cs.data() + (size_t)j * hd, in->cos + (size_t)pos * hd, sizeof(float) * hd);
            std::memcpy(sn.data() + (size_t)j * hd, in->sin + (size_t)pos * hd, sizeof(float) * hd);
            uint8_t* a = anc.data() + (size_t)(s0 + j) * max_slots;
            if (ps >= 0) std::memcpy(a, anc.data() + (size_t)ps * max_slots, s0);
            a[s0 + j] = 1;
            std::memcpy(tree.data() + (size_t)j * (s0 + w), a, s0 + w);
        }
        const auto t_step = std::chrono::steady_clock::now();
        const int rc = qf_draft(m, toks.data(), beam_g.data(), D, w, cs.data(), sn.data(), in->kc, in->vc, in->cap,
                                in->committed, in->committed + s0, tree.data(), g.data(), lp.data(), QT_TOPK,
                                top_v.data(), top_i.data(), 0, in->threads);
        head_s += std::chrono::duration<double>(std::chrono::steady_clock::now() - t_step).count();
        if (rc != 0) return rc;
        used += w, ++calls;
        const int kc = std::min(k, V), first = n, depth = out->depths[beam[0]] + 1;
        for (int r = 0; r < w; ++r)
            for (int j = 0; j < kc; ++j) {
                const float cv = top_v[(size_t)r * QT_TOPK + j];
                add(top_i[(size_t)r * QT_TOPK + j], beam[r], depth, j, cv, beam_vals[r] + cv, level);
            }
        if (level == in->depth) break;
        // the next beam: the level's top_k children by value (ties: the earlier), parents' outputs
        const int nc = w * kc, nsel = std::min(k, nc);
        rows.resize(nc);
        for (int i = 0; i < nc; ++i) rows[i] = i;
        std::stable_sort(rows.begin(), rows.end(),
                         [&](int a, int b) { return out->values[first + a] > out->values[first + b]; });
        std::vector<float> next_g((size_t)nsel * D);
        beam.resize(nsel), beam_vals.resize(nsel), beam_slot.resize(nsel);
        for (int i = 0; i < nsel; ++i) {
            const int c = rows[i], r = c / kc;
            beam[i] = first + c, beam_vals[i] = out->values[first + c], beam_slot[i] = s0 + r;
            std::memcpy(next_g.data() + (size_t)i * D, g.data() + (size_t)r * D, sizeof(float) * D);
        }
        beam_g.swap(next_g);
        push_beam();
    }
    out->n = n, out->n_beams = n_beams, out->draft_calls = calls, out->head_s = head_s;
    int keep_n = in->total_tokens;
    out->best_n = keep_n, out->expected = 1.0;
    if (in->budget != BUDGET_EAGLE2) {  // AutoBudgetPolicy.keep: the N of the best rate (explored around)
        const double t = now();
        if (width) prices.observe(width, t - level_t0);
        double rate;
        const int best_n = qt::best_rate(pool_desc(), t, in->tn, in->total_tokens, &rate);
        keep_n = in->explore == EXPLORE_DOUBLE ? std::min({in->total_tokens, n, std::max(2, 2 * best_n)})
                 : in->explore == EXPLORE_HALF ? std::max(1, best_n / 2) : best_n;
        out->best_n = best_n, out->expected = rate * (t + in->tn[best_n - 1]);
    }
    qt::rerank(n, out->values, out->depths, out->parents, keep_n, out->kept);
    out->n_verify = qt::layout(n, out->kept, out->depths, out->parents, out->order, out->parent_pos, out->mask,
                               out->cap_verify);
    return out->n_verify < 0 ? -3 : 0;
}

// qt::best_width on given values (the tests hold it to auto.best_rates): pool [n_pool] best first,
// beam [nb] (probabilities), rank_prob [k], prices [n_prices] by width (NaN: none), tn [max_n].
int qf_best_width(const double* pool, int n_pool, const double* beam, int nb, const double* rank_prob, int k,
                  double spent, double* prices, int n_prices, double call_guess, const double* tn, int max_n) {
    const qt::Prices p{prices, n_prices, 0.0};
    return qt::best_width(std::vector<double>(pool, pool + n_pool), beam, nb, rank_prob, k, spent, p, call_guess, tn,
                          max_n);
}

// A row's argmax by the kernel (ref 0) or its reference (ref 1): what the tests compare.
int64_t qf_argmax(const float* x, int n, int ref) { return ref ? argmax_row_ref(x, n) : argmax_row(x, n); }

// The float kernels of qattention.h (ref 0) or their scalar references (ref 1) on given rows: these
// exist for the tests (test_kernel_refs.py), which hold each pair to the same bits.
void qf_rmsnorm(const float* x, const float* w, float* y, int D, float eps, int ref) {
    ref ? rmsnorm_row_ref(x, w, y, D, eps) : rmsnorm_row(x, w, y, D, eps);
}

// y = exp(x) by exp8, 8 at a time, or exp_ref one by one; -1 for the kernel when n is not a multiple of 8
int qf_exp(const float* x, float* y, int n, int ref) {
    if (n < 0 || (!ref && n % 8)) return -1;
    if (ref)
        for (int i = 0; i < n; ++i) y[i] = exp_ref(x[i]);
    else
        for (int i = 0; i < n; i += 8) _mm256_storeu_ps(y + i, exp8(_mm256_loadu_ps(x + i)));
    return 0;
}

// g <- silu(g) * u; -1 for the kernel (which steps by 8) when n is not a multiple of 8
int qf_silu_mul(float* g, const float* u, int n, int ref) {
    if (n < 0 || (!ref && n % 8)) return -1;
    ref ? silu_mul_ref(g, u, (size_t)n) : silu_mul(g, u, (size_t)n);
    return 0;
}

void qf_log_softmax(float* x, int n, int ref) { ref ? log_softmax_row_ref(x, n) : log_softmax_row(x, n); }

// the min(k, n) best into vals, out; -3 for k outside 0..TOPK_MAX
int qf_top_k(const float* x, int n, int k, const int64_t* ids, float* vals, int64_t* out, int ref) {
    if (k < 0 || k > TOPK_MAX) return -3;
    ref ? top_k_row_ref(x, n, k, ids, vals, out) : top_k_row(x, n, k, ids, vals, out);
    return 0;
}

// nq queries q [nq, hd] over one kv head's cache kc, vc [cap, hd] (fp16): query i's keys are
// slots[counts[0] + ... + counts[i-1] ..][0..counts[i]-1], the first `shared` of them 0..shared-1;
// out [nq, hd]. The scratch is sized as attention_block sizes it (score_stride, KEY_CHUNK). -1 for
// slots outside the cache or a list that does not start with the shared ones, -4 for a head size
// attention does not take.
int qf_attend(const float* q, int nq, int hd, const uint16_t* kc, const uint16_t* vc, int cap, const int32_t* slots,
              const int32_t* counts, int shared, float scale, float* out, int ref) {
    if (!head_dim_ok(hd)) return -4;
    if (nq < 1 || shared < 0) return -1;
    std::vector<Query> qs;
    size_t longest = 0;
    for (int i = 0, at = 0; i < nq; at += counts[i++]) {
        if (counts[i] < std::max(shared, 1)) return -1;
        for (int j = 0; j < counts[i]; ++j)
            if (slots[at + j] < 0 || slots[at + j] >= cap || (j < shared && slots[at + j] != j)) return -1;
        qs.push_back(Query{q + (size_t)i * hd, out + (size_t)i * hd, slots + at, counts[i]});
        longest = std::max(longest, (size_t)counts[i]);
    }
    if (ref) {
        attend_queries_ref(qs.data(), nq, kc, vc, hd, scale);
        return 0;
    }
    const size_t stride = score_stride(longest);
    std::vector<float> scores(nq * stride), acc((size_t)nq * hd), kbuf((size_t)KEY_CHUNK * hd);
    attend_queries(qs.data(), nq, shared, kc, vc, hd, scale, scores.data(), stride, acc.data(), kbuf.data(),
                   attention_wide());
    return 0;
}

// The accepted nodes' K/V kept in a cache of `planes` planes [cap, row_bytes] (qt::commit_rows).
// Returns -1 for slots out of order or outside the cache.
int qf_commit(void* k, void* v, int64_t planes, int cap, int row_bytes, int length, const int64_t* slots, int n) {
    for (int i = 0; i < n; ++i)
        if (slots[i] < length + i || slots[i] >= cap || (i && slots[i] <= slots[i - 1])) return -1;
    qt::commit_rows((uint8_t*)k, planes, cap, row_bytes, length, slots, n);
    qt::commit_rows((uint8_t*)v, planes, cap, row_bytes, length, slots, n);
    return 0;
}

}  // extern "C"
