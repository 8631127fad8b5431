// The EAGLE-3 draft head's step in one call (qf_draft).
// Included once, by qforward.cpp, inside its extern "C" block after the forward: one translation
// unit, so these calls use the forward's helpers (Team, Buffers, attention_block, mlp_block) as
// they are.
#pragma once

// One draft step of the EAGLE-3 head (head3.Eagle3Head) for T pairs written at its cache slots
// start..start+T-1, in one call: the hidden input (fc of the target's states side by side, or a
// fed-back output as it is), the layer (attention over [input_norm(embed(token));
// hidden_norm(hidden)], the residual stream the hidden state, normed first with
// norm_before_residual, then the MLP), the final norm, the draft LM head, log-softmax and each
// row's top k. Drafts need no exactness: this saves the torch calls a draft step otherwise makes.
//   tokens [T] target ids (< vocab); features [T, width], width = D or fc's input.
//   kc, vc: the head's cache [KV, cap, hd] in fp16. Slots before `committed` are visible to every
//   row; slots committed..start+T-1 follow tree [T, start + T - committed] (null: causal, start ==
//   committed).
//   g [T, D] out: the layer's output (before the final norm), what children feed back.
//   logp [T - lm_from, V_draft] out: log-probabilities of rows lm_from..T-1; top_vals, top_ids
//   [T - lm_from, k] out (k may be 0): the k best in order, ties to the lower index, ids as target
//   ids. Rows before lm_from run the layer only (absorbing a context reads its last row's).
// Returns 0; -1 when the slots exceed the cache, -2 for a token or width it cannot take or lm_from
// outside 0..T-1, -3 for a top k above TOPK_MAX, -4 for a head size attention does not take (head_dim_ok).
int qf_draft(const QDraft* m, const int64_t* tokens, const float* features, int width, int T, const float* cos,
             const float* sin, uint16_t* kc, uint16_t* vc, int cap, int committed, int start, const uint8_t* tree,
             float* g, float* logp, int k, float* top_vals, int64_t* top_ids, int lm_from, int threads) {
    const QHead3& ly = m->layer;
    const int D = ly.D, H = ly.H, KV = ly.KV, hd = ly.hd, F = ly.F, V = m->lm.N;
    if (!head_dim_ok(hd)) return -4;
    if (committed < 0 || start < committed || T < 1 || start + T > cap) return -1;
    const bool fc = width != D;
    if ((fc && (!m->fc.data || m->fc.K != width)) || k < 0 || k > V || lm_from < 0 || lm_from >= T) return -2;
    if (k > TOPK_MAX) return -3;
    for (int t = 0; t < T; ++t)
        if (tokens[t] < 0 || tokens[t] >= m->vocab) return -2;
    const int W = start + T - committed;
    std::vector<int> order(W);
    for (int j = 0; j < W; ++j) order[j] = j;
    std::vector<std::vector<int32_t>> slots;
    if (visible_slots(T, committed, W, tree, order, cap, slots) != 0) return -1;
    size_t longest = 0;
    for (const auto& r : slots) longest = std::max(longest, r.size());
    Buffers b(T, 2 * D, D, H, KV, hd, F);
    std::vector<float> hidden(fc ? (size_t)T * D : 0), hn((size_t)T * D);
    const float* hid = fc ? hidden.data() : features;
    QRows fc_in, lm_in;
    if (fc) fc_in.resize(T, width);
    lm_in.resize(T - lm_from, D);
    SpinBarrier meet;
#pragma omp parallel num_threads(threads) if (threads > 1)
    {
        Team tm{omp_get_thread_num(), omp_get_num_threads(), Clock(nullptr), {}};
        tm.bind(meet);
        int lo, hi;
        tm.share(T, 1, lo, hi);
        if (fc) {
            for (int t = lo; t < hi; ++t) quantise_row(features + (size_t)t * width, width, t, fc_in);
            tm.sync(OP_QUANTISE);
            matmul_share(tm, m->fc, fc_in, hidden.data(), false);
            tm.sync(OP_QKV);
        }
        for (int t = lo; t < hi; ++t) {  // h: [T, 2D] = [input_norm(emb) | hidden_norm(hidden)]
            float* ht = b.h.data() + (size_t)t * 2 * D;
            dequantise_row(m->embed, (int)tokens[t], ht + D);  // the row, then its norm in front of it
            rmsnorm_row(ht + D, ly.input_norm, ht, D, ly.eps);
            rmsnorm_row(hid + (size_t)t * D, ly.hidden_norm, hn.data() + (size_t)t * D, D, ly.eps);
            std::memcpy(ht + D, hn.data() + (size_t)t * D, sizeof(float) * D);
            quantise_row(ht, 2 * D, t, b.attn_in);
            std::memcpy(g + (size_t)t * D, ly.norm_before_residual ? hn.data() + (size_t)t * D : hid + (size_t)t * D,
                        sizeof(float) * D);
        }
        tm.sync(OP_QUANTISE);
        attention_block(tm, Attention{&ly.q, &ly.k, &ly.v, kc, vc}, b, T, H, KV, hd, cos, sin, cap, start, committed,
                        tree == nullptr && start == committed, slots, longest);
        mlp_block(tm, Mlp{&ly.o, &ly.gate, &ly.up, &ly.down, ly.post_norm}, b, g, T, D, F, ly.eps);
        int rlo, rhi;  // the rows that get log-probabilities, this thread's share
        tm.share(T - lm_from, 1, rlo, rhi);
        for (int r = rlo; r < rhi; ++r) {
            const size_t t = (size_t)(lm_from + r);
            rmsnorm_row(g + t * D, m->norm, b.h.data() + t * D, D, ly.eps);
            quantise_row(b.h.data() + t * D, D, r, lm_in);
        }
        tm.sync(OP_QUANTISE);
        matmul_share(tm, m->lm, lm_in, logp, false);
        tm.sync(OP_LM_HEAD);
        for (int r = rlo; r < rhi; ++r) {
            float* row = logp + (size_t)r * V;
            log_softmax_row(row, V);
            if (k) top_k_row(row, V, k, m->ids, top_vals + (size_t)r * k, top_ids + (size_t)r * k);
        }
    }
    return 0;
}
