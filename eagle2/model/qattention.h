// The q4_1 forward's attention over the fp16 K/V cache (included by qforward.cpp), on the row
// kernels of qrows.h. It runs in AVX2 code whatever integer kernels run (the shared keys also 16
// lanes wide beside the AVX512 kernels, each lane's operations the same), and reduces each query's
// visible keys one by one in order of absolute position, so a query's output never depends on the
// queries beside it, the thread count or the instruction set. Beside each kernel is its scalar
// reference (`<kernel>_ref`), held to the same bits by tests/test_kernel_refs.py.
#pragma once

#include "qrows.h"

#include <atomic>

namespace qf {

// Attention of several query heads that share a kv head. Each query sees the first `shared` keys
// of the cache (the committed ones: slots 0..shared-1), then its own (its ancestors in a tree and
// itself). The shared keys and values are read and converted from fp16 once for all the queries, a
// block of 8 at a time; each query's arithmetic is the same sequence whatever queries share the
// call, so its output is the same bits alone or beside others:
//   scores: per key, 8-lane partial products over the head (one fma chain), reduced
//   ((a0+a1)+(a2+a3)) + ((a4+a5)+(a6+a7)), times the scale;
//   softmax: their max, the exponentials summed in blocks of 8 by position in the query's list
//   (lane l sums keys l, l+8, ...; a fixed horizontal sum);
//   output: the values weighted one key after another in that order, times 1 / the sum.
struct Query {
    const float* q;        // [hd]
    float* out;            // [hd]
    const int32_t* slots;  // its keys' cache slots in order of position; the first `shared` are 0..shared-1
    int n;                 // how many
};

// 8 keys' scores for query q, scaled, into dst[0..7]: key l's LANES vectors at k + l * kstride
// (fp32, or fp16 when HALF), each key's own fma chain, then the 8 chains reduced side by side.
template <int LANES, bool HALF, class T>
QF_AVX2 inline void scores8(const float* q, const T* k, size_t kstride, __m256 vscale, float* dst) {
    __m256 part[8];
#pragma GCC unroll 16
    for (int i = 0; i < LANES; ++i) {  // a chunk of q at a time, in a register, against every key
        const __m256 qi = _mm256_loadu_ps(q + 8 * i);
#pragma GCC unroll 8
        for (int l = 0; l < 8; ++l) {
            const T* kl = k + l * kstride + 8 * i;
            const __m256 kv = HALF ? half8((const uint16_t*)kl) : _mm256_loadu_ps((const float*)kl);
            part[l] = i == 0 ? _mm256_mul_ps(qi, kv) : _mm256_fmadd_ps(qi, kv, part[l]);
        }
    }
    const __m256 u0 = _mm256_hadd_ps(_mm256_hadd_ps(part[0], part[1]), _mm256_hadd_ps(part[2], part[3]));
    const __m256 u1 = _mm256_hadd_ps(_mm256_hadd_ps(part[4], part[5]), _mm256_hadd_ps(part[6], part[7]));
    const __m256 sum = _mm256_add_ps(_mm256_permute2f128_ps(u0, u1, 0x20), _mm256_permute2f128_ps(u0, u1, 0x31));
    _mm256_storeu_ps(dst, _mm256_mul_ps(sum, vscale));
}

// rows [0, count) of buf [count, hd]: the cache rows at slots first.. (fp16 to fp32, exact)
QF_AVX2 inline void convert_rows(const uint16_t* base, int first, int count, int hd, float* buf) {
    const uint16_t* src = base + (size_t)first * hd;
    for (int i = 0; i < count * hd; i += 8) _mm256_storeu_ps(buf + i, half8(src + i));
}

// the keys at slots[0..count-1], gathered as 8 fp16 rows of buf [8, hd]; rows past count repeat the first
inline void gather8(const uint16_t* base, const int32_t* slots, int count, int hd, uint16_t* buf) {
    for (int l = 0; l < 8; ++l)
        std::memcpy(buf + l * hd, base + (size_t)slots[l < count ? l : 0] * hd, sizeof(uint16_t) * hd);
}

constexpr int KEY_CHUNK = 64;  // shared keys converted at a time (kbuf holds KEY_CHUNK x hd floats)

// Rows first..first+count-1 of a kv head's fp16 cache on their way into the caches (HINT: into L1,
// _MM_HINT_T0, or L2, _MM_HINT_T1). Between two layers' attention the matmuls stream megabytes of
// weights, so a layer's keys and values come from L3: each query set asks for all it will read
// (up to PREFETCH_KV_ROWS rows of each) into L2 as it starts, and for the next chunk into L1 while
// it works on this one (a tree's attention at 4 rows, one thread, context 500: 1.55 -> 1.23 ms; the
// micro benchmark benchmarks/attention-compute/attention_layers.cpp). A prefetch changes no bit.
constexpr int PREFETCH_KV_ROWS = 1024;  // 128 KB of each at a head of 64: K and V within half an L2
// The rows asked for up front (0: no prefetch at all); qf_set_kv_prefetch changes it between calls.
inline std::atomic<int>& prefetch_kv_rows() {
    static std::atomic<int> rows{PREFETCH_KV_ROWS};
    return rows;
}

template <int HINT>
inline void prefetch_rows(const uint16_t* base, int first, int count, int hd) {
    const char* p = (const char*)(base + (size_t)first * hd);
    const size_t bytes = sizeof(uint16_t) * (size_t)std::max(0, count) * hd;
    for (size_t l = 0; l < bytes; l += 64) _mm_prefetch(p + l, (_mm_hint)HINT);
}

// The scores' row stride for queries of at most `longest` keys: every n rounded up to 8, plus 8
// (attend_lanes keeps a row's total in its last cell). Every caller sizes its scratch by it.
inline size_t score_stride(size_t longest) { return (longest + 16) / 8 * 8; }

// ------------------------------------------------------------------ the shared keys 16 lanes wide
// On a CPU with AVX512 the shared keys' scores and values run in 16-lane vectors, each lane doing
// the very operation the 8-lane code does on it, so that a query's bits are the same on either path:
//   scores: two keys side by side in a vector ([key a's lanes 0-7 | key b's]), the query's chunk
//   repeated in both halves; the 8-lane reduction ((a0+a1)+(a2+a3)) + ((a4+a5)+(a6+a7)) done by
//   hadd512 (hadd's pairs within each 128 bits), then the halves' sums added, as scores8 does;
//   values: 16 of the head's dimensions a vector, each an fma chain over the keys in order.
#define QF_AVX512F __attribute__((target("avx2,fma,f16c,avx512f")))

// _mm256_hadd_ps within each 128 bits of a 16-lane vector: [x0+x1, x2+x3, y0+y1, y2+y3] each
QF_AVX512F inline __m512 hadd512(__m512 x, __m512 y) {
    return _mm512_add_ps(_mm512_shuffle_ps(x, y, 0x88), _mm512_shuffle_ps(x, y, 0xDD));
}

// keys c0..c0+count-1 of one kv head's fp16 cache as fp32 pairs: pair p's chunk i (16 floats) at
// buf + (p * LANES + i) * 16, key 2p's 8 values then key 2p+1's; count rounded up to 8 with key c0
template <int LANES>
QF_AVX512F inline void convert_pairs(const uint16_t* base, int c0, int count, float* buf) {
    constexpr int hd = 8 * LANES;
    const int padded = (count + 7) / 8 * 8;
    for (int l = 0; l < padded; l += 2) {
        const uint16_t* a = base + (size_t)(c0 + (l < count ? l : 0)) * hd;
        const uint16_t* b = base + (size_t)(c0 + (l + 1 < count ? l + 1 : 0)) * hd;
#pragma GCC unroll 16
        for (int i = 0; i < LANES; ++i) {
            const __m256i two = _mm256_inserti128_si256(_mm256_castsi128_si256(_mm_loadu_si128((const __m128i*)(a + 8 * i))),
                                                        _mm_loadu_si128((const __m128i*)(b + 8 * i)), 1);
            _mm512_storeu_ps(buf + ((size_t)(l / 2) * LANES + i) * 16, _mm512_cvtph_ps(two));
        }
    }
}

// KEYS (8 or 16) keys' scores of the query qd (its chunks, each repeated in both halves) from
// their pairs at kp, scaled, into dst[0..KEYS-1]
template <int LANES, int KEYS>
QF_AVX512F inline void scores_pairs(const __m512* qd, const float* kp, __m512 vscale, float* dst) {
    constexpr int P = KEYS / 2;
    __m512 part[P];
#pragma GCC unroll 16
    for (int i = 0; i < LANES; ++i)
#pragma GCC unroll 8
        for (int p = 0; p < P; ++p) {
            const __m512 kv = _mm512_loadu_ps(kp + ((size_t)p * LANES + i) * 16);
            part[p] = i == 0 ? _mm512_mul_ps(qd[i], kv) : _mm512_fmadd_ps(qd[i], kv, part[p]);
        }
    // 128-bit lanes of g: keys 0,2,4,6's first half-sums, their second, keys 1,3,5,7's first, their second
    const __m512 ga = hadd512(hadd512(part[0], part[1]), hadd512(part[2], part[3]));
    const __m512 gb = KEYS == 16 ? hadd512(hadd512(part[P - 4], part[P - 3]), hadd512(part[P - 2], part[P - 1])) : ga;
    const __m512 sum = _mm512_add_ps(_mm512_shuffle_f32x4(ga, gb, 0x88), _mm512_shuffle_f32x4(ga, gb, 0xDD));
    const __m512i order = _mm512_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7, 8, 12, 9, 13, 10, 14, 11, 15);
    const __m512 out = _mm512_mul_ps(_mm512_permutexvar_ps(order, sum), vscale);
    if constexpr (KEYS == 16) _mm512_storeu_ps(dst, out);
    else _mm256_storeu_ps(dst, _mm512_castps512_ps256(out));
}

