// The target's forward in the GGUF's own precision (eagle2/model/quantized.py drives it).
//
// Weights stay in their blocks: Q4_1 (32 values = d * q + m, q in 0..15) for the layers' matrices,
// Q8_0 (32 values = d * q, q in -127..127) for the LM head. Each activation row is quantised per
// 32-value block to int8 with its scale d and, for Q4_1's offsets, s = d * sum(q). A block's dot
// product is an exact int32, so it is the same whichever instructions made it (AVX2's maddubs or
// VNNI's dpbusd). Everything in floating point runs in one fixed order per output element, in code
// that does not depend on how many rows are in the call or where a key is stored: every matmul row,
// norm, RoPE and activation is computed row by row, and attention reduces each query's visible keys
// one by one in order of absolute position. So a row's results are the same bits whether it runs
// alone (plain decoding) or as row k of a tree (speculative decoding): greedy identity by
// construction, not by margin.
//
// Built with -mavx2 -mfma -mf16c -ffp-contract=off (no fused multiply-add the code does not spell
// out); the VNNI variants of the integer dot products are chosen at run time. Called through ctypes
// (which lets go of the GIL); threads come from OpenMP, the runtime torch itself loads.
#include <immintrin.h>
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>

extern "C" {

// One quantised matrix [N, K] (N outputs, K inputs, K a multiple of 32), nb = K / 32 blocks a row.
struct QMat {
    const uint8_t* qs;  // packed quants: see the kernels below ([ceil(N/16), nb, 256] Q4_1, [.., 512] Q8_0)
    const void* d;      // fp16 per group and block: 16 scales (Q4_1: then 16 offsets)
    const float* bias;  // [N] or null
    int32_t N, K, type; // type: 0 = Q4_1, 1 = Q8_0
};

struct QLayer {
    const float* attn_norm;  // [D]
    QMat q, k, v, o;
    const float* ffn_norm;   // [D]
    QMat gate, up, down;
};

struct QModel {
    int32_t D, H, KV, hd, F, L;
    float eps;
    const QLayer* layers;  // [L]
    const float* norm;     // [D] final norm
    QMat lm_head;
};

struct QHead3 {  // the EAGLE-3 draft head's layer (Q8_0 matrices, q/k/v reading 2 x D)
    int32_t D, H, KV, hd, F, norm_before_residual;
    float eps;
    const float *input_norm, *hidden_norm, *post_norm;
    QMat q, k, v, o, gate, up, down;
};

}  // extern "C"

