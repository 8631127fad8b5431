// The q4_1 forward's float parts (included by qforward.cpp): RMSNorm, RoPE, SiLU and attention over
// the fp16 K/V cache. Each runs row by row in one fixed order of operations, in AVX2 code whatever
// integer kernels run (attention's shared keys also 16 lanes wide beside the AVX512 kernels, each
// lane's operations the same), so a row's values never depend on the rows beside it, the thread
// count or the instruction set: attention reduces each query's visible keys one by one in order of
// absolute position.
//
// Beside each kernel is its scalar reference (`<kernel>_ref`, as ggml keeps a `_generic` beside
// every SIMD kernel): plain C++ doing the same fixed sequence of float operations, lane by lane
// where the kernel works in lanes, so that the two give the same bits (qforward.cpp exports each
// pair for tests/test_kernel_refs.py, which holds them to it and each reference to float64).
#pragma once

#include "qblocks.h"

#include <limits>
#include <numeric>

namespace qf {

QF_AVX2 inline float hsum(__m256 v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

// hsum's order on 8 lane sums: lanes l and l + 4 first, then (0 + 2) + (1 + 3)
inline float hsum_ref(const float* lane) {
    const float s0 = lane[0] + lane[4], s1 = lane[1] + lane[5], s2 = lane[2] + lane[6], s3 = lane[3] + lane[7];
    return (s0 + s2) + (s1 + s3);
}

// a . b: 8 lanes, lane l an fma chain over a[l] b[l], a[l + 8] b[l + 8], ...; hsum; the tail added
// one by one (a multiply, then an add)
QF_AVX2 inline float dot(const float* a, const float* b, int n) {
    __m256 acc = _mm256_setzero_ps();
    int i = 0;
    for (; i + 8 <= n; i += 8) acc = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), _mm256_loadu_ps(b + i), acc);
    float s = hsum(acc);
    for (; i < n; ++i) s = s + a[i] * b[i];
    return s;
}

// dot's sequence in scalar code
inline float dot_ref(const float* a, const float* b, int n) {
    float lane[8] = {};
    int i = 0;
    for (; i + 8 <= n; i += 8)
        for (int l = 0; l < 8; ++l) lane[l] = std::fma(a[i + l], b[i + l], lane[l]);
    float s = hsum_ref(lane);
    for (; i < n; ++i) s = s + a[i] * b[i];
    return s;
}

// y = w * (x / rms(x)) for one row of D values
inline void rmsnorm_row(const float* x, const float* w, float* y, int D, float eps) {
    const float r = 1.f / std::sqrt(dot(x, x, D) / (float)D + eps);
    for (int i = 0; i < D; ++i) y[i] = w[i] * (x[i] * r);
}

// rmsnorm_row's, its dot in dot_ref's order
inline void rmsnorm_row_ref(const float* x, const float* w, float* y, int D, float eps) {
    const float r = 1.f / std::sqrt(dot_ref(x, x, D) / (float)D + eps);
    for (int i = 0; i < D; ++i) y[i] = w[i] * (x[i] * r);
}

// HF's rotate-half RoPE on one head of one row: x * cos + rotate_half(x) * sin.
inline void rope_head(float* v, int hd, const float* cos, const float* sin) {
    const int half = hd / 2;
    float tmp[512];
    std::memcpy(tmp, v, sizeof(float) * hd);
    for (int i = 0; i < hd; ++i) {
        const float rot = i < half ? -tmp[i + half] : tmp[i - half];
        v[i] = tmp[i] * cos[i] + rot * sin[i];
    }
}

// exp on 8 lanes (Cephes' expf: x = k ln2 + r, a degree-7 polynomial in r, times 2^k), written out
// with explicit fmas so that it is one fixed sequence of operations: the same bits for a value
// whichever lane or call it comes in. Accurate to about 2 ulp over the range softmax and SiLU use.
QF_AVX2 inline __m256 exp8(__m256 x) {
    x = _mm256_min_ps(_mm256_max_ps(x, _mm256_set1_ps(-87.3f)), _mm256_set1_ps(88.3f));
    const __m256 k = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(1.44269504088896341f)),
                                     _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m256 r = _mm256_fnmadd_ps(k, _mm256_set1_ps(0.693359375f), x);
    r = _mm256_fnmadd_ps(k, _mm256_set1_ps(-2.12194440e-4f), r);
    __m256 y = _mm256_set1_ps(1.9875691500e-4f);
    y = _mm256_fmadd_ps(y, r, _mm256_set1_ps(1.3981999507e-3f));
    y = _mm256_fmadd_ps(y, r, _mm256_set1_ps(8.3334519073e-3f));
    y = _mm256_fmadd_ps(y, r, _mm256_set1_ps(4.1665795894e-2f));
    y = _mm256_fmadd_ps(y, r, _mm256_set1_ps(1.6666665459e-1f));
    y = _mm256_fmadd_ps(y, r, _mm256_set1_ps(5.0000001201e-1f));
    y = _mm256_fmadd_ps(y, _mm256_mul_ps(r, r), _mm256_add_ps(r, _mm256_set1_ps(1.f)));
    const __m256i e = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(k), _mm256_set1_epi32(127)), 23);
    return _mm256_mul_ps(y, _mm256_castsi256_ps(e));
}