// The scores of every query against the shared keys c0..c0+count-1 (their lanes past count left
// for the query's own keys to overwrite, as attend_lanes' 8-lane loop does)
template <int LANES>
QF_AVX512F void shared_scores512(const Query* qs, int nq, const uint16_t* kbase, int c0, int count, float scale,
                                 float* scores, size_t stride, float* kbuf) {
    convert_pairs<LANES>(kbase, c0, count, kbuf);
    const __m512 vscale = _mm512_set1_ps(scale);
    const int padded = (count + 7) / 8 * 8;
    for (int q = 0; q < nq; ++q) {
        __m512 qd[LANES];
#pragma GCC unroll 16
        for (int i = 0; i < LANES; ++i) {  // the chunk in both halves
            const __m512 c = _mm512_castps256_ps512(_mm256_loadu_ps(qs[q].q + 8 * i));
            qd[i] = _mm512_shuffle_f32x4(c, c, 0x44);
        }
        float* sc = scores + q * stride + c0;
        int j = 0;
        for (; j + 16 <= padded; j += 16) scores_pairs<LANES, 16>(qd, kbuf + (size_t)j * 8 * LANES, vscale, sc + j);
        if (j < padded) scores_pairs<LANES, 8>(qd, kbuf + (size_t)j * 8 * LANES, vscale, sc + j);
    }
}

