// A call's thread team (included by qforward.cpp): each OpenMP thread's share of the work, where
// the team meets (its own barrier, which every parallel region binds; never `omp barrier`), and
// the seconds it spends per op when `profile` asks.
#pragma once

#include "qattention.h"

#include <omp.h>
#include <sched.h>

#include <atomic>
#include <chrono>
#include <vector>

namespace qf {

// ------------------------------------------------------------------ where a call's time goes

// What `profile` splits a forward into (qlib.OPS names them in this order).
enum Op { OP_QKV, OP_O, OP_GATE_UP, OP_DOWN, OP_LM_HEAD, OP_ATTENTION, OP_QUANTISE, OP_FLOAT, OP_WAIT, N_OPS };

// One thread's seconds per op, when the caller asks (acc non-null); otherwise nothing is read.
struct Clock {
    double* acc;
    std::chrono::steady_clock::time_point t;
    explicit Clock(double* a) : acc(a) {
        if (acc) t = std::chrono::steady_clock::now();
    }
    void lap(int op) {
        if (!acc) return;
        const auto now = std::chrono::steady_clock::now();
        acc[op] += std::chrono::duration<double>(now - t).count();
        t = now;
    }
};

// Where a call's team meets (Team::sync): its threads spin on a counter, then yield the CPU,
// instead of meeting at `omp barrier`. libgomp spins at a barrier only while the process holds no
// more OpenMP threads than CPUs, and every thread that calls the kernels gets a team of its own,
// kept while it lives (a server's workers, a measurer, a library user's pool): past that count
// every barrier of a forward slept in the kernel and was woken, and a plain q4_1 step at 2 threads
// took 8.1-8.7 ms instead of 1.6 once one other thread had called the kernels
// (benchmarks/spin-barrier/README.md). A call's threads all run, so a short spin is what they
// wait; the yield lets a descheduled member run where threads outnumber CPUs.
struct SpinBarrier {
    static constexpr int SPINS_BEFORE_YIELD = 256;  // pauses: a few microseconds
    std::atomic<int> arrived{0}, generation{0}, size{0};
    // each member says how many meet (the same omp_get_num_threads() for all) before its first wait
    void join(int nt) { size.store(nt, std::memory_order_relaxed); }
    void wait() {
        const int g = generation.load(std::memory_order_acquire);
        if (arrived.fetch_add(1, std::memory_order_acq_rel) == size.load(std::memory_order_relaxed) - 1) {
            arrived.store(0, std::memory_order_relaxed);   // the last to arrive opens the next round
            generation.store(g + 1, std::memory_order_release);
            return;
        }
        for (int spins = 0; generation.load(std::memory_order_acquire) == g; ++spins) {
            if (spins < SPINS_BEFORE_YIELD) _mm_pause();
            else sched_yield();
        }
    }
};

// A thread of the call's team.
struct Team {
    int tid, nt;
    Clock clock;
    std::vector<float> scores, acc, kbuf;  // attention's (attention_block sizes them)
    std::vector<Query> queries;
    SpinBarrier* meet = nullptr;  // the call's: every region binds one before its first sync
    void bind(SpinBarrier& b) {
        meet = &b;
        b.join(nt);
    }
    // the work since the last lap was `op`; then wait for the whole team
    void sync(int op) {
        clock.lap(op);
        if (nt > 1) meet->wait();
        clock.lap(OP_WAIT);
    }
    // this thread's share [lo, hi) of n items, in whole granules
    void share(int n, int granule, int& lo, int& hi) const {
        const int64_t units = (n + granule - 1) / granule;
        lo = std::min<int64_t>(n, units * tid / nt * granule);
        hi = std::min<int64_t>(n, units * (tid + 1) / nt * granule);
    }
};

}  // namespace qf