namespace {

// ------------------------------------------------------------------ integer block dot products

enum Isa { AVX2 = 0, AVXVNNI = 1, AVX512VNNI = 2 };

__attribute__((target("avx2,fma,f16c"))) inline float hsum(__m256 v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

// Activation rows quantised per block: q int8 [M, nb, 32], d [M, nb], s = d * sum(q) [M, nb].
struct QRows {
    std::vector<int8_t> q;
    std::vector<float> d, s;
    int M = 0, nb = 0;
};

// Vector and scalar agree bit for bit here: max and the int sum are exact, the product is one
// IEEE multiply, and the conversion rounds to nearest even like nearbyint.
__attribute__((target("avx2,fma,f16c"))) void quantise_rows(const float* x, int M, int K, QRows& out) {
    const int nb = K / 32;
    out.M = M;
    out.nb = nb;
    out.q.resize((size_t)M * K);
    out.d.resize((size_t)M * nb);
    out.s.resize((size_t)M * nb);
    const __m256 sign = _mm256_set1_ps(-0.f);
    for (int r = 0; r < M; ++r) {
        for (int b = 0; b < nb; ++b) {
            const float* xb = x + (size_t)r * K + b * 32;
            __m256 v[4], mx = _mm256_setzero_ps();
            for (int i = 0; i < 4; ++i) {
                v[i] = _mm256_loadu_ps(xb + 8 * i);
                mx = _mm256_max_ps(mx, _mm256_andnot_ps(sign, v[i]));
            }
            __m128 m4 = _mm_max_ps(_mm256_castps256_ps128(mx), _mm256_extractf128_ps(mx, 1));
            m4 = _mm_max_ps(m4, _mm_movehl_ps(m4, m4));
            m4 = _mm_max_ss(m4, _mm_movehdup_ps(m4));
            const float amax = _mm_cvtss_f32(m4);
            const float d = amax / 127.f;
            const __m256 id = _mm256_set1_ps(d > 0.f ? 127.f / amax : 0.f);
            __m256i q[4];
            for (int i = 0; i < 4; ++i) q[i] = _mm256_cvtps_epi32(_mm256_mul_ps(v[i], id));
            // pack 32 int32 to int8 in order (packs works within 128-bit lanes: permute back)
            const __m256i p16a = _mm256_packs_epi32(q[0], q[1]), p16b = _mm256_packs_epi32(q[2], q[3]);
            const __m256i p8 = _mm256_permutevar8x32_epi32(_mm256_packs_epi16(p16a, p16b),
                                                           _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
            _mm256_storeu_si256((__m256i*)(out.q.data() + (size_t)r * K + b * 32), p8);
            __m256i s = _mm256_add_epi32(_mm256_add_epi32(q[0], q[1]), _mm256_add_epi32(q[2], q[3]));
            __m128i s4 = _mm_add_epi32(_mm256_castsi256_si128(s), _mm256_extracti128_si256(s, 1));
            s4 = _mm_add_epi32(s4, _mm_shuffle_epi32(s4, 0x4E));
            s4 = _mm_add_epi32(s4, _mm_shuffle_epi32(s4, 0xB1));
            out.d[(size_t)r * nb + b] = d;
            out.s[(size_t)r * nb + b] = d * (float)_mm_cvtsi128_si32(s4);
        }
    }
}

// Weights are repacked (quantized.py `packed`) in groups of 16 outputs, one output per 32-bit lane.
// Per group and block: Q4_1 has 4 loads of 64 bytes (output c's 4 bytes at 4c: low nibbles values
// 4i..4i+3, high nibbles values 16+4i..16+4i+3), Q8_0 has 8 (values 4i..4i+3); then 16 fp16 scales
// (Q4_1: then 16 fp16 offsets). A block's dot product for an output is then 8 four-byte u8 x s8 dot
// products against the row's matching 4 bytes, broadcast, summed exactly in int32 (AVX2 maddubs,
// VNNI dpbusd: the same integers). The 512-bit kernel takes a whole group; the 256-bit ones take it
// as two halves of 8 outputs.
//
// The float work per (row, output) is the same in every kernel and tile: per block in order,
// acc = fma(float(int sum), d_w * d_x, acc) and (Q4_1) off = off + m_w * s_x; then acc + off (+ bias).

#define KERNEL256(NAME, ATTR, VNNI)                                                                  \
    template <int R>                                                                                 \
    ATTR inline void NAME(const QMat& w, int grp, int half, const QRows& x, int r0, float* y, int ldy) { \
        const int nb = w.K / 32;                                                                     \
        const bool q4 = w.type == 0;                                                                 \
        const __m256i lo4 = _mm256_set1_epi8(0x0F), ones = _mm256_set1_epi16(1);                     \
        __m256 acc[R], off[R];                                                                       \
        for (int r = 0; r < R; ++r) { acc[r] = _mm256_setzero_ps(); off[r] = _mm256_setzero_ps(); }  \
        const uint16_t* dm = (const uint16_t*)w.d + (size_t)grp * nb * (q4 ? 32 : 16) + half * 8;    \
        const uint8_t* wq = w.qs + (size_t)grp * nb * (q4 ? 256 : 512) + half * 32;                  \
        for (int b = 0; b < nb; ++b) {                                                               \
            __m256i isum[R], jsum[R]; /* two sums a row, so the dot products' latency overlaps */    \
            for (int r = 0; r < R; ++r) { isum[r] = _mm256_setzero_si256(); jsum[r] = _mm256_setzero_si256(); } \
            const int32_t* xs[R];                                                                    \
            for (int r = 0; r < R; ++r) xs[r] = (const int32_t*)(x.q.data() + ((size_t)(r0 + r) * nb + b) * 32); \
            if (q4) {                                                                                \
                for (int i = 0; i < 4; ++i) {                                                        \
                    const __m256i raw = _mm256_loadu_si256((const __m256i*)(wq + i * 64));           \
                    const __m256i ulo = _mm256_and_si256(raw, lo4);                                  \
                    const __m256i uhi = _mm256_and_si256(_mm256_srli_epi16(raw, 4), lo4);            \
                    for (int r = 0; r < R; ++r) {                                                    \
                        const __m256i xlo = _mm256_set1_epi32(xs[r][i]), xhi = _mm256_set1_epi32(xs[r][i + 4]); \
                        if constexpr (VNNI) {                                                        \
                            isum[r] = _mm256_dpbusd_avx_epi32(isum[r], ulo, xlo);                    \
                            jsum[r] = _mm256_dpbusd_avx_epi32(jsum[r], uhi, xhi);                    \
                        } else { /* int16 pair sums: 4 groups x 2 x 15 x 127 = 15240 fits */         \
                            isum[r] = _mm256_add_epi16(isum[r], _mm256_maddubs_epi16(ulo, xlo));     \
                            jsum[r] = _mm256_add_epi16(jsum[r], _mm256_maddubs_epi16(uhi, xhi));     \
                        }                                                                            \
                    }                                                                                \
                }                                                                                    \
                if constexpr (!VNNI)                                                                 \
                    for (int r = 0; r < R; ++r) {                                                    \
                        isum[r] = _mm256_madd_epi16(isum[r], ones);                                  \
                        jsum[r] = _mm256_madd_epi16(jsum[r], ones);                                  \
                    }                                                                                \
            } else {                                                                                 \
                for (int i = 0; i < 8; i += 2) {                                                     \
                    const __m256i wa = _mm256_loadu_si256((const __m256i*)(wq + i * 64));            \
                    const __m256i wb = _mm256_loadu_si256((const __m256i*)(wq + i * 64 + 64));       \
                    const __m256i ua = _mm256_sign_epi8(wa, wa), ub = _mm256_sign_epi8(wb, wb);      \
                    for (int r = 0; r < R; ++r) {                                                    \
                        const __m256i sa = _mm256_sign_epi8(_mm256_set1_epi32(xs[r][i]), wa);        \
                        const __m256i sb = _mm256_sign_epi8(_mm256_set1_epi32(xs[r][i + 1]), wb);    \
                        if constexpr (VNNI) {                                                        \
                            isum[r] = _mm256_dpbusd_avx_epi32(isum[r], ua, sa);                      \
                            jsum[r] = _mm256_dpbusd_avx_epi32(jsum[r], ub, sb);                      \
                        } else {                                                                     \
                            isum[r] = _mm256_add_epi32(isum[r], _mm256_madd_epi16(_mm256_maddubs_epi16(ua, sa), ones)); \
                            jsum[r] = _mm256_add_epi32(jsum[r], _mm256_madd_epi16(_mm256_maddubs_epi16(ub, sb), ones)); \
                        }                                                                            \
                    }                                                                                \
                }                                                                                    \
            }                                                                                        \
            wq += q4 ? 256 : 512;                                                                    \
            const __m256 wd = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i*)dm));                  \
            for (int r = 0; r < R; ++r) {                                                            \
                const size_t xb = (size_t)(r0 + r) * nb + b;                                         \
                const __m256 sums = _mm256_cvtepi32_ps(_mm256_add_epi32(isum[r], jsum[r]));          \
                acc[r] = _mm256_fmadd_ps(sums, _mm256_mul_ps(wd, _mm256_set1_ps(x.d[xb])), acc[r]);   \
            }                                                                                        \
            if (q4) {                                                                                \
                const __m256 wm = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i*)(dm + 16)));       \
                for (int r = 0; r < R; ++r) {                                                        \
                    const size_t xb = (size_t)(r0 + r) * nb + b;                                     \
                    off[r] = _mm256_add_ps(off[r], _mm256_mul_ps(wm, _mm256_set1_ps(x.s[xb])));      \
                }                                                                                    \
            }                                                                                        \
            dm += q4 ? 32 : 16;                                                                      \
        }                                                                                            \
        const int n0 = grp * 16 + half * 8, valid = std::min(8, w.N - n0);                           \
        for (int r = 0; r < R; ++r) {                                                                \
            alignas(32) float out[8];                                                                \
            _mm256_store_ps(out, _mm256_add_ps(acc[r], off[r]));                                     \
            float* yr = y + (size_t)(r0 + r) * ldy + n0;                                             \
            for (int c = 0; c < valid; ++c) yr[c] = w.bias ? out[c] + w.bias[n0 + c] : out[c];       \
        }                                                                                            \
    }                                                                                                \
    ATTR void NAME##_groups(const QMat& w, int g0, int g1, const QRows& x, float* y, int ldy) {      \
        for (int g = g0; g < g1; ++g)                                                                \
            for (int half = 0; half < 2 && g * 16 + half * 8 < w.N; ++half) {                        \
                int r = 0;                                                                           \
                for (; r + 4 <= x.M; r += 4) NAME<4>(w, g, half, x, r, y, ldy);                      \
                switch (x.M - r) {                                                                   \
                    case 3: NAME<3>(w, g, half, x, r, y, ldy); break;                                \
                    case 2: NAME<2>(w, g, half, x, r, y, ldy); break;                                \
                    case 1: NAME<1>(w, g, half, x, r, y, ldy); break;                                \
                }                                                                                    \
            }                                                                                        \
    }