// exp8 on one value: the clamps as max_ps / min_ps take them (a NaN becomes the lower bound), k
// rounded to nearest even (nearbyint in the default rounding mode), 2^k built from its exponent bits
inline float exp_ref(float x) {
    x = x > -87.3f ? x : -87.3f;
    x = x < 88.3f ? x : 88.3f;
    const float k = std::nearbyint(x * 1.44269504088896341f);
    float r = std::fma(-k, 0.693359375f, x);
    r = std::fma(-k, -2.12194440e-4f, r);
    float y = 1.9875691500e-4f;
    y = std::fma(y, r, 1.3981999507e-3f);
    y = std::fma(y, r, 8.3334519073e-3f);
    y = std::fma(y, r, 4.1665795894e-2f);
    y = std::fma(y, r, 1.6666665459e-1f);
    y = std::fma(y, r, 5.0000001201e-1f);
    y = std::fma(y, r * r, r + 1.f);
    const uint32_t bits = (uint32_t)((int32_t)k + 127) << 23;
    float two_k;
    std::memcpy(&two_k, &bits, sizeof two_k);
    return y * two_k;
}

// g <- silu(g) * u, 8 at a time (n a multiple of 8: the intermediate size is one of 32)
QF_AVX2 inline void silu_mul(float* g, const float* u, size_t n) {
    const __m256 one = _mm256_set1_ps(1.f), zero = _mm256_setzero_ps();
    for (size_t i = 0; i < n; i += 8) {
        const __m256 x = _mm256_loadu_ps(g + i);
        const __m256 sig = _mm256_add_ps(one, exp8(_mm256_sub_ps(zero, x)));
        _mm256_storeu_ps(g + i, _mm256_mul_ps(_mm256_div_ps(x, sig), _mm256_loadu_ps(u + i)));
    }
}

// silu_mul's, one value at a time (any n): g <- g / (1 + exp(0 - g)) * u
inline void silu_mul_ref(float* g, const float* u, size_t n) {
    for (size_t i = 0; i < n; ++i) {
        const float x = g[i];
        g[i] = x / (1.f + exp_ref(0.f - x)) * u[i];
    }
}

// 8 fp16 values as fp32 (exact)
QF_AVX2 inline __m256 half8(const uint16_t* p) {
    return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i*)p));
}

// n fp32 values stored as fp16, rounded to nearest even (n a multiple of 8)
QF_AVX2 inline void to_half(const float* x, uint16_t* y, int n) {
    for (int i = 0; i < n; i += 8)
        _mm_storeu_si128((__m128i*)(y + i), _mm256_cvtps_ph(_mm256_loadu_ps(x + i), _MM_FROUND_TO_NEAREST_INT));
}


// The largest of x[0..n-1] (no NaN among them), 8 lanes at a time: the value a scalar scan finds (a
// max is exact in any order; where +0 and -0 tie, either gives the same differences below it)
QF_AVX2 inline float max_of(const float* x, int n) {
    __m256 m = _mm256_set1_ps(-INFINITY);
    int j = 0;
    for (; j + 8 <= n; j += 8) m = _mm256_max_ps(m, _mm256_loadu_ps(x + j));
    alignas(32) float lanes[8];
    _mm256_store_ps(lanes, m);
    float top = -INFINITY;
    for (float l : lanes) top = std::max(top, l);
    for (; j < n; ++j) top = std::max(top, x[j]);
    return top;
}

// x <- log(softmax(x)) over n values: the max, the exponentials summed 8 lanes at a time in
// order (a fixed horizontal sum), then x - (max + log(sum)).
QF_AVX2 inline void log_softmax_row(float* x, int n) {
    const float top = max_of(x, n);
    const __m256 vtop = _mm256_set1_ps(top);
    __m256 tot = _mm256_setzero_ps();
    int j = 0;
    for (; j + 8 <= n; j += 8) tot = _mm256_add_ps(tot, exp8(_mm256_sub_ps(_mm256_loadu_ps(x + j), vtop)));
    float sum = hsum(tot);
    for (; j < n; ++j) {
        alignas(32) float one[8];
        _mm256_store_ps(one, exp8(_mm256_set1_ps(x[j] - top)));
        sum += one[0];
    }
    const float lse = top + std::log(sum);
    for (j = 0; j < n; ++j) x[j] = x[j] - lse;
}

