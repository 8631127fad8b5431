// A cycle's drafting in one call (qf_draft_tree: EAGLE-2's levels, the auto budget's choices, the
// rerank and the verification's layout), the budget's width rule on given values (qf_best_width)
// and the accepted nodes' K/V kept (qf_commit).
// Included once, by qforward.cpp, inside its extern "C" block after the forward: one translation
// unit, so these calls use the forward's helpers (Team, Buffers, attention_block, mlp_block) as
// they are.
#pragma once

// One cycle's draft tree in one call (policies/eagle2.py's EAGLE-2 and policies/auto.py's budget,
// the same decisions without Python between the draft calls). From the root's children (the head's
// reading, given), level by level: the budget (BUDGET_AUTO) weighs each width w of the beam by the
// tree's best expected tokens per second once a call of that width is paid (its price learnt per
// width in `prices`), EAGLE-2 (BUDGET_EAGLE2) and the N-only budget (BUDGET_AUTO_N) take the whole beam; qf_draft runs the
// chosen beam nodes (each sees the committed context, its ancestors and itself), their top_k
// children join the pool with path values, and the top_k best of the level are the next beam. Then
// the N verified: the total_tokens best (EAGLE-2) or the rate's best N, twice or half of it when the
// budget explores (EXPLORE_DOUBLE, EXPLORE_HALF); the rerank keeps the N-1 best nodes and the layout orders them for the
// target. The budget's choices are a function of its inputs and the head's outputs alone: the time a
// level's choice counts as spent is the prices' prediction for the calls chosen so far (the prices as
// they came in, read-only), never a clock; the seconds each level took are measured and returned
// (out->level_s) for the caller to learn the prices from. Returns 0; -3 when the arrays are too
// small or the arguments out of range, -4 for a head size attention does not take (head_dim_ok),
// before any work; else what qf_draft returned.
int qf_draft_tree(const QDraft* m, const QTreeIn* in, QTreeOut* out) {
    using clock = std::chrono::steady_clock;
    const int D = m->layer.D, hd = m->layer.hd, k = in->top_k;
    if (!head_dim_ok(hd)) return -4;
    if (k < 1 || k > QT_TOPK || in->depth < 0 || in->total_tokens < 1 || in->n_root < 0) return -3;
    const int kk = std::min(in->n_root, k);
    int n = 0;
    for (int r = 0; r < k; ++r) out->rank_sum[r] = 0, out->rank_count[r] = 0;
    auto add = [&](int64_t tok, int parent, int depth, int rank, float lp, float val, int level) {
        out->tokens[n] = tok, out->parents[n] = parent, out->depths[n] = depth, out->ranks[n] = rank;
        out->logp[n] = lp, out->values[n] = val, out->levels[n] = level;
        if (level >= 1 && rank < k) out->rank_sum[rank] += std::exp((double)lp), ++out->rank_count[rank];
        return n++;
    };
    if (1 + kk + (int64_t)in->depth * k * k > out->cap_nodes) return -3;
    add(in->root, -1, 0, 0, 0.f, 0.f, -1);
    std::vector<int> beam(kk), rows;
    std::vector<float> beam_vals(kk), beam_g((size_t)kk * D);
    std::vector<int> beam_slot(kk, -1);  // the head cache's tree slot of each beam node (-1: the root's pair)
    for (int j = 0; j < kk; ++j) {
        beam[j] = add(in->root_ids[j], 0, 1, j, in->root_vals[j], in->root_vals[j], 0);
        beam_vals[j] = in->root_vals[j];
        std::memcpy(beam_g.data() + (size_t)j * D, in->root_g, sizeof(float) * D);
    }
    int nb_out = 0, n_beams = 0;
    auto push_beam = [&] {
        for (int b : beam) out->beam[nb_out++] = b;
        out->beam_len[n_beams++] = (int)beam.size();
    };
    push_beam();
    const qt::Prices prices{in->prices, in->max_width + 1};
    double spent = 0, head_s = 0;  // the calls' predicted seconds so far (what the budget reads), the head's measured
    auto level_t0 = clock::now();
    int width = 0, used = 0, calls = 1;  // the root's call already ran
    const int max_slots = in->depth * k;
    std::vector<uint8_t> anc((size_t)max_slots * max_slots), tree;
    std::vector<float> g((size_t)k * D), top_v((size_t)k * QT_TOPK), cs((size_t)k * hd), sn((size_t)k * hd);
    std::vector<int64_t> top_i((size_t)k * QT_TOPK), toks(k);
    const int V = m->lm.N;
    // the draft's log-probs [k, V], which the tree reads only through each row's top k: one buffer
    // per calling thread, kept (a fresh half-megabyte each call cost its page faults every cycle)
    static thread_local std::vector<float> lp;
    if (lp.size() < (size_t)k * V) lp.resize((size_t)k * V);
    // the pool's values as acceptance estimates (calibrated), best first
    auto pool_desc = [&] {
        std::vector<double> v(n - 1);
        for (int i = 1; i < n; ++i) v[i - 1] = qt::calibrated(std::exp((double)out->values[i]), in->odds);
        std::sort(v.begin(), v.end(), std::greater<double>());
        return v;
    };
    auto level_done = [&] {  // the seconds since the last level's choice, that level's call's
        const auto t = clock::now();
        if (width) out->level_s[calls - 2] = std::chrono::duration<double>(t - level_t0).count();
        level_t0 = t;
    };
    auto choose_width = [&](int level) {  // AutoBudgetPolicy.expand_width
        level_done();
        const int nb = (int)beam.size();
        if (in->budget != BUDGET_AUTO) return width = nb;
        std::vector<double> beam_p(nb);
        for (int r = 0; r < nb; ++r) beam_p[r] = std::exp((double)beam_vals[r]);
        width = qt::best_width(pool_desc(), beam_p.data(), nb, in->rank_prob, k, in->odds, spent, prices,
                               in->call_guess, in->tn, in->total_tokens);
        if (width == 0 && in->explore_depth && level == 1) width = 1;
        if (width) spent += prices.price(width, in->call_guess);
        return width;
    };
    for (int level = 1; level <= in->depth; ++level) {
        const int w = choose_width(level);
        if (w == 0) break;
        if (w < (int)beam.size()) {  // the w best of the beam (it is in value order)
            beam.resize(w), beam_vals.resize(w), beam_slot.resize(w);
            nb_out -= out->beam_len[n_beams - 1] - w;
            out->beam_len[n_beams - 1] = w;
        }
        const int s0 = used;
        tree.assign((size_t)w * (s0 + w), 0);
        for (int j = 0; j < w; ++j) {
            const int node = beam[j], ps = beam_slot[j], pos = in->base_pos + out->depths[node];
            if (pos < 0 || pos >= in->rope_rows) return -2;
            toks[j] = out->tokens[node];
            std::memcpy(cs.data() + (size_t)j * hd, in->cos + (size_t)pos * hd, sizeof(float) * hd);
            std::memcpy(sn.data() + (size_t)j * hd, in->sin + (size_t)pos * hd, sizeof(float) * hd);
            uint8_t* a = anc.data() + (size_t)(s0 + j) * max_slots;
            if (ps >= 0) std::memcpy(a, anc.data() + (size_t)ps * max_slots, s0);
            a[s0 + j] = 1;
            std::memcpy(tree.data() + (size_t)j * (s0 + w), a, s0 + w);
        }
        const auto t_step = clock::now();
        const int rc = qf_draft(m, toks.data(), beam_g.data(), D, w, cs.data(), sn.data(), in->kc, in->vc, in->cap,
                                in->committed, in->committed + s0, tree.data(), g.data(), lp.data(), QT_TOPK,
                                top_v.data(), top_i.data(), 0, in->threads);
        head_s += std::chrono::duration<double>(clock::now() - t_step).count();
        if (rc != 0) return rc;
        used += w, ++calls;
        const int kc = std::min(k, V), first = n, depth = out->depths[beam[0]] + 1;
        for (int r = 0; r < w; ++r)
            for (int j = 0; j < kc; ++j) {
                const float cv = top_v[(size_t)r * QT_TOPK + j];
                add(top_i[(size_t)r * QT_TOPK + j], beam[r], depth, j, cv, beam_vals[r] + cv, level);
            }
        if (level == in->depth) break;
        // the next beam: the level's top_k children by value (ties: the earlier), parents' outputs
        const int nc = w * kc, nsel = std::min(k, nc);
        rows.resize(nc);
        for (int i = 0; i < nc; ++i) rows[i] = i;
        std::stable_sort(rows.begin(), rows.end(),
                         [&](int a, int b) { return out->values[first + a] > out->values[first + b]; });
        std::vector<float> next_g((size_t)nsel * D);
        beam.resize(nsel), beam_vals.resize(nsel), beam_slot.resize(nsel);
        for (int i = 0; i < nsel; ++i) {
            const int c = rows[i], r = c / kc;
            beam[i] = first + c, beam_vals[i] = out->values[first + c], beam_slot[i] = s0 + r;
            std::memcpy(next_g.data() + (size_t)i * D, g.data() + (size_t)r * D, sizeof(float) * D);
        }
        beam_g.swap(next_g);
        push_beam();
    }
    out->n = n, out->n_beams = n_beams, out->draft_calls = calls, out->head_s = head_s;
    int keep_n = in->total_tokens;
    out->best_n = keep_n, out->expected = 1.0;
    level_done();
    if (in->budget != BUDGET_EAGLE2) {  // AutoBudgetPolicy.keep: the N of the best rate (explored around)
        double rate;
        const int best_n = qt::best_rate(pool_desc(), spent, in->tn, in->total_tokens, &rate);
        keep_n = in->explore == EXPLORE_DOUBLE ? std::min({in->total_tokens, n, std::max(2, 2 * best_n)})
                 : in->explore == EXPLORE_HALF ? std::max(1, best_n / 2) : best_n;
        out->best_n = best_n, out->expected = rate * (spent + in->tn[best_n - 1]);
    }
    qt::rerank(n, out->values, out->depths, out->parents, keep_n, out->kept);
    out->n_verify = qt::layout(n, out->kept, out->depths, out->parents, out->order, out->parent_pos, out->mask,
                               out->cap_verify);
    return out->n_verify < 0 ? -3 : 0;
}