KERNEL256(kernel_avx2, __attribute__((target("avx2,fma,f16c"))), false)
KERNEL256(kernel_avxvnni, __attribute__((target("avx2,fma,f16c,avxvnni"))), true)

#define ATTR512 __attribute__((target("avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")))

template <int R>
ATTR512 inline void kernel512(const QMat& w, int grp, const QRows& x, int r0, float* y, int ldy) {
    const int nb = w.K / 32;
    const bool q4 = w.type == 0;
    const __m512i lo4 = _mm512_set1_epi8(0x0F);
    __m512 acc[R], off[R];
    for (int r = 0; r < R; ++r) { acc[r] = _mm512_setzero_ps(); off[r] = _mm512_setzero_ps(); }
    const uint16_t* dm = (const uint16_t*)w.d + (size_t)grp * nb * (q4 ? 32 : 16);
    const uint8_t* wq = w.qs + (size_t)grp * nb * (q4 ? 256 : 512);
    for (int b = 0; b < nb; ++b) {
        __m512i isum[R], jsum[R];
        for (int r = 0; r < R; ++r) { isum[r] = _mm512_setzero_si512(); jsum[r] = _mm512_setzero_si512(); }
        const int32_t* xs[R];
        for (int r = 0; r < R; ++r) xs[r] = (const int32_t*)(x.q.data() + ((size_t)(r0 + r) * nb + b) * 32);
        if (q4) {
            for (int i = 0; i < 4; ++i) {
                const __m512i raw = _mm512_loadu_si512((const void*)(wq + i * 64));
                const __m512i ulo = _mm512_and_si512(raw, lo4);
                const __m512i uhi = _mm512_and_si512(_mm512_srli_epi16(raw, 4), lo4);
                for (int r = 0; r < R; ++r) {
                    isum[r] = _mm512_dpbusd_epi32(isum[r], ulo, _mm512_set1_epi32(xs[r][i]));
                    jsum[r] = _mm512_dpbusd_epi32(jsum[r], uhi, _mm512_set1_epi32(xs[r][i + 4]));
                }
            }
        } else {  // s8 x s8 as |w| x (x with w's sign): the 256-bit kernels' integers exactly
            for (int i = 0; i < 8; i += 2) {
                const __m512i wa = _mm512_loadu_si512((const void*)(wq + i * 64));
                const __m512i wb = _mm512_loadu_si512((const void*)(wq + i * 64 + 64));
                const __m512i ua = _mm512_abs_epi8(wa), ub = _mm512_abs_epi8(wb);
                const __mmask64 na = _mm512_movepi8_mask(wa), nbm = _mm512_movepi8_mask(wb);
                for (int r = 0; r < R; ++r) {
                    const __m512i xa = _mm512_set1_epi32(xs[r][i]), xb = _mm512_set1_epi32(xs[r][i + 1]);
                    const __m512i sa = _mm512_mask_sub_epi8(xa, na, _mm512_setzero_si512(), xa);
                    const __m512i sb = _mm512_mask_sub_epi8(xb, nbm, _mm512_setzero_si512(), xb);
                    // where w is 0, sign() gives 0 and |w| is 0: the product is 0 either way
                    isum[r] = _mm512_dpbusd_epi32(isum[r], ua, sa);
                    jsum[r] = _mm512_dpbusd_epi32(jsum[r], ub, sb);
                }
            }
        }
        wq += q4 ? 256 : 512;
        const __m512 wd = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i*)dm));
        for (int r = 0; r < R; ++r) {
            const size_t xb = (size_t)(r0 + r) * nb + b;
            const __m512 sums = _mm512_cvtepi32_ps(_mm512_add_epi32(isum[r], jsum[r]));
            acc[r] = _mm512_fmadd_ps(sums, _mm512_mul_ps(wd, _mm512_set1_ps(x.d[xb])), acc[r]);
        }
        if (q4) {
            const __m512 wm = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i*)(dm + 16)));
            for (int r = 0; r < R; ++r) {
                const size_t xb = (size_t)(r0 + r) * nb + b;
                off[r] = _mm512_add_ps(off[r], _mm512_mul_ps(wm, _mm512_set1_ps(x.s[xb])));
            }
        }
        dm += q4 ? 32 : 16;
    }
    const int n0 = grp * 16, valid = std::min(16, w.N - n0);
    for (int r = 0; r < R; ++r) {
        alignas(64) float out[16];
        _mm512_store_ps(out, _mm512_add_ps(acc[r], off[r]));
        float* yr = y + (size_t)(r0 + r) * ldy + n0;
        for (int c = 0; c < valid; ++c) yr[c] = w.bias ? out[c] + w.bias[n0 + c] : out[c];
    }
}

