// The q4_1 forward's float parts (included by qforward.cpp): RMSNorm, RoPE, SiLU and attention over
// the fp16 K/V cache. Each runs row by row in one fixed order of operations, in AVX2 code whatever
// integer kernels run, so a row's values never depend on the rows beside it, the thread count or
// the instruction set: attention reduces each query's visible keys one by one in order of absolute
// position.
#pragma once

#include "qblocks.h"

#include <limits>

namespace qf {

QF_AVX2 inline float hsum(__m256 v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

QF_AVX2 inline float dot(const float* a, const float* b, int n) {
    __m256 acc = _mm256_setzero_ps();
    int i = 0;
    for (; i + 8 <= n; i += 8) acc = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), _mm256_loadu_ps(b + i), acc);
    float s = hsum(acc);
    for (; i < n; ++i) s = s + a[i] * b[i];
    return s;
}

// y = w * (x / rms(x)) for one row of D values
inline void rmsnorm_row(const float* x, const float* w, float* y, int D, float eps) {
    const float r = 1.f / std::sqrt(dot(x, x, D) / (float)D + eps);
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

// g <- silu(g) * u, 8 at a time (n a multiple of 8: the intermediate size is one of 32)
QF_AVX2 inline void silu_mul(float* g, const float* u, size_t n) {
    const __m256 one = _mm256_set1_ps(1.f), zero = _mm256_setzero_ps();
    for (size_t i = 0; i < n; i += 8) {
        const __m256 x = _mm256_loadu_ps(g + i);
        const __m256 sig = _mm256_add_ps(one, exp8(_mm256_sub_ps(zero, x)));
        _mm256_storeu_ps(g + i, _mm256_mul_ps(_mm256_div_ps(x, sig), _mm256_loadu_ps(u + i)));
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


// x <- log(softmax(x)) over n values: the max, the exponentials summed 8 lanes at a time in
// order (a fixed horizontal sum), then x - (max + log(sum)).
QF_AVX2 inline void log_softmax_row(float* x, int n) {
    float top = -INFINITY;
    for (int j = 0; j < n; ++j) top = std::max(top, x[j]);
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

// The k largest of x[0..n-1] in order (ties: the lower index first), their indices mapped through
// ids when given.
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

inline void top_k_row(const float* x, int n, int k, const int64_t* ids, float* vals, int64_t* out) {
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

// scores: [nq, stride] (stride >= every n rounded up to 8, plus 8); acc: [nq, hd];
// kbuf: [KEY_CHUNK, hd] floats (KEY_CHUNK a multiple of 8). A single query reads the fp16 cache directly.
template <int LANES>
QF_AVX2 void attend_lanes(const Query* qs, int nq, int shared, const uint16_t* kbase, const uint16_t* vbase,
                          float scale, float* scores, size_t stride, float* acc, float* kbuf) {
    constexpr int hd = 8 * LANES;
    const __m256 vscale = _mm256_set1_ps(scale);
    const bool convert = nq > 2;  // converting once pays when several queries read the keys
    // without it, the committed keys' whole blocks of 8 are read where they lie (slots 0.. are
    // contiguous), and only a query's own keys are gathered
    const int direct = convert ? 0 : shared / 8 * 8;
    if (!convert) shared = 0;
    for (int c0 = 0; c0 < shared; c0 += KEY_CHUNK) {  // the shared keys' scores, each key converted once
        const int count = std::min(KEY_CHUNK, shared - c0);
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
        float top = -INFINITY;
        for (int j = 0; j < qi.n; ++j) top = std::max(top, sc[j]);
        const __m256 vtop = _mm256_set1_ps(top);
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

// attend_lanes for a head size hd (a multiple of 8 up to 128: quantized.py checks)
inline void attend_queries(const Query* qs, int nq, int shared, const uint16_t* kbase, const uint16_t* vbase, int hd,
                           float scale, float* scores, size_t stride, float* acc, float* kbuf) {
    switch (hd / 8) {
#define QF_LANES(L) \
    case L: return attend_lanes<L>(qs, nq, shared, kbase, vbase, scale, scores, stride, acc, kbuf);
        QF_LANES(1) QF_LANES(2) QF_LANES(3) QF_LANES(4) QF_LANES(5) QF_LANES(6) QF_LANES(7) QF_LANES(8)
        QF_LANES(9) QF_LANES(10) QF_LANES(11) QF_LANES(12) QF_LANES(13) QF_LANES(14) QF_LANES(15) QF_LANES(16)
#undef QF_LANES
    }
}

}  // namespace qf