// acc[q..q+NQ-1] += the values in kbuf (count of them, fp32) weighted by those queries' scores,
// key after key: NQ queries read each value once
template <int LANES, int NQ>
QF_AVX512F inline void weigh_values512(int q, int c0, int count, const float* scores, size_t stride, float* acc,
                                       const float* kbuf) {
    constexpr int hd = 8 * LANES, W = LANES / 2;
    __m512 a[NQ][W];
#pragma GCC unroll 8
    for (int j = 0; j < NQ; ++j)
#pragma GCC unroll 8
        for (int k = 0; k < W; ++k) a[j][k] = _mm512_loadu_ps(acc + (size_t)(q + j) * hd + 16 * k);
    for (int l = 0; l < count; ++l) {
        __m512 p[NQ];
#pragma GCC unroll 8
        for (int j = 0; j < NQ; ++j) p[j] = _mm512_set1_ps(scores[(q + j) * stride + c0 + l]);
#pragma GCC unroll 8
        for (int k = 0; k < W; ++k) {
            const __m512 v = _mm512_loadu_ps(kbuf + l * hd + 16 * k);
#pragma GCC unroll 8
            for (int j = 0; j < NQ; ++j) a[j][k] = _mm512_fmadd_ps(p[j], v, a[j][k]);
        }
    }
#pragma GCC unroll 8
    for (int j = 0; j < NQ; ++j)
#pragma GCC unroll 8
        for (int k = 0; k < W; ++k) _mm512_storeu_ps(acc + (size_t)(q + j) * hd + 16 * k, a[j][k]);
}

