// A whole greedy cycle in one call (qf_cycle).
// Included once, by qforward.cpp, inside its extern "C" block after the draft step and the tree:
// one translation unit, so the cycle calls qf_draft_tree, qf_forward and qf_draft as they are.
#pragma once

// One greedy speculative cycle (decoding/decoder.py's Decoder.speculate, its greedy path on the
// kernels) without Python between its parts: the tree drafted under the root (qf_draft_tree, with
// `tin` and into `tout` exactly as that call alone), its verified rows laid out for the target (the
// tokens in verify order, each at the committed length plus its depth, the tree's mask), the target's
// forward over them with each row's argmax (qf_forward), the path the argmaxes accept walked from the
// root (cycle/verify.greedy: at each node the child equal to its argmax; the first miss gives the
// bonus), the root's and the path's K/V kept at the committed end of the target's cache
// (qt::commit_rows), and the draft head fed the accepted pairs (each kept row's tapped states with
// the token after it, the bonus last) at its committed slots (qf_draft, the last row's top
// QT_TOPK): the reading the next cycle's tree starts from. The same calls in the same order as
// the cycle made one at a time, so the same bits. The caller advances both caches' lengths by
// 1 + n_path. Returns 0; else the failing part's own code (out->stage says which part: a
// CycleStage) before anything of that part ran, or -1 (STAGE_CYCLE) when the output arrays or a
// cache cannot hold what the tree asks.
int qf_cycle(const QModel* md, const QDraft* head, const QTreeIn* tin, QTreeOut* tout, const QCycleIn* in,
             QCycleOut* out) {
    using clock = std::chrono::steady_clock;
    auto secs = [](clock::time_point a, clock::time_point b) { return std::chrono::duration<double>(b - a).count(); };
    out->stage = STAGE_NONE, out->n_path = 0, out->bonus = -1;
    out->tree_s = out->forward_s = out->accept_s = out->commit_s = out->absorb_s = 0;
    const auto t0 = clock::now();
    int rc = qf_draft_tree(head, tin, tout);
    if (rc != 0) return out->stage = STAGE_TREE, rc;
    const auto t1 = clock::now();
    out->tree_s = secs(t0, t1);

    // the verification's inputs, as TreeArrays.layout lays them out
    const int T = tout->n_verify, L = in->committed, D = md->D;
    if (T < 1 || T > in->cap_rows || L + T > in->cap) return out->stage = STAGE_CYCLE, -1;
    std::vector<int64_t> toks(T), pos(T);
    for (int i = 0; i < T; ++i) {
        const int node = tout->order[i];
        toks[i] = tout->tokens[node], pos[i] = (int64_t)L + tout->depths[node];
    }
    rc = qf_forward(md, toks.data(), out->x, T, in->cos, in->sin, in->rope_rows, in->kc, in->vc, in->cap, L, pos.data(),
                    T > 1 ? tout->mask : nullptr, in->taps, in->ntaps, out->aux, out->logits, out->best, in->threads,
                    nullptr);
    if (rc != 0) return out->stage = STAGE_FORWARD, rc;
    const auto t2 = clock::now();
    out->forward_s = secs(t1, t2);

    // greedy acceptance: children are distinct tokens, so the path is unique
    int node = 0, n_path = 0;
    for (;;) {
        const int64_t want = out->best[node];
        int next = -1;
        for (int c = node + 1; c < T; ++c)
            if (tout->parent_pos[c] == node && toks[c] == want) {
                next = c;
                break;
            }
        if (next < 0) break;
        out->path[n_path++] = next;
        node = next;
    }
    out->n_path = n_path, out->bonus = out->best[node];
    const auto t3 = clock::now();
    out->accept_s = secs(t2, t3);
    const int n = 1 + n_path, width = in->ntaps ? in->ntaps * D : D, hc = tin->committed, hd = head->layer.hd;
    if (hc + n > tin->cap || hc + n > tin->rope_rows) return out->stage = STAGE_CYCLE, -1;  // before any commit

    // the root's and the path's K/V kept (verify positions ascend along a path)
    std::vector<int64_t> slots(n);
    slots[0] = L;
    for (int i = 0; i < n_path; ++i) slots[1 + i] = (int64_t)L + out->path[i];
    const int64_t planes = (int64_t)md->L * md->KV;
    const int row_bytes = md->hd * (int)sizeof(uint16_t);
    qt::commit_rows((uint8_t*)in->kc, planes, in->cap, row_bytes, L, slots.data(), n);
    qt::commit_rows((uint8_t*)in->vc, planes, in->cap, row_bytes, L, slots.data(), n);
    const auto t4 = clock::now();
    out->commit_s = secs(t3, t4);

    // the head absorbs the kept rows' states, each beside the token after it (Decoder.absorbed)
    const float* states = in->ntaps ? out->aux : out->x;
    std::vector<float> feats((size_t)n * width);
    std::vector<int64_t> pairs(n);
    for (int i = 0; i < n; ++i) {
        const int row = i == 0 ? 0 : out->path[i - 1];
        std::memcpy(feats.data() + (size_t)i * width, states + (size_t)row * width, sizeof(float) * width);
        pairs[i] = i < n_path ? toks[out->path[i]] : out->bonus;
    }
    const int k = std::min(QT_TOPK, head->lm.N);
    rc = qf_draft(head, pairs.data(), feats.data(), width, n, tin->cos + (size_t)hc * hd, tin->sin + (size_t)hc * hd,
                  tin->kc, tin->vc, tin->cap, hc, hc, nullptr, out->g, out->logp, k, out->top_vals, out->top_ids,
                  n - 1, in->threads);
    if (rc != 0) return out->stage = STAGE_ABSORB, rc;
    out->absorb_s = secs(t4, clock::now());
    return 0;
}
