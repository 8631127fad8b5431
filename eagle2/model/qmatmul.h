// The integer matmul kernels of the q4_1 forward (included by qforward.cpp), one per instruction
// set, all computing qblocks.h's sequence exactly (tests/test_quantized.py compares each with the
// scalar reference, bit for bit).
//
// A kernel computes a tile of R rows x C output vectors over the whole K: each weight block is
// loaded and its nibbles split once for the R rows (the rows of a tree cost integer work, not
// weight reads), and each row's 4 bytes are broadcast once for the C vectors (C = 1 for 512 bits).
// The tile's int32 sums of a block stay in registers, then its float sequence runs per (row, output):
//   AVX512-VNNI: 16 outputs a vector, vpdpbusd with the row's bytes broadcast from memory;
//   AVX-VNNI:    8 outputs a vector, vpdpbusd (VEX);
//   AVX2:        8 outputs a vector, vpmaddubsw; Q4_1's eight products of a block summed in int16
//                (at most 8 x 2 x 15 x 127 = 30480), then vpmaddwd to int32.
// Q8_0's weights are signed: the VNNI kernels multiply (w + 128) as unsigned and subtract 128 x the
// row's block sum (exact); AVX2 multiplies |w| by the row's bytes carrying w's sign.
#pragma once

#include "qblocks.h"

#include <atomic>

#define QF_VNNI512 __attribute__((target("avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")))

namespace qf {

enum Isa { AVX2 = 0, AVXVNNI = 1, AVX512VNNI = 2 };

// ------------------------------------------------------------------ reading ahead
// Each tile asks for the weight bytes `prefetch_bytes()` ahead of the block it multiplies (every
// cache line of the block that far on), so that the next blocks are on their way while this one's
// integer work runs: without it a forward of one row read its weights well under the machine's
// rate (an Intel Xeon guest, family 6 model 207, 2 threads, context 500: t(1) 5.66 -> 4.33 ms and
// t(4) 9.91 -> 7.26 ms at 8 KB ahead; benchmarks/README.md, prefetch; scripts/prefetch_distance.py
// measures it on the CPU at hand). A prefetch never faults, so reading past a matrix's end is
// harmless; it changes no bit of any result.
constexpr int PREFETCH_DEFAULT = 8192;
// The distance in bytes (0: no prefetch); qf_set_prefetch changes it between calls (measuring).
inline std::atomic<int>& prefetch_bytes() {
    static std::atomic<int> bytes{PREFETCH_DEFAULT};
    return bytes;
}

// The block of `bytes` at p + ahead on its way into the caches
inline void prefetch_block(const uint8_t* p, int bytes, int ahead) {
    for (int l = 0; l < bytes; l += 64) _mm_prefetch((const char*)(p + ahead + l), _MM_HINT_T0);
}

// ------------------------------------------------------------------ AVX512-VNNI: 16 outputs a vector

// acc += w (u8) . x (s8, 4 bytes broadcast from memory), folded into the instruction
QF_VNNI512 inline void dot512(__m512i& acc, __m512i w, const int32_t* x) {
    __asm__("vpdpbusd %1%{1to16%}, %2, %0" : "+v"(acc) : "m"(*x), "v"(w));
}

template <int R, bool Q4>
QF_VNNI512 inline void tile512(const QMat& w, int g, const QRows& x, int r0, float* y, int ldy, bool add) {
    const int nb = w.K / QK, st = block_bytes(w.type);
    const uint8_t* base = w.data + (size_t)g * nb * st;
    const __m512i lo4 = _mm512_set1_epi8(0x0F), flip = _mm512_set1_epi8((char)0x80);
    __m512 acc[R];
#pragma GCC unroll 16
    for (int r = 0; r < R; ++r) acc[r] = _mm512_setzero_ps();
    const int ahead = prefetch_bytes().load(std::memory_order_relaxed);
    for (int b = 0; b < nb; ++b) {
        const uint8_t* blk = base + (size_t)b * st;
        if (ahead) prefetch_block(blk, st, ahead);
        const int32_t* xs = (const int32_t*)x.block(b, r0);  // row r's bytes at xs + 8 r
        __m512i is[R];
#pragma GCC unroll 16
        for (int r = 0; r < R; ++r) is[r] = _mm512_setzero_si512();
        if constexpr (Q4) {
#pragma GCC unroll 4
            for (int i = 0; i < 4; ++i) {
                const __m512i raw = _mm512_loadu_si512(blk + i * 64);
                const __m512i lo = _mm512_and_si512(raw, lo4), hi = _mm512_and_si512(_mm512_srli_epi16(raw, 4), lo4);
#pragma GCC unroll 16
                for (int r = 0; r < R; ++r) {
                    dot512(is[r], lo, xs + 8 * r + i);
                    dot512(is[r], hi, xs + 8 * r + i + 4);
                }
            }
        } else {
#pragma GCC unroll 8
            for (int i = 0; i < 8; ++i) {
                const __m512i u = _mm512_xor_si512(_mm512_loadu_si512(blk + i * 64), flip);
#pragma GCC unroll 16
                for (int r = 0; r < R; ++r) dot512(is[r], u, xs + 8 * r + i);
            }
        }
        const uint16_t* sc = scales_at(w, blk);
        const __m512 wd = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i*)sc));
        const __m512 wm = Q4 ? _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i*)(sc + GROUP))) : wd;
