// A forward's attention alone, as qf_forward runs it for T rows after `context` committed keys:
// 30 layers x 3 kv heads of SmolLM2-135M (9 query heads of 64), the queries of each kv head cut
// into one contiguous run per thread (attend_items' split for a few rows), each run through
// qattention.h's attend_queries. Between two layers each thread may first stream `mb` MB of other
// memory, as the matmuls' weights pass through the caches in a real forward.
//   g++ -O3 -std=c++17 -mavx2 -mfma -mf16c -ffp-contract=off -fopenmp -I../../eagle2/model \
//       attention_layers.cpp -o attention_layers && ./attention_layers T CONTEXT MB [THREADS]
#include "qattention.h"

#include <omp.h>

#include <chrono>
#include <cstdio>
#include <random>

using namespace qf;

int main(int argc, char** argv) {
    if (argc < 4) {
        std::fprintf(stderr, "usage: attention_layers T CONTEXT MB [THREADS]\n");
        return 2;
    }
    const int T = std::atoi(argv[1]), context = std::atoi(argv[2]), nt = argc > 4 ? std::atoi(argv[4]) : 2;
    const double mb = std::atof(argv[3]);
    const int hd = 64, L = 30, KV = 3, G = 3, cap = context + T, reps = 30;
    std::mt19937 rng(1);
    std::normal_distribution<float> nd;
    std::vector<uint16_t> kc((size_t)L * KV * cap * hd), vc(kc.size());
    std::vector<float> row(hd);
    for (size_t i = 0; i < kc.size(); i += hd) {
        for (auto& v : row) v = nd(rng);
        to_half(row.data(), kc.data() + i, hd);
        for (auto& v : row) v = nd(rng);
        to_half(row.data(), vc.data() + i, hd);
    }
    const size_t stream = (size_t)(mb * (1 << 20)) / sizeof(float);
    std::vector<float> other(stream * L + 16, 1.f), qv((size_t)T * KV * G * hd), out(qv.size());
    for (auto& v : qv) v = nd(rng);
    std::vector<std::vector<int32_t>> slots(T);  // a chain: row t sees the context and rows 0..t
    for (int t = 0; t < T; ++t)
        for (int j = 0; j <= context + t; ++j) slots[t].push_back(j);
    const size_t stride = score_stride(context + T);
    double best = 1e9;
    for (int r = 0; r < reps; ++r) {
        double spent[64] = {};
#pragma omp parallel num_threads(nt)
        {
            const int tid = omp_get_thread_num();
            std::vector<float> scores(T * G * stride), acc((size_t)T * G * hd), kbuf((size_t)KEY_CHUNK * hd);
            std::vector<Query> qs;
            float sink = 0;
            for (int l = 0; l < L; ++l) {
                const float* o = other.data() + (size_t)l * stream;
                __m256 s = _mm256_setzero_ps();
                for (size_t i = stream * tid / nt; i + 8 <= stream * (tid + 1) / nt; i += 16) s = _mm256_add_ps(s, _mm256_loadu_ps(o + i));
                sink += hsum(s);
#pragma omp barrier
                const auto t0 = std::chrono::steady_clock::now();
                const int total = KV * T * G, q1 = total * (tid + 1) / nt;
                for (int q = total * tid / nt; q < q1;) {
                    const int c = q / (T * G), end = std::min(q1, (c + 1) * T * G);
                    qs.clear();
                    for (int i = q - c * T * G; i < end - c * T * G; ++i) {
                        const size_t at = ((size_t)(i / G) * KV * G + c * G + i % G) * hd;
                        qs.push_back(Query{qv.data() + at, out.data() + at, slots[i / G].data(), (int)slots[i / G].size()});
                    }
                    const size_t head = ((size_t)l * KV + c) * cap * hd;
                    attend_queries(qs.data(), (int)qs.size(), context, kc.data() + head, vc.data() + head, hd, 0.125f,
                                   scores.data(), stride, acc.data(), kbuf.data(), __builtin_cpu_supports("avx512f"));
                    q = end;
                }
                spent[tid] += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
#pragma omp barrier
            }
            if (sink == 1234.5f) std::printf(" ");
        }
        double mean = 0;
        for (int t = 0; t < nt; ++t) mean += spent[t] / nt;
        best = std::min(best, mean);
    }
    const double fmas = (double)L * KV * G * T * (context + (T + 1) / 2.0) * hd * 2;
    std::printf("T=%d context=%d stream=%.1f MB a layer, %d threads: attention %.3f ms a forward (thread mean), "
                "%.1f G fp32 FMA/s a thread\n", T, context, mb, nt, best * 1e3, fmas / nt / best / 1e9);
}