ATTR512 void kernel_avx512vnni_groups(const QMat& w, int g0, int g1, const QRows& x, float* y, int ldy) {
    for (int g = g0; g < g1; ++g) {
        int r = 0;
        for (; r + 4 <= x.M; r += 4) kernel512<4>(w, g, x, r, y, ldy);
        switch (x.M - r) {
            case 3: kernel512<3>(w, g, x, r, y, ldy); break;
            case 2: kernel512<2>(w, g, x, r, y, ldy); break;
            case 1: kernel512<1>(w, g, x, r, y, ldy); break;
        }
    }
}

int g_isa = -1;  // chosen once (isa()), or forced by qf_set_isa for the tests

int isa() {
    if (g_isa < 0) {
        __builtin_cpu_init();
        g_isa = (__builtin_cpu_supports("avx512vnni") && __builtin_cpu_supports("avx512bw") &&
                 __builtin_cpu_supports("avx512vl")) ? AVX512VNNI
              : __builtin_cpu_supports("avxvnni") ? AVXVNNI
              : AVX2;
    }
    return g_isa;
}

// outputs in groups g0..g1-1 (16 outputs a group)
void groups(const QMat& w, int g0, int g1, const QRows& x, float* y, int ldy) {
    switch (isa()) {
        case AVXVNNI: kernel_avxvnni_groups(w, g0, g1, x, y, ldy); break;
        case AVX512VNNI: kernel_avx512vnni_groups(w, g0, g1, x, y, ldy); break;
        default: kernel_avx2_groups(w, g0, g1, x, y, ldy);
    }
}