// acc[q] += the shared values c0..c0+count-1 weighted by the queries' scores (exponentials), key
// after key; four queries at a time read each value once where their sums fit in 16 registers (a
// head of up to 64: 4 x 4 vectors), else two (each query's sums are the same chain either way)
template <int LANES>
QF_AVX512F void shared_values512(int nq, const uint16_t* vbase, int c0, int count, const float* scores, size_t stride,
                                 float* acc, float* kbuf) {
    constexpr int hd = 8 * LANES;
    const uint16_t* src = vbase + (size_t)c0 * hd;
    for (int i = 0; i < count * hd; i += 16) _mm512_storeu_ps(kbuf + i, _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i*)(src + i))));
    int q = 0;
    if constexpr (LANES <= 8)
        for (; q + 4 <= nq; q += 4) weigh_values512<LANES, 4>(q, c0, count, scores, stride, acc, kbuf);
    for (; q + 2 <= nq; q += 2) weigh_values512<LANES, 2>(q, c0, count, scores, stride, acc, kbuf);
    if (q < nq) weigh_values512<LANES, 1>(q, c0, count, scores, stride, acc, kbuf);
}

// scores: [nq, score_stride(longest n)]; acc: [nq, hd];
// kbuf: [KEY_CHUNK, hd] floats (KEY_CHUNK a multiple of 8). A single query reads the fp16 cache directly.
template <int LANES>
QF_AVX2 void attend_lanes(const Query* qs, int nq, int shared, const uint16_t* kbase, const uint16_t* vbase,
                          float scale, float* scores, size_t stride, float* acc, float* kbuf, bool wide) {
    constexpr int hd = 8 * LANES;
    const __m256 vscale = _mm256_set1_ps(scale);
    const bool convert = nq > 2;  // converting once pays when several queries read the keys
    // without it, the committed keys' whole blocks of 8 are read where they lie (slots 0.. are
    // contiguous), and only a query's own keys are gathered
    const int direct = convert ? 0 : shared / 8 * 8;
    if (!convert) shared = 0;
    wide = wide && LANES % 2 == 0;
    const int ahead = prefetch_kv_rows().load(std::memory_order_relaxed);
    if (ahead) {
        prefetch_rows<_MM_HINT_T1>(kbase, 0, std::min(shared, ahead), hd);
        prefetch_rows<_MM_HINT_T1>(vbase, 0, std::min(shared, ahead), hd);
    }
    for (int c0 = 0; c0 < shared; c0 += KEY_CHUNK) {  // the shared keys' scores, each key converted once
        const int count = std::min(KEY_CHUNK, shared - c0);
        if (ahead && c0 + KEY_CHUNK < shared)
            prefetch_rows<_MM_HINT_T0>(kbase, c0 + KEY_CHUNK, std::min(KEY_CHUNK, shared - c0 - KEY_CHUNK), hd);
        else if (ahead)  // the last chunk of keys: the values' first chunk is read next
            prefetch_rows<_MM_HINT_T0>(vbase, 0, std::min(KEY_CHUNK, shared), hd);
        if (wide) {
            if constexpr (LANES % 2 == 0) shared_scores512<LANES>(qs, nq, kbase, c0, count, scale, scores, stride, kbuf);
            continue;
        }
        convert_rows(kbase, c0, count, hd, kbuf);
        for (int l = count; l % 8; ++l) std::memcpy(kbuf + (size_t)l * hd, kbuf, sizeof(float) * hd);
        for (int i = 0; i < nq; ++i)  // (a last partial block's other lanes are overwritten below)
            for (int j = 0; j < count; j += 8)
                scores8<LANES, false>(qs[i].q, kbuf + (size_t)j * hd, hd, vscale, scores + i * stride + c0 + j);
    }
    alignas(32) uint16_t kb16[8 * hd];
    for (int i = 0; i < nq; ++i) {  // each query's own keys, then its softmax
        const Query& qi = qs[i];
        float* sc = scores + i * stride;
        for (int j = shared; j < direct; j += 8) scores8<LANES, true>(qi.q, kbase + (size_t)j * hd, hd, vscale, sc + j);
        for (int j = std::max(shared, direct); j < qi.n; j += 8) {
            gather8(kbase, qi.slots + j, std::min(8, qi.n - j), hd, kb16);
            scores8<LANES, true>(qi.q, kb16, hd, vscale, sc + j);
        }
        const __m256 vtop = _mm256_set1_ps(max_of(sc, qi.n));
        __m256 tot = _mm256_setzero_ps();
        for (int j = 0; j < qi.n; j += 8) {
            __m256 p = exp8(_mm256_sub_ps(_mm256_loadu_ps(sc + j), vtop));
            if (j + 8 > qi.n) {  // lanes past the last key weigh nothing
                const __m256i lane = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
                p = _mm256_and_ps(p, _mm256_castsi256_ps(_mm256_cmpgt_epi32(_mm256_set1_epi32(qi.n - j), lane)));
            }
            _mm256_storeu_ps(sc + j, p);
            tot = _mm256_add_ps(tot, p);
        }
        sc[stride - 1] = hsum(tot);  // the total, kept in the row's last cell
        for (int k = 0; k < hd; k += 8) _mm256_storeu_ps(acc + (size_t)i * hd + k, _mm256_setzero_ps());
    }
    for (int c0 = 0; c0 < shared; c0 += KEY_CHUNK) {  // the shared values, each converted once
        const int count = std::min(KEY_CHUNK, shared - c0);
        if (ahead) prefetch_rows<_MM_HINT_T0>(vbase, c0 + KEY_CHUNK, std::min(KEY_CHUNK, shared - c0 - KEY_CHUNK), hd);
        if (wide) {
            if constexpr (LANES % 2 == 0) shared_values512<LANES>(nq, vbase, c0, count, scores, stride, acc, kbuf);
            continue;
        }
        convert_rows(vbase, c0, count, hd, kbuf);
        for (int i = 0; i < nq; ++i) {
            const float* sc = scores + i * stride + c0;
            float* ai = acc + (size_t)i * hd;
            __m256 a[LANES];
#pragma GCC unroll 16
            for (int k = 0; k < LANES; ++k) a[k] = _mm256_loadu_ps(ai + 8 * k);
            for (int l = 0; l < count; ++l) {
                const __m256 p = _mm256_set1_ps(sc[l]);
#pragma GCC unroll 16
                for (int k = 0; k < LANES; ++k) a[k] = _mm256_fmadd_ps(p, _mm256_loadu_ps(kbuf + l * hd + 8 * k), a[k]);
            }
#pragma GCC unroll 16
            for (int k = 0; k < LANES; ++k) _mm256_storeu_ps(ai + 8 * k, a[k]);
        }
    }
    for (int i = 0; i < nq; ++i) {  // each query's own values, then its output
        const Query& qi = qs[i];
        const float* sc = scores + i * stride;
        const float* ai = acc + (size_t)i * hd;
        __m256 a[LANES];
#pragma GCC unroll 16
        for (int k = 0; k < LANES; ++k) a[k] = _mm256_loadu_ps(ai + 8 * k);
        for (int j = shared; j < qi.n; ++j) {
            const uint16_t* v = vbase + (size_t)qi.slots[j] * hd;
            const __m256 p = _mm256_set1_ps(sc[j]);
#pragma GCC unroll 16
            for (int k = 0; k < LANES; ++k) a[k] = _mm256_fmadd_ps(p, half8(v + 8 * k), a[k]);
        }
        const __m256 inv = _mm256_set1_ps(1.f / sc[stride - 1]);
#pragma GCC unroll 16
        for (int k = 0; k < LANES; ++k) _mm256_storeu_ps(qi.out + 8 * k, _mm256_mul_ps(a[k], inv));
    }
}