#pragma GCC unroll 16
        for (int r = 0; r < R; ++r) {
            const size_t xb = x.at(b, r0 + r);
            __m512i isum = is[r];
            if constexpr (!Q4) isum = _mm512_sub_epi32(isum, _mm512_set1_epi32(128 * x.sum[xb]));
            acc[r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(isum), _mm512_mul_ps(wd, _mm512_set1_ps(x.d[xb])), acc[r]);
            if constexpr (Q4) acc[r] = _mm512_fmadd_ps(wm, _mm512_set1_ps(x.s[xb]), acc[r]);
        }
    }
    const int n0 = g * GROUP;
    const __mmask16 m = n0 + GROUP <= w.N ? (__mmask16)0xFFFF : (__mmask16)((1u << (w.N - n0)) - 1);
    const __m512 bias = w.bias && !add ? _mm512_maskz_loadu_ps(m, w.bias + n0) : _mm512_setzero_ps();
#pragma GCC unroll 16
    for (int r = 0; r < R; ++r) {
        float* yr = y + (size_t)(r0 + r) * ldy + n0;
        const __m512 out = add ? _mm512_add_ps(_mm512_maskz_loadu_ps(m, yr), acc[r])
                               : (w.bias ? _mm512_add_ps(acc[r], bias) : acc[r]);
        _mm512_mask_storeu_ps(yr, m, out);
    }
}

// Rows 8 at a time, each tile over the thread's groups in order, one group at a time: each thread
// streams its weights as one sequence (tiles of several groups, which broadcast each row's bytes
// once for more outputs, ran faster from the caches but slower from memory: 23% slower at 4 rows
// on a Zen 4; groups outside the row tiles, 4% slower at 16 rows, whose second pass finds a
// matrix's share in the L2/L3 anyway).
template <int R, bool Q4>
QF_VNNI512 void rows512(const QMat& w, int g0, int g1, const QRows& x, int r0, float* y, int ldy, bool add) {
    for (int g = g0; g < g1; ++g) tile512<R, Q4>(w, g, x, r0, y, ldy, add);
}

template <bool Q4>
QF_VNNI512 void groups512(const QMat& w, int g0, int g1, const QRows& x, float* y, int ldy, bool add) {
    int r = 0;
    for (; r + 8 <= x.M; r += 8) rows512<8, Q4>(w, g0, g1, x, r, y, ldy, add);
    switch (x.M - r) {
        case 7: rows512<7, Q4>(w, g0, g1, x, r, y, ldy, add); break;
        case 6: rows512<6, Q4>(w, g0, g1, x, r, y, ldy, add); break;
        case 5: rows512<5, Q4>(w, g0, g1, x, r, y, ldy, add); break;
        case 4: rows512<4, Q4>(w, g0, g1, x, r, y, ldy, add); break;
        case 3: rows512<3, Q4>(w, g0, g1, x, r, y, ldy, add); break;
        case 2: rows512<2, Q4>(w, g0, g1, x, r, y, ldy, add); break;
        case 1: rows512<1, Q4>(w, g0, g1, x, r, y, ldy, add); break;
    }
}

// ------------------------------------------------------------------ 256-bit: 8 outputs a vector
// A vector is half a group (unit u: group u / 2, its outputs 8 (u % 2)..+7). With 16 registers the
// tiles are smaller: up to 4 rows of one unit, or one row of two.

// AVX-VNNI's vpdpbusd (VEX): acc += w (u8) . x (s8), 4 bytes at a time. Written as one instruction
// in assembly, like dot512, so that the one tile template below compiles in this file's AVX2
// baseline for both instruction sets; only the VNNI instantiation contains it, and only a CPU with
// AVX-VNNI runs that one (matmul_groups chooses by isa_choice()).
inline void dpbusd256(__m256i& acc, __m256i w, __m256i x) {
    __asm__("%{vex%} vpdpbusd %2, %1, %0" : "+x"(acc) : "x"(w), "x"(x));
}

