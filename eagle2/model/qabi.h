// What crosses between the kernels and Python: the structs the exported calls take, and the numbers
// both sides share (the tree's top k and modes: tree_modes.py). qlib.py mirrors every struct in
// ctypes and checks its sizes, offsets and these numbers against qf_layout when it loads the library.
#pragma once

#include <cstdint>

#include "qblocks.h"

extern "C" {

struct QLayer {
    const float* attn_norm;  // [D]
    QMat q, k, v, o;
    const float* ffn_norm;   // [D]
    QMat gate, up, down;
};

struct QModel {
    int32_t D, H, KV, hd, F, L;
    float eps;
    int32_t vocab;
    const QLayer* layers;  // [L]
    const float* norm;     // [D] final norm
    QMat lm_head;
    QMat embed;            // [vocab, D] the token embedding's blocks (tied models: lm_head's)
};

struct QHead3 {  // the EAGLE-3 draft head's layer (Q8_0 matrices, q/k/v reading 2 x D)
    int32_t D, H, KV, hd, F, norm_before_residual;
    float eps;
    int32_t pad_;
    const float *input_norm, *hidden_norm, *post_norm;
    QMat q, k, v, o, gate, up, down;
};

struct QDraft {  // the EAGLE-3 draft head as one draft step runs it
    QHead3 layer;
    QMat fc;               // [D, width]: the target's states side by side to D (data null: none)
    QMat embed;            // [vocab, D] the token embedding's blocks (the target's, when shared)
    const float* norm;     // [D] the final norm
    QMat lm;               // [V_draft, D] the draft vocabulary's LM head
    const int64_t* ids;    // [V_draft] each draft index's target id, or null (the same)
    int32_t vocab, pad_;
};

// How many children of each drafted node a tree call ranks (tree_modes.TREE_TOPK): a policy's top_k
// is at most this.
constexpr int QT_TOPK = 16;
// How a tree grows (QTreeIn.budget) and which N the auto budget verifies (QTreeIn.explore): the
// numbers of tree_modes.TreeBudget and tree_modes.Explore, which qf_layout lists.
enum TreeBudget : int32_t {
    BUDGET_EAGLE2 = 0,  // every beam node, depth levels, the total_tokens - 1 best kept
    BUDGET_AUTO = 1,    // the auto budget: width by rate each level, N by rate
    BUDGET_AUTO_N = 2,  // N by rate only
};
enum Explore : int32_t { EXPLORE_BEST = 0, EXPLORE_DOUBLE = 1, EXPLORE_HALF = 2 };

struct QTreeIn {  // one cycle's drafting (qf_draft_tree): the root's reading, the head's cache, the rule
    int64_t root;              // the root token
    const float* root_g;       // [D] the head's predicted feature at the root
    const float* root_vals;    // [n_root] the root's best children: log-probs, best first
    const int64_t* root_ids;   // [n_root] their target ids
    int32_t n_root, top_k, depth, total_tokens;  // top_k <= QT_TOPK
    int32_t committed, base_pos;  // the head cache's committed length (the first tree slot), the root pair's position
    int32_t cap, rope_rows;    // the head cache's slots, its RoPE tables' rows
    uint16_t *kc, *vc;         // the head's cache [KV, cap, hd] in fp16
    const float *cos, *sin;    // the head's RoPE tables [rope_rows, hd]
    int32_t budget;            // a TreeBudget
    int32_t explore_depth;     // the budget: one call at least below the root's children this cycle
    int32_t explore;           // an Explore: the budget verifies the best N, twice it or half of it
    int32_t max_width;         // prices has max_width + 1 entries
    double call_guess;         // a call's price before any was measured
    double odds;               // the acceptance odds' multiplier calibrating node values (1: none)
    const double* tn;          // [total_tokens] t(N) in seconds, N = 1, 2, ...
    const double* rank_prob;   // [top_k] a child's draft probability by its rank
    const double* prices;      // [max_width + 1] a call's seconds by width (NaN: none seen)
    int32_t threads, pad_;
};

struct QTreeOut {  // the pool (index 0: the root) and what verification reads, in caller's arrays
    int32_t cap_nodes, cap_verify;  // the arrays' capacities
    int64_t* tokens;
    int32_t *parents, *depths, *ranks;
    float *logp, *values;
    int32_t* levels;
    uint8_t* kept;
    int32_t* beam;             // [cap_nodes] each level's beam nodes, one level after another
    double* rank_sum;          // [top_k] the draft probabilities of the children of rank r below the
    int32_t* rank_count;       // root's children, summed, and how many (what the budget learns from)
    int32_t* beam_len;         // [depth + 1] how many at each level
    double* level_s;           // [depth] the seconds each call below the root's children took (its
                               // choice, the head's step, its children ranked): the prices' lesson
    int32_t* order;            // [cap_verify] verify position -> pool index
    int32_t* parent_pos;       // [cap_verify] the parent's verify position (-1: the root)
    uint8_t* mask;             // [cap_verify, cap_verify] ancestors and self, row stride n_verify
    int32_t n, n_beams, draft_calls, n_verify, best_n, pad_;
    double expected;           // the budget's expected tokens at best_n (1 for EAGLE-2)
    double head_s;             // seconds in the draft head's steps (the rest of the call: the tree's work)
};

struct QCycleIn {  // one greedy cycle (qf_cycle) beyond its tree's QTreeIn: the target's side
    uint16_t *kc, *vc;         // the target's cache [L, KV, cap, hd] in fp16
    int32_t cap, committed;    // its slots, its committed length (the tree's rows go after it)
    const float *cos, *sin;    // the target's RoPE tables [rope_rows, hd]
    const int32_t* taps;       // [ntaps] the layers whose entering states the head reads
    int32_t rope_rows, ntaps;
    int32_t cap_rows;          // rows of each output array (at least the tree's cap_verify)
    int32_t threads;
};

struct QCycleOut {  // what one greedy cycle leaves, in the caller's arrays
    float* x;                  // [cap_rows, D] the verified rows' post-norm features
    float* aux;                // [cap_rows, ntaps D] the states the head reads (null when ntaps is 0)
    float* logits;             // [cap_rows, vocab] every verified row's
    int64_t* best;             // [cap_rows] each verified row's argmax
    int32_t* path;             // [cap_rows] the accepted verify positions, root excluded
    float* g;                  // [cap_rows, D] the head's outputs for the pairs it absorbed (the last: the root's)
    float* logp;               // [V_draft] the last pair's log-probs: the next root's children
    float* top_vals;           // [QT_TOPK] their best, best first
    int64_t* top_ids;          // [QT_TOPK] as target ids
    int64_t bonus;             // the target's token after the path: the next root
    int32_t n_path;            // accepted nodes
    int32_t stage;             // which call a nonzero return came from (a CycleStage)
    double tree_s, forward_s, accept_s, commit_s, absorb_s;  // the seconds of each part
};

// Which part of qf_cycle returned a nonzero code (QCycleOut.stage; tree_modes.CycleStage).
enum CycleStage : int32_t { STAGE_NONE = 0, STAGE_TREE = 1, STAGE_FORWARD = 2, STAGE_ABSORB = 3, STAGE_CYCLE = 4 };

}  // extern "C"