// Several matrices that read the same rows (q, k, v; gate, up) in one parallel region: outputs are
// split between threads in chunks, each output computed whole by one thread (no split sums).
void matmuls(const QMat* const* ws, float* const* ys, int count, const QRows& x, int threads) {
    int total = 0;  // groups of 16 outputs over all the matrices
    for (int i = 0; i < count; ++i) total += (ws[i]->N + 15) / 16;
    const int chunk = 1;
    const int nchunks = (total + chunk - 1) / chunk;
#pragma omp parallel for schedule(static) num_threads(threads) if (threads > 1)
    for (int c = 0; c < nchunks; ++c) {
        int g0 = c * chunk, g1 = std::min(total, g0 + chunk);
        for (int i = 0; i < count && g0 < g1; ++i) {
            const int G = (ws[i]->N + 15) / 16;
            if (g0 < G) {
                groups(*ws[i], g0, std::min(g1, G), x, ys[i], ws[i]->N);
                g0 = std::min(g1, G);
            }
            g0 -= G;
            g1 -= G;
        }
    }
}

// ------------------------------------------------------------------ float parts, row by row

__attribute__((target("avx2,fma,f16c"))) float dot(const float* a, const float* b, int n) {
    __m256 acc = _mm256_setzero_ps();
    int i = 0;
    for (; i + 8 <= n; i += 8) acc = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), _mm256_loadu_ps(b + i), acc);
    float s = hsum(acc);
    for (; i < n; ++i) s = s + a[i] * b[i];
    return s;
}

void rmsnorm(const float* x, const float* w, float* y, int T, int D, float eps) {
    for (int t = 0; t < T; ++t) {
        const float* xr = x + (size_t)t * D;
        const float r = 1.f / std::sqrt(dot(xr, xr, D) / (float)D + eps);
        for (int i = 0; i < D; ++i) y[(size_t)t * D + i] = w[i] * (xr[i] * r);
    }
}

// HF's rotate-half RoPE on every head of one row: x * cos + rotate_half(x) * sin.
void rope(float* x, int heads, int hd, const float* cos, const float* sin) {
    const int half = hd / 2;
    float tmp[512];
    for (int h = 0; h < heads; ++h) {
        float* v = x + (size_t)h * hd;
        std::memcpy(tmp, v, sizeof(float) * hd);
        for (int i = 0; i < hd; ++i) {
            const float rot = i < half ? -tmp[i + half] : tmp[i - half];
            v[i] = tmp[i] * cos[i] + rot * sin[i];
        }
    }
}

// exp on 8 lanes (Cephes' expf: x = k ln2 + r, a degree-7 polynomial in r, times 2^k), written out
// with explicit fmas so that it is one fixed sequence of operations: the same bits for a value
// whichever lane or call it comes in. Accurate to about 2 ulp over the range softmax and SiLU use.
__attribute__((target("avx2,fma,f16c"))) inline __m256 exp8(__m256 x) {
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
__attribute__((target("avx2,fma,f16c"))) void silu_mul(float* g, const float* u, size_t n) {
    const __m256 one = _mm256_set1_ps(1.f), zero = _mm256_setzero_ps();
    for (size_t i = 0; i < n; i += 8) {
        const __m256 x = _mm256_loadu_ps(g + i);
        const __m256 sig = _mm256_add_ps(one, exp8(_mm256_sub_ps(zero, x)));
        _mm256_storeu_ps(g + i, _mm256_mul_ps(_mm256_div_ps(x, sig), _mm256_loadu_ps(u + i)));
    }
}

// 8 fp16 values as fp32 (exact)
__attribute__((target("avx2,fma,f16c"))) inline __m256 half8(const uint16_t* p) {
    return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i*)p));
}

// n fp32 values stored as fp16, rounded to nearest even (n a multiple of 8)
__attribute__((target("avx2,fma,f16c"))) void to_half(const float* x, uint16_t* y, int n) {
    for (int i = 0; i < n; i += 8)
        _mm_storeu_si128((__m128i*)(y + i), _mm256_cvtps_ph(_mm256_loadu_ps(x + i), _MM_FROUND_TO_NEAREST_INT));
}