// A tile of R rows x C units over the whole K (C = 2 only for one row), VNNI or AVX2 products.
template <int R, int C, bool Q4, bool VNNI>
inline void tile256(const QMat& w, int u0, const QRows& x, int r0, float* y, int ldy, bool add) {
    const int nb = w.K / QK, st = block_bytes(w.type);
    const size_t gstride = (size_t)nb * st;
    const __m256i lo4 = _mm256_set1_epi8(0x0F), flip = _mm256_set1_epi8((char)0x80);
    const __m256i ones = _mm256_set1_epi16(1);
    const uint8_t *gb[C], *ub[C];  // unit c's group, and its half's bytes in each chunk
    for (int c = 0; c < C; ++c) {
        gb[c] = w.data + (size_t)((u0 + c) / 2) * gstride;
        ub[c] = gb[c] + ((u0 + c) % 2) * 32;
    }
    __m256 acc[R][C];
    for (int r = 0; r < R; ++r)
        for (int c = 0; c < C; ++c) acc[r][c] = _mm256_setzero_ps();
    const int ahead = prefetch_bytes().load(std::memory_order_relaxed);
    for (int b = 0; b < nb; ++b) {
        if (ahead)  // (two units of one group share its blocks)
            for (int c = 0; c < C; ++c)
                if (c == 0 || gb[c] != gb[c - 1]) prefetch_block(gb[c] + (size_t)b * st, st, ahead);
        const int32_t* xs = (const int32_t*)x.block(b, r0);
        __m256i is[R][C];
        for (int r = 0; r < R; ++r)
            for (int c = 0; c < C; ++c) is[r][c] = _mm256_setzero_si256();
        if constexpr (Q4) {
            for (int i = 0; i < 4; ++i) {
                __m256i lo[C], hi[C];
                for (int c = 0; c < C; ++c) {
                    const __m256i raw = _mm256_loadu_si256((const __m256i*)(ub[c] + (size_t)b * st + i * 64));
                    lo[c] = _mm256_and_si256(raw, lo4);
                    hi[c] = _mm256_and_si256(_mm256_srli_epi16(raw, 4), lo4);
                }
                for (int r = 0; r < R; ++r) {
                    const __m256i xl = _mm256_set1_epi32(xs[8 * r + i]), xh = _mm256_set1_epi32(xs[8 * r + i + 4]);
                    for (int c = 0; c < C; ++c) {
                        if constexpr (VNNI) {
                            dpbusd256(is[r][c], lo[c], xl);
                            dpbusd256(is[r][c], hi[c], xh);
                        } else {  // the sum kept in order: reassociated, the products wait
                            is[r][c] = _mm256_add_epi16(is[r][c], _mm256_maddubs_epi16(lo[c], xl));
                            is[r][c] = _mm256_add_epi16(is[r][c], _mm256_maddubs_epi16(hi[c], xh));
                            __asm__("" : "+x"(is[r][c]));  // in registers and spill
                        }
                    }
                }
            }
            if constexpr (!VNNI)
                for (int r = 0; r < R; ++r)
                    for (int c = 0; c < C; ++c) is[r][c] = _mm256_madd_epi16(is[r][c], ones);
        } else {
            for (int i = 0; i < 8; ++i) {
                __m256i wv[C], uv[C];
                for (int c = 0; c < C; ++c) {
                    wv[c] = _mm256_loadu_si256((const __m256i*)(ub[c] + (size_t)b * st + i * 64));
                    uv[c] = VNNI ? _mm256_xor_si256(wv[c], flip) : _mm256_sign_epi8(wv[c], wv[c]);
                }
                for (int r = 0; r < R; ++r) {
                    const __m256i xv = _mm256_set1_epi32(xs[8 * r + i]);
                    for (int c = 0; c < C; ++c) {
                        if constexpr (VNNI) {
                            dpbusd256(is[r][c], uv[c], xv);
                        } else {
                            const __m256i p = _mm256_maddubs_epi16(uv[c], _mm256_sign_epi8(xv, wv[c]));
                            is[r][c] = _mm256_add_epi32(is[r][c], _mm256_madd_epi16(p, ones));
                            __asm__("" : "+x"(is[r][c]));
                        }
                    }
                }
            }
        }
        for (int c = 0; c < C; ++c) {
            const uint16_t* sc = scales_at(w, gb[c] + (size_t)b * st) + ((u0 + c) % 2) * 8;
            const __m256 wd = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i*)sc));
            const __m256 wm = Q4 ? _mm256_cvtph_ps(_mm_loadu_si128((const __m128i*)(sc + GROUP))) : wd;
            for (int r = 0; r < R; ++r) {
                const size_t xb = x.at(b, r0 + r);
                __m256i isum = is[r][c];
                if constexpr (!Q4 && VNNI) isum = _mm256_sub_epi32(isum, _mm256_set1_epi32(128 * x.sum[xb]));
                acc[r][c] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(isum), _mm256_mul_ps(wd, _mm256_set1_ps(x.d[xb])), acc[r][c]);
                if constexpr (Q4) acc[r][c] = _mm256_fmadd_ps(wm, _mm256_set1_ps(x.s[xb]), acc[r][c]);
            }
        }
    }
    for (int c = 0; c < C; ++c) {
        const int n0 = (u0 + c) * 8, valid = std::min(8, w.N - n0);
        for (int r = 0; r < R; ++r) {
            alignas(32) float out[8];
            _mm256_store_ps(out, acc[r][c]);
            float* yr = y + (size_t)(r0 + r) * ldy + n0;
            for (int k = 0; k < valid; ++k)
                yr[k] = add ? yr[k] + out[k] : (w.bias ? out[k] + w.bias[n0 + k] : out[k]);
        }
    }
}

