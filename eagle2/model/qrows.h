// The q4_1 forward's float parts on rows (included by qattention.h and so by qforward.cpp):
// horizontal sums and dot products, RMSNorm, RoPE, exp, SiLU, log-softmax, argmax and top k. Each
// runs row by row in one fixed order of operations, in AVX2 code whatever integer kernels run, so a
// row's values never depend on the rows beside it, the thread count or the instruction set.
//
// Beside each kernel is its scalar reference (`<kernel>_ref`, as ggml keeps a `_generic` beside
// every SIMD kernel): plain C++ doing the same fixed sequence of float operations, lane by lane
// where the kernel works in lanes, so that the two give the same bits (qtest_exports.h exports
// each pair for tests/test_kernel_refs.py, which holds them to it and each reference to float64).
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

}  // namespace qf