// One query head over its visible keys, in order of absolute position: the scores, their max, the
// exponentials summed in blocks of 8 keys by position (lane l sums keys l, l + 8, ...; a fixed
// horizontal sum), the values weighted one key after another. `scores` has room for n rounded up to 8.
__attribute__((target("avx2,fma,f16c")))
void attend_one(const float* q, const uint16_t* kbase, const uint16_t* vbase, const int32_t* slots, int n, int hd,
                float scale, float* scores, float* out) {
    // scores 8 keys at a time: each key's 8 partial sums reduced by the same hadd pattern
    // (lane l of the result: ((a0+a1)+(a2+a3)) + ((a4+a5)+(a6+a7)) of key l's partials); keys past
    // the last one read key 0 and are masked out below
    const int lanes = hd / 8;  // hd <= 128 and a multiple of 8 (quantized.py checks)
    const __m256 vscale = _mm256_set1_ps(scale);
    for (int j = 0; j < n; j += 8) {
        __m256 part[8];
        for (int l = 0; l < 8; ++l) {
            const uint16_t* k = kbase + (size_t)slots[j + l < n ? j + l : 0] * hd;
            __m256 a = _mm256_mul_ps(_mm256_loadu_ps(q), half8(k));
            for (int i = 1; i < lanes; ++i) a = _mm256_fmadd_ps(_mm256_loadu_ps(q + 8 * i), half8(k + 8 * i), a);
            part[l] = a;
        }
        const __m256 u0 = _mm256_hadd_ps(_mm256_hadd_ps(part[0], part[1]), _mm256_hadd_ps(part[2], part[3]));
        const __m256 u1 = _mm256_hadd_ps(_mm256_hadd_ps(part[4], part[5]), _mm256_hadd_ps(part[6], part[7]));
        const __m256 sum = _mm256_add_ps(_mm256_permute2f128_ps(u0, u1, 0x20), _mm256_permute2f128_ps(u0, u1, 0x31));
        _mm256_storeu_ps(scores + j, _mm256_mul_ps(sum, vscale));
    }
    float top = -INFINITY;
    for (int j = 0; j < n; ++j) top = std::max(top, scores[j]);
    const __m256 vtop = _mm256_set1_ps(top);
    __m256 tot = _mm256_setzero_ps();
    for (int j = 0; j < n; j += 8) {
        __m256 p = exp8(_mm256_sub_ps(_mm256_loadu_ps(scores + j), vtop));
        if (j + 8 > n) {  // lanes past the last key weigh nothing
            const __m256i lane = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
            p = _mm256_and_ps(p, _mm256_castsi256_ps(_mm256_cmpgt_epi32(_mm256_set1_epi32(n - j), lane)));
        }
        _mm256_storeu_ps(scores + j, p);
        tot = _mm256_add_ps(tot, p);
    }
    const float total = hsum(tot);
    __m256 acc[16];
    for (int i = 0; i < lanes; ++i) acc[i] = _mm256_setzero_ps();
    for (int j = 0; j < n; ++j) {
        const uint16_t* v = vbase + (size_t)slots[j] * hd;
        const __m256 p = _mm256_set1_ps(scores[j]);
        for (int i = 0; i < lanes; ++i) acc[i] = _mm256_fmadd_ps(p, half8(v + 8 * i), acc[i]);
    }
    const __m256 inv = _mm256_set1_ps(1.f / total);
    for (int i = 0; i < lanes; ++i) _mm256_storeu_ps(out + 8 * i, _mm256_mul_ps(acc[i], inv));
}

}  // namespace

extern "C" {

// Which integer dot product runs: 0 AVX2, 1 AVX-VNNI, 2 AVX512-VNNI (the CPU's best by default).
int qf_isa() { return isa(); }
void qf_set_isa(int which) { g_isa = which; }
int qf_supports(int which) {
    __builtin_cpu_init();
    switch (which) {
        case AVX2: return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
        case AVXVNNI: return __builtin_cpu_supports("avxvnni");
        case AVX512VNNI:
            return __builtin_cpu_supports("avx512vnni") && __builtin_cpu_supports("avx512bw") &&
                   __builtin_cpu_supports("avx512vl");
    }
    return 0;
}

// y [M, N] = x [M, K] @ w^T, x quantised per block first (the tests' and the LM head's entry).
void qf_matmul(const QMat* w, const float* x, int M, float* y, int threads) {
    QRows xq;
    quantise_rows(x, M, w->K, xq);
    const QMat* ws[1] = {w};
    float* ys[1] = {y};
    matmuls(ws, ys, 1, xq, threads);
}

}  // extern "C"