// Rows r0..r0+R-1 over units u0..u1-1, two units a tile for a single row.
template <int R, bool Q4, bool VNNI>
void rows256(const QMat& w, int u0, int u1, const QRows& x, int r0, float* y, int ldy, bool add) {
    constexpr int C = R == 1 ? 2 : 1;
    int u = u0;
    for (; u + C <= u1; u += C) tile256<R, C, Q4, VNNI>(w, u, x, r0, y, ldy, add);
    for (; u < u1; ++u) tile256<R, 1, Q4, VNNI>(w, u, x, r0, y, ldy, add);
}

// Every row of x, 4 at a time, over the outputs of groups g0..g1-1.
template <bool Q4, bool VNNI>
void groups256(const QMat& w, int g0, int g1, const QRows& x, float* y, int ldy, bool add) {
    const int u0 = 2 * g0, u1 = std::min(2 * g1, (w.N + 7) / 8);
    int r = 0;
    for (; r + 4 <= x.M; r += 4) rows256<4, Q4, VNNI>(w, u0, u1, x, r, y, ldy, add);
    switch (x.M - r) {
        case 3: rows256<3, Q4, VNNI>(w, u0, u1, x, r, y, ldy, add); break;
        case 2: rows256<2, Q4, VNNI>(w, u0, u1, x, r, y, ldy, add); break;
        case 1: rows256<1, Q4, VNNI>(w, u0, u1, x, r, y, ldy, add); break;
    }
}

// ------------------------------------------------------------------ choosing one, once

inline bool cpu_has(int which) {
    __builtin_cpu_init();
    switch (which) {
        case AVX2: return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
        case AVXVNNI: return __builtin_cpu_supports("avxvnni");
        case AVX512VNNI:
            return __builtin_cpu_supports("avx512vnni") && __builtin_cpu_supports("avx512bw") &&
                   __builtin_cpu_supports("avx512vl");
    }
    return false;
}

inline int best_isa() { return cpu_has(AVX512VNNI) ? AVX512VNNI : cpu_has(AVXVNNI) ? AVXVNNI : AVX2; }

// Set when the library loads, before any thread runs; qf_set_isa changes it between calls (tests,
// EAGLE2_Q4_KERNELS). Atomic so that a forward reads one value whole.
inline std::atomic<int>& isa_choice() {
    static std::atomic<int> choice{best_isa()};
    return choice;
}

// Whether attention's shared keys run 16 lanes wide (qattention.h): with the AVX512 integer kernels
// (EAGLE2_Q4_KERNELS=avx2 takes the 8-lane path for both; a query's bits are the same either way).
inline bool attention_wide() { return isa_choice().load(std::memory_order_relaxed) == AVX512VNNI; }

// y [M, ldy] (+)= x @ w^T for the outputs of groups g0..g1-1, every row of x
inline void matmul_groups(const QMat& w, int g0, int g1, const QRows& x, float* y, int ldy, bool add) {
    if (g0 >= g1 || x.M == 0) return;
    const bool q4 = w.type == Q4_1;
    switch (isa_choice().load(std::memory_order_relaxed)) {
        case AVX512VNNI:
            q4 ? groups512<true>(w, g0, g1, x, y, ldy, add) : groups512<false>(w, g0, g1, x, y, ldy, add);
            break;
        case AVXVNNI:
            q4 ? groups256<true, true>(w, g0, g1, x, y, ldy, add) : groups256<false, true>(w, g0, g1, x, y, ldy, add);
            break;
        default:
            q4 ? groups256<true, false>(w, g0, g1, x, y, ldy, add) : groups256<false, false>(w, g0, g1, x, y, ldy, add);
    }
}

}  // namespace qf
