// The target's forward in the GGUF's own precision, and the EAGLE-3 draft head's layer beside it
// (eagle2/model/quantized.py drives both through ctypes, which lets go of the GIL; qlib.py builds the
// library and mirrors its structs).
//
// qabi.h holds the structs the calls take, qblocks.h the weights' blocks and the activations' int8
// rows, qmatmul.h the integer kernels (one per instruction set, chosen once), qrows.h and
// qattention.h the float parts (each beside its scalar reference), qprobe.h the micro-kernels
// `profile` measures this machine with, qteam.h a call's thread team (its share of the work, its
// barrier, its clock), qtree.h a cycle's work around the forwards as arrays. This file is the
// forward; the checked boundary (qlayout.h) is included where its exports begin, the draft step
// (qdraft.h), the tree driver (qdraft_tree.h), the whole greedy cycle (qcycle.h) and the tests'
// exports (qtest_exports.h) at its end.
//
// One call is one OpenMP parallel region: the threads run every layer together and meet at the
// call's own barrier (SpinBarrier: after each matmul, after the norms, after attention), instead
// of a region per matmul with the norms and quantisation serial between them. Work is split by
// whole outputs (each computed by one thread, never split sums) and by whole rows, so a row's
// results are the same bits whether it runs alone (plain decoding) or as row k of a tree
// (speculative decoding), at any thread count and with any instruction set: greedy identity by
// construction, not by margin.
//
// Built with -mavx2 -mfma -mf16c -ffp-contract=off (no fused multiply-add the code does not spell
// out); the wider dot products are chosen at run time. Threads come from OpenMP, the runtime torch
// itself loads.
#include "qattention.h"
#include "qblocks.h"
#include "qmatmul.h"
#include "qprobe.h"
#include "qteam.h"
#include "qtree.h"

#include <omp.h>

#include <chrono>
#include <cstddef>
#include <string>

#include "qabi.h"

namespace {

using namespace qf;

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
// converted from fp16 once for them all), how many query-key pairs it holds, and the thread that
// runs it (-1: share_by_cost decides by cost).
struct AttendItem {
    int kv, i0, i1, shared;
    int64_t cost;
    int owner = -1;
};

constexpr int ROW_BLOCK = 32;  // causal rows a prefill's item takes (3 x 32 queries for SmolLM2)

// The work items of T rows' attention. A few rows (a tree, a plain step): the queries in (kv head,
// query) order cut into one contiguous run per thread, and each run at the kv heads it spans, all
// sharing the committed keys: a thread reads (and converts) each kv head's keys and values once
// for all its queries there (2 threads, 3 kv heads: 4 passes a layer, against 6 when each kv head
// went in two chunks shared by cost; with the values four queries at a time, t(1..8) 0.90-0.94x at
// context 1,000, 2 threads: benchmarks/README.md, attention-items). Many causal rows (a prefill):
// blocks of ROW_BLOCK rows, each sharing every key before its first row, so that a prompt's keys
// are converted once a block instead of read in fp16 by every query. Either way a query's
// arithmetic is attend_queries' one sequence: its bits do not depend on its item.
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
        const int total = KV * per_kv;
        for (int t = 0; t < nt; ++t) {
            const int q1 = (int)((int64_t)total * (t + 1) / nt);
            for (int q = (int)((int64_t)total * t / nt); q < q1;) {
                const int c = q / per_kv, end = std::min(q1, (c + 1) * per_kv);
                add(c, q - c * per_kv, end - c * per_kv, shared);
                items.back().owner = t;
                q = end;
            }
        }
    }
    return items;
}

// This thread's items [lo, hi): its own where they have owners (consecutive), else consecutive
// items of about equal cost (a prefill's blocks grow with their row; an item goes to the thread
// its cost's midpoint falls in).
void share_by_cost(const std::vector<AttendItem>& items, int tid, int nt, int& lo, int& hi) {
    if (!items.empty() && items[0].owner >= 0) {
        for (lo = 0; lo < (int)items.size() && items[lo].owner < tid;) ++lo;
        for (hi = lo; hi < (int)items.size() && items[hi].owner == tid;) ++hi;
        return;
    }
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
#include "qlayout.h"

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

// How far ahead the matmuls ask for their weights, in bytes (0: not at all); only between calls
// (scripts/prefetch_distance.py measures each distance). Returns -1 for a negative one.
int qf_set_prefetch(int bytes) {
    if (bytes < 0) return -1;
    prefetch_bytes().store(bytes);
    return 0;
}
int qf_prefetch() { return prefetch_bytes().load(); }

// How many of a kv head's cached rows attention asks for as it starts (0: no prefetch of the K/V
// cache at all); only between calls (scripts/prefetch_distance.py --kv-rows). -1 for a negative one.
int qf_set_kv_prefetch(int rows) {
    if (rows < 0) return -1;
    prefetch_kv_rows().store(rows);
    return 0;
}
int qf_kv_prefetch() { return prefetch_kv_rows().load(); }

// y [M, N] = x [M, K] @ w^T, x quantised per block first (the tests', the heads' matmuls).
void qf_matmul(const QMat* w, const float* x, int M, float* y, int threads) {
    QRows xq;
    xq.resize(M, w->K);
    for (int r = 0; r < M; ++r) quantise_row(x + (size_t)r * w->K, w->K, r, xq);
    SpinBarrier meet;
#pragma omp parallel num_threads(threads) if (threads > 1)
    {
        Team tm{omp_get_thread_num(), omp_get_num_threads(), Clock(nullptr), {}};
        tm.bind(meet);
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
    SpinBarrier meet;
#pragma omp parallel num_threads(threads) if (threads > 1)
    {
        const int tid = omp_get_thread_num();
        Team tm{tid, omp_get_num_threads(), Clock(thread_prof(prof, tid)), {}};
        tm.bind(meet);
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

// The draft head's step, a cycle's tree in one call, and the float parts one at a time for the
// tests: each in its own file, compiled here as part of this translation unit.
#include "qdraft.h"
#include "qdraft_tree.h"
#include "qcycle.h"
#include "qtest_exports.h"

}  // extern "C"