// log_softmax_row's: lane l sums the exponentials of x[l], x[l + 8], ... over the whole blocks of
// 8, hsum's order, then the tail's one by one
inline void log_softmax_row_ref(float* x, int n) {
    float top = -INFINITY;
    for (int j = 0; j < n; ++j) top = std::max(top, x[j]);
    float lane[8] = {};
    int j = 0;
    for (; j + 8 <= n; j += 8)
        for (int l = 0; l < 8; ++l) lane[l] = lane[l] + exp_ref(x[j + l] - top);
    float sum = hsum_ref(lane);
    for (; j < n; ++j) sum += exp_ref(x[j] - top);
    const float lse = top + std::log(sum);
    for (j = 0; j < n; ++j) x[j] = x[j] - lse;
}

// The index of a row's largest value, the first of equal ones (torch.argmax's; NaN never wins):
// the maximum 8 lanes at a time, then the first index holding it. argmax_row_ref is its reference.
inline int64_t argmax_row(const float* x, int n) {
    float mx = -std::numeric_limits<float>::infinity();
    int j = 0;
    __m256 vm = _mm256_set1_ps(mx);
    for (; j + 8 <= n; j += 8) vm = _mm256_max_ps(_mm256_loadu_ps(x + j), vm);  // a NaN load keeps vm
    float lanes[8];
    _mm256_storeu_ps(lanes, vm);
    for (float l : lanes) mx = l > mx ? l : mx;
    for (; j < n; ++j) mx = x[j] > mx ? x[j] : mx;
    for (int i = 0; i < n; ++i)
        if (x[i] == mx) return i;
    return 0;
}

inline int64_t argmax_row_ref(const float* x, int n) {
    int64_t arg = 0;
    for (int i = 1; i < n; ++i)
        if (x[i] > x[arg] || (x[arg] != x[arg] && x[i] == x[i])) arg = i;
    return arg;
}

// The most candidates top_k_row ranks (its index buffer): qf_draft refuses a larger k.
constexpr int TOPK_MAX = 1024;

// The k largest of x[0..n-1] (k <= TOPK_MAX; none for k <= 0) in order, ties to the lower index,
// their indices mapped through ids when given: an insertion ranking, one pass over x (min(k, n) written).
inline void top_k_row(const float* x, int n, int k, const int64_t* ids, float* vals, int64_t* out) {
    if (k <= 0) return;  // nothing to rank (vals[k - 1] below would be outside the buffer)
    int have = 0;
    int32_t idx[TOPK_MAX];
    for (int j = 0; j < n; ++j) {
        if (have == k && !(x[j] > vals[k - 1])) continue;  // an equal value later loses to the earlier
        int p = have < k ? have++ : k - 1;
        while (p > 0 && x[j] > vals[p - 1]) {
            vals[p] = vals[p - 1];
            idx[p] = idx[p - 1];
            --p;
        }
        vals[p] = x[j];
        idx[p] = j;
    }
    for (int i = 0; i < have; ++i) out[i] = ids ? ids[idx[i]] : idx[i];
}

// the same ranking as a sort of every index by (value descending, index ascending), for x without NaN
inline void top_k_row_ref(const float* x, int n, int k, const int64_t* ids, float* vals, int64_t* out) {
    std::vector<int32_t> order(n);
    std::iota(order.begin(), order.end(), 0);
    const int m = std::min(k, n);
    std::partial_sort(order.begin(), order.begin() + m, order.end(),
                      [&](int32_t a, int32_t b) { return x[a] > x[b] || (x[a] == x[b] && a < b); });
    for (int i = 0; i < m; ++i) {
        vals[i] = x[order[i]];
        out[i] = ids ? ids[order[i]] : order[i];
    }
}

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
// after key; two queries at a time read each value once
template <int LANES>
QF_AVX512F void shared_values512(int nq, const uint16_t* vbase, int c0, int count, const float* scores, size_t stride,
                                 float* acc, float* kbuf) {
    constexpr int hd = 8 * LANES;
    const uint16_t* src = vbase + (size_t)c0 * hd;
    for (int i = 0; i < count * hd; i += 16) _mm512_storeu_ps(kbuf + i, _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i*)(src + i))));
    int q = 0;
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
    for (int c0 = 0; c0 < shared; c0 += KEY_CHUNK) {  // the shared keys' scores, each key converted once
        const int count = std::min(KEY_CHUNK, shared - c0);
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