// qt::best_width on given values (the tests hold it to auto.best_rates): pool [n_pool] best first
// (calibrated already), beam [nb] (probabilities), rank_prob [k], odds (the calibration), prices
// [n_prices] by width (NaN: none), tn [max_n].
int qf_best_width(const double* pool, int n_pool, const double* beam, int nb, const double* rank_prob, int k,
                  double odds, double spent, const double* prices, int n_prices, double call_guess, const double* tn,
                  int max_n) {
    const qt::Prices p{prices, n_prices};
    return qt::best_width(std::vector<double>(pool, pool + n_pool), beam, nb, rank_prob, k, odds, spent, p, call_guess,
                          tn, max_n);
}

// The accepted nodes' K/V kept in a cache of `planes` planes [cap, row_bytes] (qt::commit_rows).
// Returns -1 for slots out of order or outside the cache.
int qf_commit(void* k, void* v, int64_t planes, int cap, int row_bytes, int length, const int64_t* slots, int n) {
    for (int i = 0; i < n; ++i)
        if (slots[i] < length + i || slots[i] >= cap || (i && slots[i] <= slots[i - 1])) return -1;
    qt::commit_rows((uint8_t*)k, planes, cap, row_bytes, length, slots, n);
    qt::commit_rows((uint8_t*)v, planes, cap, row_bytes, length, slots, n);
    return 0;
}