// The head sizes attend_queries takes: multiples of 8 up to 128 (quantized.shape_problem refuses a
// model of another at load; the exported calls refuse it too, before any work).
constexpr int HEAD_DIM_MAX = 128;
inline bool head_dim_ok(int hd) { return hd >= 8 && hd <= HEAD_DIM_MAX && hd % 8 == 0; }

// attend_lanes for a head size hd (head_dim_ok: any other is left unwritten or misread)
// (wide: the shared keys 16 lanes wide, on a CPU with AVX512F; the same bits)
inline void attend_queries(const Query* qs, int nq, int shared, const uint16_t* kbase, const uint16_t* vbase, int hd,
                           float scale, float* scores, size_t stride, float* acc, float* kbuf, bool wide) {
    switch (hd / 8) {
#define QF_LANES(L) \
    case L: return attend_lanes<L>(qs, nq, shared, kbase, vbase, scale, scores, stride, acc, kbuf, wide);
        QF_LANES(1) QF_LANES(2) QF_LANES(3) QF_LANES(4) QF_LANES(5) QF_LANES(6) QF_LANES(7) QF_LANES(8)
        QF_LANES(9) QF_LANES(10) QF_LANES(11) QF_LANES(12) QF_LANES(13) QF_LANES(14) QF_LANES(15) QF_LANES(16)
#undef QF_LANES
    }
}

