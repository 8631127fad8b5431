// One core's fp32 FMA rate in 512-bit and 256-bit vectors: 12 independent chains, no memory.
//   g++ -O2 -mavx2 -mfma -mavx512f fma_peak.cpp -o fma_peak && ./fma_peak   (a CPU with AVX512F)
#include <immintrin.h>

#include <algorithm>
#include <chrono>
#include <cstdio>

template <class V, class F>
double rate(F fma, V b, V c, int lanes) {
    V a[12];
    for (int i = 0; i < 12; ++i) a[i] = b;
    double best = 1e9;
    for (int r = 0; r < 10; ++r) {
        auto t0 = std::chrono::steady_clock::now();
        for (long n = 0; n < 10000000; ++n) {
#pragma GCC unroll 12
            for (int i = 0; i < 12; ++i) a[i] = fma(a[i], b, c);
            __asm__ volatile("" : "+v"(a[0]), "+v"(a[1]), "+v"(a[2]), "+v"(a[3]), "+v"(a[4]), "+v"(a[5]), "+v"(a[6]),
                             "+v"(a[7]), "+v"(a[8]), "+v"(a[9]), "+v"(a[10]), "+v"(a[11]));
        }
        best = std::min(best, std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
    }
    return 12e7 * lanes / best / 1e9;
}

int main() {
    const double z = rate<__m512>([](__m512 a, __m512 b, __m512 c) { return _mm512_fmadd_ps(a, b, c); },
                                  _mm512_set1_ps(0.9999f), _mm512_set1_ps(1e-4f), 16);
    const double y = rate<__m256>([](__m256 a, __m256 b, __m256 c) { return _mm256_fmadd_ps(a, b, c); },
                                  _mm256_set1_ps(0.9999f), _mm256_set1_ps(1e-4f), 8);
    std::printf("fp32 FMA, one core: 512-bit %.1f G/s, 256-bit %.1f G/s\n", z, y);
}
