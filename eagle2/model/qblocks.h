// The q4_1 forward's data (included by qforward.cpp): the weights' packed blocks, the activation
// rows quantised per block, and the scalar reference every integer kernel is compared with.
//
// Weights stay in the GGUF's blocks of 32 values along K: Q4_1 (value = d * q + m, q in 0..15) for
// the layers' matrices, Q8_0 (value = d * q, q in -127..127) for the LM heads and the draft head.
// They are repacked once (qblocks.py `QMatrix.packed`) in groups of 16 outputs, each group's
// blocks in order, each block one contiguous record:
//   Q4_1, 320 bytes: 4 chunks of 64 bytes (output c's 4 bytes at 4c: low nibbles values 4i..4i+3,
//         high nibbles values 16+4i..16+4i+3 of chunk i), then 16 fp16 scales d, 16 fp16 offsets m;
//   Q8_0, 544 bytes: 8 chunks of 64 bytes (output c's 4 bytes at 4c: values 4i..4i+3), then 16
//         fp16 scales.
// A block's integer dot product for an output is then 8 four-byte dot products against the row's
// matching 4 bytes, broadcast: one stream per group, and every instruction set reads the same bytes.
//
// The float work per (row, output) is one fixed sequence, the same in every kernel, tile and
// thread count: per block in order, acc = fma(float(isum), d_w * d_x, acc), then for Q4_1
// acc = fma(m_w, s_x, acc); then y = acc (+ bias), or y = y + acc where the output adds to a
// residual. isum is an exact int32, so which instructions made it does not matter.
#pragma once

#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>

#define QF_AVX2 __attribute__((target("avx2,fma,f16c")))

extern "C" {

// One quantised matrix [N, K] (N outputs, K a multiple of 32), packed as above.
struct QMat {
    const uint8_t* data;  // [ceil(N / 16), K / 32] records of qf_block_bytes(type) bytes
    const float* bias;    // [N] or null
    int32_t N, K, type;   // type: 0 = Q4_1, 1 = Q8_0
    int32_t pad_;
};

}  // extern "C"

