// The checked boundary (qf_layout): the structs' sizes and field offsets and the shared numbers,
// which qlib.py compares with its ctypes mirror when it loads the library.
// Included once, by qforward.cpp, inside its extern "C" block.
#pragma once

// The structs' sizes and field offsets, and the constants the Python side shares (tree_modes.py,
// qlib.TOPK_MAX), "name=value;..." (qlib.py compares its mirrors with them when it loads
// the library).
const char* qf_layout() {
    static const std::string s = [] {
        std::string o;
        auto add = [&](const char* name, size_t v) { o += std::string(name) + "=" + std::to_string(v) + ";"; };
#define QF_SIZE(S) add(#S, sizeof(S))
#define QF_AT(S, F) add(#S "." #F, offsetof(S, F))
        QF_SIZE(QMat), QF_AT(QMat, data), QF_AT(QMat, bias), QF_AT(QMat, N), QF_AT(QMat, type);
        QF_SIZE(QLayer), QF_AT(QLayer, q), QF_AT(QLayer, ffn_norm), QF_AT(QLayer, down);
        QF_SIZE(QModel), QF_AT(QModel, eps), QF_AT(QModel, vocab), QF_AT(QModel, layers), QF_AT(QModel, lm_head);
        QF_AT(QModel, embed);
        QF_SIZE(QHead3), QF_AT(QHead3, input_norm), QF_AT(QHead3, q), QF_AT(QHead3, down);
        QF_SIZE(QDraft), QF_AT(QDraft, fc), QF_AT(QDraft, embed), QF_AT(QDraft, lm), QF_AT(QDraft, ids);
        QF_AT(QDraft, vocab);
        QF_SIZE(QTreeIn), QF_AT(QTreeIn, committed), QF_AT(QTreeIn, kc), QF_AT(QTreeIn, budget);
        QF_AT(QTreeIn, call_guess), QF_AT(QTreeIn, odds), QF_AT(QTreeIn, tn), QF_AT(QTreeIn, prices);
        QF_AT(QTreeIn, threads);
        QF_SIZE(QTreeOut), QF_AT(QTreeOut, tokens), QF_AT(QTreeOut, beam), QF_AT(QTreeOut, rank_count);
        QF_AT(QTreeOut, level_s), QF_AT(QTreeOut, order);
        QF_AT(QTreeOut, n), QF_AT(QTreeOut, expected);
        QF_SIZE(QCycleIn), QF_AT(QCycleIn, cap), QF_AT(QCycleIn, cos), QF_AT(QCycleIn, taps);
        QF_AT(QCycleIn, rope_rows), QF_AT(QCycleIn, threads);
        QF_SIZE(QCycleOut), QF_AT(QCycleOut, aux), QF_AT(QCycleOut, top_ids), QF_AT(QCycleOut, bonus);
        QF_AT(QCycleOut, stage), QF_AT(QCycleOut, tree_s), QF_AT(QCycleOut, absorb_s);
        add("const.TOPK_MAX", TOPK_MAX), add("const.QT_TOPK", QT_TOPK);
        add("const.BUDGET_EAGLE2", BUDGET_EAGLE2), add("const.BUDGET_AUTO", BUDGET_AUTO);
        add("const.BUDGET_AUTO_N", BUDGET_AUTO_N), add("const.EXPLORE_BEST", EXPLORE_BEST);
        add("const.EXPLORE_DOUBLE", EXPLORE_DOUBLE), add("const.EXPLORE_HALF", EXPLORE_HALF);
        add("const.STAGE_NONE", STAGE_NONE), add("const.STAGE_TREE", STAGE_TREE);
        add("const.STAGE_FORWARD", STAGE_FORWARD), add("const.STAGE_ABSORB", STAGE_ABSORB);
        add("const.STAGE_CYCLE", STAGE_CYCLE);
#undef QF_AT
#undef QF_SIZE
        return o;
    }();
    return s.c_str();
}