// One key's score as scores8 computes it: 8 lanes, lane m an fma chain over q[m] k[m], q[m + 8]
// k[m + 8], ... (the first a multiply), reduced ((a0+a1)+(a2+a3)) + ((a4+a5)+(a6+a7)) as its hadds
// and permutes do, times the scale. k: the key's fp16 row.
inline float score_ref(const float* q, const uint16_t* k, int hd, float scale) {
    float a[8];
    for (int m = 0; m < 8; ++m) a[m] = q[m] * half_to_float(k[m]);
    for (int i = 8; i < hd; i += 8)
        for (int m = 0; m < 8; ++m) a[m] = std::fma(q[i + m], half_to_float(k[i + m]), a[m]);
    return (((a[0] + a[1]) + (a[2] + a[3])) + ((a[4] + a[5]) + (a[6] + a[7]))) * scale;
}

// attend_queries' result, one query at a time, every key read at its slot (no shared keys
// converted once, no gathering): the scores, their max, p_j = exp(score_j - max) with lane j % 8
// summing them in order (hsum's order), out = (sum_j p_j v_j, an fma chain key after key) * (1 / total).
inline void attend_queries_ref(const Query* qs, int nq, const uint16_t* kbase, const uint16_t* vbase, int hd,
                               float scale) {
    for (int i = 0; i < nq; ++i) {
        const Query& qi = qs[i];
        std::vector<float> p(qi.n), acc(hd, 0.f);
        for (int j = 0; j < qi.n; ++j) p[j] = score_ref(qi.q, kbase + (size_t)qi.slots[j] * hd, hd, scale);
        float top = -INFINITY;
        for (int j = 0; j < qi.n; ++j) top = std::max(top, p[j]);
        float lane[8] = {};
        for (int j = 0; j < qi.n; ++j) {
            p[j] = exp_ref(p[j] - top);
            lane[j % 8] = lane[j % 8] + p[j];
        }
        const float inv = 1.f / hsum_ref(lane);
        for (int j = 0; j < qi.n; ++j) {
            const uint16_t* v = vbase + (size_t)qi.slots[j] * hd;
            for (int d = 0; d < hd; ++d) acc[d] = std::fma(p[j], half_to_float(v[d]), acc[d]);
        }
        for (int d = 0; d < hd; ++d) qi.out[d] = acc[d] * inv;
    }
}

}  // namespace qf
