// What this machine can do, measured by micro-kernels (included by qforward.cpp), for `profile`'s
// roofline: the int8 multiply-add peak of each instruction set's inner instruction, and the rate at
// which threads stream a buffer too large for the caches (a forward's weight reads).
#pragma once

#include "qmatmul.h"

#include <omp.h>

#include <chrono>

namespace qf {

// Independent chains of the kernels' inner step, so that throughput, not latency, sets the rate:
// each step one vector of u8 x s8 products summed into int32 (AVX2: into int16, as the Q4_1 kernel
// does). Returns a checksum so the work is not optimised away.
QF_VNNI512 inline int64_t chains512(int64_t steps) {
    __m512i a = _mm512_set1_epi8(3), b = _mm512_set1_epi8(5);
    __m512i s[12];
    for (int i = 0; i < 12; ++i) s[i] = _mm512_setzero_si512();
    for (int64_t it = 0; it < steps; ++it) {
#pragma GCC unroll 12
        for (int i = 0; i < 12; ++i) s[i] = _mm512_dpbusd_epi32(s[i], a, b);
        __asm__ volatile("" : "+v"(a));
    }
    __m512i t = s[0];
    for (int i = 1; i < 12; ++i) t = _mm512_add_epi32(t, s[i]);
    return _mm512_reduce_add_epi32(t);
}

// 256-bit: 4 chains (their products are independent, so the adds' 1-cycle dependency is all that
// chains), each with its own right operand (one product for all would be computed once), 8 steps
// a loop; within 16 registers, so nothing spills.
template <bool VNNI>
inline __m256i step256(__m256i s, __m256i a, __m256i b) {
    if constexpr (VNNI) {
        dpbusd256(s, a, b);
        return s;
    } else {
        return _mm256_add_epi16(s, _mm256_maddubs_epi16(a, b));
    }
}

template <bool VNNI>
inline int64_t chains256(int64_t steps) {
    __m256i a = _mm256_set1_epi8(3), b[4], s[4];
    for (int i = 0; i < 4; ++i) {
        b[i] = _mm256_set1_epi8((char)(i + 1));
        s[i] = _mm256_setzero_si256();
    }
    for (int64_t it = 0; it < steps; ++it) {
#pragma GCC unroll 4
        for (int i = 0; i < 4; ++i) s[i] = step256<VNNI>(s[i], a, b[i]);
        __asm__ volatile("" : "+x"(a));
#pragma GCC unroll 4
        for (int i = 0; i < 4; ++i) s[i] = step256<VNNI>(s[i], a, b[i]);
        __asm__ volatile("" : "+x"(a));
    }
    const __m256i t = _mm256_add_epi32(_mm256_add_epi32(s[0], s[1]), _mm256_add_epi32(s[2], s[3]));
    alignas(32) int32_t o[8];
    _mm256_store_si256((__m256i*)o, t);
    return o[0] + o[7];
}

// fp32 fused multiply-adds (AVX2, 8 lanes): attention's arithmetic; 10 chains.
QF_AVX2 inline int64_t chains_fma(int64_t steps) {
    __m256 a = _mm256_set1_ps(1.0001f), s[10];
    for (int i = 0; i < 10; ++i) s[i] = _mm256_set1_ps((float)i);
    for (int64_t it = 0; it < steps; ++it) {
#pragma GCC unroll 10
        for (int i = 0; i < 10; ++i) s[i] = _mm256_fmadd_ps(a, s[i], a);
        __asm__ volatile("" : "+x"(a));
    }
    __m256 t = s[0];
    for (int i = 1; i < 10; ++i) t = _mm256_add_ps(t, s[i]);
    return (int64_t)_mm256_cvtss_f32(t);
}

inline double seconds_since(std::chrono::steady_clock::time_point t0) {
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

// int8 multiply-adds per second (GMAC/s) of instruction set `which` on `threads` threads, the best
// of 3 runs of about 0.1 s; 0 where this CPU lacks it.
inline double int8_peak_gmacs(int which, int threads) {
    if (!cpu_has(which)) return 0.0;
    const int64_t steps = 4000000;
    const double macs = (which == AVX512VNNI ? 12.0 * 64 : 8.0 * 32) * steps;  // products a loop
    double best = 0.0;
    for (int rep = 0; rep < 3; ++rep) {
        int64_t sink = 0;
        const auto t0 = std::chrono::steady_clock::now();
#pragma omp parallel num_threads(threads) reduction(+ : sink)
        {
            if (which == AVX512VNNI) sink += chains512(steps);
            else if (which == AVXVNNI) sink += chains256<true>(steps);
            else sink += chains256<false>(steps);
        }
        const double s = seconds_since(t0);
        if (sink == 42) best += 0;  // keeps the sums alive
        best = std::max(best, macs * threads / s / 1e9);
    }
    return best;
}

// fp32 multiply-adds per second (G/s) of the AVX2 FMA on `threads` threads, the best of 3 runs.
inline double fma_peak_gflops(int threads) {
    const int64_t steps = 4000000;
    double best = 0.0;
    for (int rep = 0; rep < 3; ++rep) {
        int64_t sink = 0;
        const auto t0 = std::chrono::steady_clock::now();
#pragma omp parallel num_threads(threads) reduction(+ : sink)
        sink += chains_fma(steps);
        const double s = seconds_since(t0);
        if (sink == 42) best += 0;
        best = std::max(best, 10.0 * 8 * steps * threads / s / 1e9);
    }
    return best;
}

// Bytes per second (GB/s) that `threads` threads read from a buffer of `bytes` (each its own
// contiguous part, summed with four AVX2 accumulators), the best of `repeats` passes.
QF_AVX2 inline double read_gbs(size_t bytes, int threads, int repeats) {
    const size_t n = bytes / 32;
    std::vector<int64_t> storage(n * 4 + 4, 1);  // 32-byte aligned views of it
    const __m256i* buf = (const __m256i*)(((uintptr_t)storage.data() + 31) & ~(uintptr_t)31);
    double best = 0.0;
    for (int rep = 0; rep < repeats; ++rep) {
        int64_t sink = 0;
        const auto t0 = std::chrono::steady_clock::now();
#pragma omp parallel num_threads(threads) reduction(+ : sink)
        {
            const int tid = omp_get_thread_num(), nt = omp_get_num_threads();
            const size_t lo = n * tid / nt, hi = n * (tid + 1) / nt;
            __m256i a0 = _mm256_setzero_si256(), a1 = a0, a2 = a0, a3 = a0;
            size_t i = lo;
            for (; i + 4 <= hi; i += 4) {
                a0 = _mm256_add_epi64(a0, _mm256_load_si256(buf + i));
                a1 = _mm256_add_epi64(a1, _mm256_load_si256(buf + i + 1));
                a2 = _mm256_add_epi64(a2, _mm256_load_si256(buf + i + 2));
                a3 = _mm256_add_epi64(a3, _mm256_load_si256(buf + i + 3));
            }
            for (; i < hi; ++i) a0 = _mm256_add_epi64(a0, _mm256_load_si256(buf + i));
            const __m256i t = _mm256_add_epi64(_mm256_add_epi64(a0, a1), _mm256_add_epi64(a2, a3));
            sink += _mm256_extract_epi64(t, 0) + _mm256_extract_epi64(t, 3);
        }
        const double s = seconds_since(t0);
        if (sink == 42) best += 0;
        best = std::max(best, (double)(n * 32) / s / 1e9);
    }
    return best;
}

}  // namespace qf