namespace qf {

enum WeightType { Q4_1 = 0, Q8_0 = 1 };
constexpr int QK = 32;  // values per block
constexpr int GROUP = 16;  // outputs per packed group

inline int block_bytes(int type) { return type == Q4_1 ? 320 : 544; }
inline int groups_of(const QMat& w) { return (w.N + GROUP - 1) / GROUP; }
inline const uint8_t* block_at(const QMat& w, int g, int b) {
    return w.data + ((size_t)g * (w.K / QK) + b) * block_bytes(w.type);
}
inline const uint16_t* scales_at(const QMat& w, const uint8_t* blk) {
    return (const uint16_t*)(blk + (w.type == Q4_1 ? 256 : 512));
}

// Row r of a packed matrix as the floats its blocks hold: d * q (+ m for Q4_1), each one IEEE
// multiply (and add) as qblocks.QMatrix.dequantised computes them. The embedding lookup reads
// the token embedding's blocks through it, so the backend keeps no fp32 copy of the table.
inline void dequantise_row(const QMat& w, int r, float* out) {
    const int g = r / GROUP, c = r % GROUP, nb = w.K / QK;
    for (int b = 0; b < nb; ++b) {
        const uint8_t* blk = block_at(w, g, b);
        const uint16_t* sc = scales_at(w, blk);
        const float d = _cvtsh_ss(sc[c]);
        float* o = out + (size_t)b * QK;
        if (w.type == Q8_0) {
            for (int i = 0; i < QK; ++i) o[i] = d * (float)(int8_t)blk[(i / 4) * 64 + 4 * c + i % 4];
        } else {
            const float m = _cvtsh_ss(sc[GROUP + c]);
            for (int i = 0; i < QK / 2; ++i) {
                const uint8_t byte = blk[(i / 4) * 64 + 4 * c + i % 4];
                o[i] = d * (float)(byte & 15) + m;
                o[QK / 2 + i] = d * (float)(byte >> 4) + m;
            }
        }
    }
}

// Activation rows quantised per block of 32 to int8, block-major so that a tile of rows reads one
// block of all its rows from one place: q [nb][M][32]; per (block, row) the scale d = amax / 127,
// the integer sum of the q and s = d * sum (Q4_1's offsets multiply s).
struct QRows {
    std::vector<int8_t> q;
    std::vector<float> d, s;
    std::vector<int32_t> sum;
    int M = 0, nb = 0;
    void resize(int rows, int K) {
        M = rows;
        nb = K / QK;
        q.resize((size_t)M * K);
        d.resize((size_t)M * nb);
        s.resize((size_t)M * nb);
        sum.resize((size_t)M * nb);
    }
    const int8_t* block(int b, int r) const { return q.data() + ((size_t)b * M + r) * QK; }
    size_t at(int b, int r) const { return (size_t)b * M + r; }
};

// Blocks b0..b1-1 of row r (x: the row's start) into `out` (sized by resize). The vector code and
// a scalar one agree bit for bit: max and the integer sum are exact, the product is one IEEE
// multiply, and the conversion rounds to nearest even like nearbyint.
QF_AVX2 inline void quantise_blocks(const float* x, int b0, int b1, int r, QRows& out) {
    const __m256 sign = _mm256_set1_ps(-0.f);
    for (int b = b0; b < b1; ++b) {
        const float* xb = x + b * QK;
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
        _mm256_storeu_si256((__m256i*)(out.q.data() + out.at(b, r) * QK), p8);
        __m256i s = _mm256_add_epi32(_mm256_add_epi32(q[0], q[1]), _mm256_add_epi32(q[2], q[3]));
        __m128i s4 = _mm_add_epi32(_mm256_castsi256_si128(s), _mm256_extracti128_si256(s, 1));
        s4 = _mm_add_epi32(s4, _mm_shuffle_epi32(s4, 0x4E));
        s4 = _mm_add_epi32(s4, _mm_shuffle_epi32(s4, 0xB1));
        const int32_t total = _mm_cvtsi128_si32(s4);
        out.d[out.at(b, r)] = d;
        out.sum[out.at(b, r)] = total;
        out.s[out.at(b, r)] = d * (float)total;
    }
}

inline void quantise_row(const float* x, int K, int r, QRows& out) { quantise_blocks(x, 0, K / QK, r, out); }

inline float half_to_float(uint16_t h) { return _cvtsh_ss(h); }

// The scalar reference of every integer kernel (qf_matmul_ref; the tests compare each SIMD path with it):
// rows [0, x.M), outputs [0, w.N), y [M, ldy] stored (add: y = y + acc).
inline void matmul_reference(const QMat& w, const QRows& x, float* y, int ldy, bool add) {
    const int nb = w.K / QK;
    for (int r = 0; r < x.M; ++r)
        for (int n = 0; n < w.N; ++n) {
            const int g = n / GROUP, c = n % GROUP;
            float acc = 0.f;
            for (int b = 0; b < nb; ++b) {
                const uint8_t* blk = block_at(w, g, b);
                const uint16_t* sc = scales_at(w, blk);
                const int8_t* xq = x.block(b, r);
                int32_t isum = 0;
                if (w.type == Q4_1) {
                    for (int i = 0; i < 4; ++i)
                        for (int j = 0; j < 4; ++j) {
                            const uint8_t byte = blk[i * 64 + c * 4 + j];
                            isum += (byte & 15) * xq[4 * i + j] + (byte >> 4) * xq[16 + 4 * i + j];
                        }
                } else {
                    for (int i = 0; i < 8; ++i)
                        for (int j = 0; j < 4; ++j) isum += (int8_t)blk[i * 64 + c * 4 + j] * xq[4 * i + j];
                }
                acc = std::fma((float)isum, half_to_float(sc[c]) * x.d[x.at(b, r)], acc);
                if (w.type == Q4_1) acc = std::fma(half_to_float(sc[GROUP + c]), x.s[x.at(b, r)], acc);
            }
            float* out = y + (size_t)r * ldy + n;
            *out = add ? *out + acc : (w.bias ? acc + w.bias[n] : acc);
        }
}

}  // namespace qf
