// The float kernels one at a time, beside their scalar references: what the tests compare
// (tests/test_kernel_refs.py), on given rows.
// Included once, by qforward.cpp, inside its extern "C" block after the forward: one translation
// unit, so these calls use the forward's helpers (Team, Buffers, attention_block, mlp_block) as
// they are.
#pragma once

// A row's argmax by the kernel (ref 0) or its reference (ref 1): what the tests compare.
int64_t qf_argmax(const float* x, int n, int ref) { return ref ? argmax_row_ref(x, n) : argmax_row(x, n); }

// The float kernels of qrows.h and qattention.h (ref 0) or their scalar references (ref 1) on given rows: these
// exist for the tests (test_kernel_refs.py), which hold each pair to the same bits.
void qf_rmsnorm(const float* x, const float* w, float* y, int D, float eps, int ref) {
    ref ? rmsnorm_row_ref(x, w, y, D, eps) : rmsnorm_row(x, w, y, D, eps);
}

// y = exp(x) by exp8, 8 at a time, or exp_ref one by one; -1 for the kernel when n is not a multiple of 8
int qf_exp(const float* x, float* y, int n, int ref) {
    if (n < 0 || (!ref && n % 8)) return -1;
    if (ref)
        for (int i = 0; i < n; ++i) y[i] = exp_ref(x[i]);
    else
        for (int i = 0; i < n; i += 8) _mm256_storeu_ps(y + i, exp8(_mm256_loadu_ps(x + i)));
    return 0;
}

// g <- silu(g) * u; -1 for the kernel (which steps by 8) when n is not a multiple of 8
int qf_silu_mul(float* g, const float* u, int n, int ref) {
    if (n < 0 || (!ref && n % 8)) return -1;
    ref ? silu_mul_ref(g, u, (size_t)n) : silu_mul(g, u, (size_t)n);
    return 0;
}

void qf_log_softmax(float* x, int n, int ref) { ref ? log_softmax_row_ref(x, n) : log_softmax_row(x, n); }

// the min(k, n) best into vals, out; -3 for k outside 0..TOPK_MAX
int qf_top_k(const float* x, int n, int k, const int64_t* ids, float* vals, int64_t* out, int ref) {
    if (k < 0 || k > TOPK_MAX) return -3;
    ref ? top_k_row_ref(x, n, k, ids, vals, out) : top_k_row(x, n, k, ids, vals, out);
    return 0;
}

// nq queries q [nq, hd] over one kv head's cache kc, vc [cap, hd] (fp16): query i's keys are
// slots[counts[0] + ... + counts[i-1] ..][0..counts[i]-1], the first `shared` of them 0..shared-1;
// out [nq, hd]. The scratch is sized as attention_block sizes it (score_stride, KEY_CHUNK). -1 for
// slots outside the cache or a list that does not start with the shared ones, -4 for a head size
// attention does not take.
int qf_attend(const float* q, int nq, int hd, const uint16_t* kc, const uint16_t* vc, int cap, const int32_t* slots,
              const int32_t* counts, int shared, float scale, float* out, int ref) {
    if (!head_dim_ok(hd)) return -4;
    if (nq < 1 || shared < 0) return -1;
    std::vector<Query> qs;
    size_t longest = 0;
    for (int i = 0, at = 0; i < nq; at += counts[i++]) {
        if (counts[i] < std::max(shared, 1)) return -1;
        for (int j = 0; j < counts[i]; ++j)
            if (slots[at + j] < 0 || slots[at + j] >= cap || (j < shared && slots[at + j] != j)) return -1;
        qs.push_back(Query{q + (size_t)i * hd, out + (size_t)i * hd, slots + at, counts[i]});
        longest = std::max(longest, (size_t)counts[i]);
    }
    if (ref) {
        attend_queries_ref(qs.data(), nq, kc, vc, hd, scale);
        return 0;
    }
    const size_t stride = score_stride(longest);
    std::vector<float> scores(nq * stride), acc((size_t)nq * hd), kbuf((size_t)KEY_CHUNK * hd);
    attend_queries(qs.data(), nq, shared, kc, vc, hd, scale, scores.data(), stride, acc.data(), kbuf.data(),
                   attention_wide());
    return 0;
}