namespace {

// One layer's working buffers for T rows (a call's own: concurrent calls share nothing).
struct Scratch {
    std::vector<float> h, q, k, v, att, o, g, u;
    QRows xq;
    Scratch(int T, int D, int Din, int H, int KV, int hd, int F)
        : h((size_t)T * Din), q((size_t)T * H * hd), k((size_t)T * KV * hd), v((size_t)T * KV * hd),
          att((size_t)T * H * hd), o((size_t)T * D), g((size_t)T * F), u((size_t)T * F) {}
};

// Attention of T rows whose input (already quantised in s.xq) gives q, k, v: RoPE, the new K/V
// stored in fp16 at slots start + t of one layer's cache (kl, vl: [KV, cap, hd]), each row over
// its `slots`; the output projection's input ends in s.att.
void attention(const QMat& wq, const QMat& wk, const QMat& wv, Scratch& s, int T, int H, int KV, int hd,
               const float* cos, const float* sin, uint16_t* kl, uint16_t* vl, int cap, int start,
               const std::vector<std::vector<int32_t>>& slots, int threads) {
    const size_t head_stride = (size_t)cap * hd;
    {
        const QMat* ws[3] = {&wq, &wk, &wv};
        float* ys[3] = {s.q.data(), s.k.data(), s.v.data()};
        matmuls(ws, ys, 3, s.xq, threads);
    }
    for (int t = 0; t < T; ++t) {
        rope(s.q.data() + (size_t)t * H * hd, H, hd, cos + (size_t)t * hd, sin + (size_t)t * hd);
        rope(s.k.data() + (size_t)t * KV * hd, KV, hd, cos + (size_t)t * hd, sin + (size_t)t * hd);
        for (int c = 0; c < KV; ++c) {
            to_half(s.k.data() + ((size_t)t * KV + c) * hd, kl + c * head_stride + (size_t)(start + t) * hd, hd);
            to_half(s.v.data() + ((size_t)t * KV + c) * hd, vl + c * head_stride + (size_t)(start + t) * hd, hd);
        }
    }
    const float scale = 1.f / std::sqrt((float)hd);
    const int group = H / KV;
    size_t longest = 0;
    for (const auto& r : slots) longest = std::max(longest, r.size());
#pragma omp parallel num_threads(threads) if (threads > 1 && T * H > 1)
    {
        std::vector<float> scores(longest + 8);
#pragma omp for schedule(static)
        for (int item = 0; item < T * H; ++item) {  // kv head major: a thread reads few heads' keys
            const int c = item / (T * group), t = (item / group) % T, hh = c * group + item % group;
            attend_one(s.q.data() + ((size_t)t * H + hh) * hd, kl + c * head_stride, vl + c * head_stride,
                       slots[t].data(), (int)slots[t].size(), hd, scale, scores.data(),
                       s.att.data() + ((size_t)t * H + hh) * hd);
        }
    }
}

// x += o_proj(att); x += down(silu(gate(n)) * up(n)) with n = post_norm(x): the rest of a layer.
void attention_out_and_mlp(const QMat& wo, const float* post_norm, const QMat& wg, const QMat& wu, const QMat& wd,
                           Scratch& s, float* x, int T, int D, int H, int hd, int F, float eps, int threads) {
    quantise_rows(s.att.data(), T, H * hd, s.xq);
    {
        const QMat* ws[1] = {&wo};
        float* ys[1] = {s.o.data()};
        matmuls(ws, ys, 1, s.xq, threads);
    }
    for (size_t i = 0; i < (size_t)T * D; ++i) x[i] = x[i] + s.o[i];
    rmsnorm(x, post_norm, s.h.data(), T, D, eps);
    quantise_rows(s.h.data(), T, D, s.xq);
    {
        const QMat* ws[2] = {&wg, &wu};
        float* ys[2] = {s.g.data(), s.u.data()};
        matmuls(ws, ys, 2, s.xq, threads);
    }
    silu_mul(s.g.data(), s.u.data(), (size_t)T * F);
    quantise_rows(s.g.data(), T, F, s.xq);
    {
        const QMat* ws[1] = {&wd};
        float* ys[1] = {s.o.data()};
        matmuls(ws, ys, 1, s.xq, threads);
    }
    for (size_t i = 0; i < (size_t)T * D; ++i) x[i] = x[i] + s.o[i];
}

}  // namespace

extern "C" {

// The target's forward for T new tokens written at cache slots start..start+T-1.
//   x [T, D]: the tokens' embeddings in, the post-norm features out.
//   cos, sin [T, hd]: the rows of the RoPE tables at the tokens' positions.
//   kc, vc: the cache [L, KV, cap, hd] in fp16, like llama.cpp's (the new K/V are written into it,
//   uncommitted); attention reads half the bytes fp32 would, and rows stay independent of the batch.
//   positions [T]; visible [T, T] (1 where new row t sees new row j: ancestors and self) or null
//   for causal order. Every committed slot 0..start-1 is visible to every row.
//   aux: per layer (and L for the last output) a destination [T, D] for the state entering it, or null.
// Returns 0, or -1 when a query would see more keys than the cache holds (a caller's bug).
int qf_forward(const QModel* md, float* x, int T, const float* cos, const float* sin, uint16_t* kc, uint16_t* vc,
               int cap, int start, const int64_t* positions, const uint8_t* visible, float* const* aux,
               int threads) {
    const int D = md->D, H = md->H, KV = md->KV, hd = md->hd, F = md->F;
    const size_t layer_stride = (size_t)KV * cap * hd;
    Scratch s(T, D, D, H, KV, hd, F);
    // each row's visible slots in order of position: the committed ones, then its visible new rows
    std::vector<std::vector<int32_t>> slots(T);
    for (int t = 0; t < T; ++t) {
        std::vector<int32_t>& r = slots[t];
        r.reserve(start + T);
        for (int j = 0; j < start; ++j) r.push_back(j);
        std::vector<int> mine;
        for (int j = 0; j < T; ++j)
            if (visible ? visible[(size_t)t * T + j] != 0 : j <= t) mine.push_back(j);
        std::stable_sort(mine.begin(), mine.end(), [&](int a, int b) { return positions[a] < positions[b]; });
        for (int j : mine) r.push_back(start + j);
        if ((int)r.size() > cap) return -1;
    }
    for (int l = 0; l < md->L; ++l) {
        const QLayer& ly = md->layers[l];
        if (aux && aux[l]) std::memcpy(aux[l], x, sizeof(float) * T * D);
        rmsnorm(x, ly.attn_norm, s.h.data(), T, D, md->eps);
        quantise_rows(s.h.data(), T, D, s.xq);
        attention(ly.q, ly.k, ly.v, s, T, H, KV, hd, cos, sin, kc + l * layer_stride, vc + l * layer_stride, cap,
                  start, slots, threads);
        attention_out_and_mlp(ly.o, ly.ffn_norm, ly.gate, ly.up, ly.down, s, x, T, D, H, hd, F, md->eps, threads);
    }
    if (aux && aux[md->L]) std::memcpy(aux[md->L], x, sizeof(float) * T * D);
    rmsnorm(x, md->norm, s.h.data(), T, D, md->eps);
    std::memcpy(x, s.h.data(), sizeof(float) * T * D);
    return 0;
}

// The EAGLE-3 draft head's layer (head3.Eagle3Layer) for T pairs written at its cache slots
// start..start+T-1: attention over [input_norm(emb); hidden_norm(hidden)], the residual stream the
// hidden state (normed first with norm_before_residual), then the MLP. Its drafts need no
// exactness; this saves the ~60 small torch calls a draft call otherwise makes.
//   emb, hidden [T, D] in; g [T, D] out (the layer's output, before the head's final norm).
//   kc, vc: its cache [KV, cap, hd] in fp16. Slots before `committed` are visible to every row;
//   slots committed..start+T-1 follow tree [T, start + T - committed] (null: causal, start ==
//   committed).
int qf_head3(const QHead3* m, const float* emb, const float* hidden, float* g, int T, const float* cos,
             const float* sin, uint16_t* kc, uint16_t* vc, int cap, int committed, int start,
             const uint8_t* tree, int threads) {
    const int D = m->D, H = m->H, KV = m->KV, hd = m->hd, F = m->F;
    Scratch s(T, D, 2 * D, H, KV, hd, F);
    const int W = start + T - committed;
    std::vector<std::vector<int32_t>> slots(T);
    for (int t = 0; t < T; ++t) {
        std::vector<int32_t>& r = slots[t];
        r.reserve(start + T);
        for (int j = 0; j < committed; ++j) r.push_back(j);
        for (int j = 0; j < W; ++j)
            if (tree ? tree[(size_t)t * W + j] != 0 : j <= t) r.push_back(committed + j);
        if ((int)r.size() > cap || start + T > cap) return -1;
    }
    std::vector<float> hn((size_t)T * D);
    rmsnorm(emb, m->input_norm, s.h.data(), T, D, m->eps);   // h: [T, 2D] = [input_norm(emb) | hidden_norm(hidden)]
    rmsnorm(hidden, m->hidden_norm, hn.data(), T, D, m->eps);
    for (int t = T - 1; t >= 0; --t) {  // interleave the halves row by row (h held T x D so far)
        std::memmove(s.h.data() + (size_t)t * 2 * D, s.h.data() + (size_t)t * D, sizeof(float) * D);
        std::memcpy(s.h.data() + (size_t)t * 2 * D + D, hn.data() + (size_t)t * D, sizeof(float) * D);
    }
    quantise_rows(s.h.data(), T, 2 * D, s.xq);
    attention(m->q, m->k, m->v, s, T, H, KV, hd, cos, sin, kc, vc, cap, start, slots, threads);
    std::memcpy(g, m->norm_before_residual ? hn.data() : hidden, sizeof(float) * T * D);
    attention_out_and_mlp(m->o, m->post_norm, m->gate, m->up, m->down, s, g, T, D, H, hd, F, m->eps, threads);
    return 0;
}

}  // extern "C"
