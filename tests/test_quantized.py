"""The q4_1 forward (model/quantized.py + qforward.cpp): weights in their GGUF blocks, integer dot
products, and identity by construction.

1. Blocks: ggml's Q4_1 / Q8_0 of fp32 rows round-trip within a block's step, the kernels' matmul
   equals x @ dequantised(W)^T up to the activations' own int8 rounding, and every instruction
   set this CPU has gives the same bits.
2. Row invariance, bitwise: one token alone against the same token as row k of N = 2-16 rows, and
   a tree row against plain decoding's row for the same token; on the tiny model and the real one.
3. Greedy identity of every lossless policy in this precision; sampling keeps its distribution
   (chi-square on the tiny model, in q4_1).
4. The embedded model's blocks are the GGUF's own: dequantised, they are the fp32 weights exactly.
5. Bad input: a model the kernels cannot take, a GGUF type they do not read, a CPU without AVX2.
"""
from __future__ import annotations

import ctypes
import logging
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest
import torch

from eagle2.cycle.sampling import SamplingParams
from eagle2.decoding.decoder import Decoder
from eagle2.errors import UserError
from eagle2.model import quantized as Q
from eagle2.model import qblocks
from eagle2.model import qbuild
from eagle2.model import qlib
from eagle2.model.loading import load_bundle
from lossless_cases import greedy_tokens

pytestmark = pytest.mark.skipif(qlib.cpu_problem() is not None, reason="the q4_1 kernels need AVX2")



@pytest.fixture(scope="module")
def tiny_q4(tiny_target):
    """A tiny Llama (vocab 97: the LM head's last group of 8 outputs is partial) in q4_1, random head."""
    folder, _ = tiny_target("q4", vocab=97, hidden=64, layers=2, heads=4, kv_heads=2, inter=128, weight_std=0.3)
    b = load_bundle(str(folder), "random", dtype="q4_1")
    assert b.precision == "q4_1" and isinstance(b.forward, Q.KernelTarget) and b.target is None
    return b


def _matmul(lib, cmat, x: torch.Tensor, n: int) -> torch.Tensor:
    y = torch.empty(x.shape[0], n)
    lib.qf_matmul(ctypes.byref(cmat), ctypes.c_void_p(x.data_ptr()), x.shape[0], ctypes.c_void_p(y.data_ptr()), 2)
    return y


def _has(flag: str) -> bool:
    try:
        return flag in open("/proc/cpuinfo").read().split()
    except OSError:
        return False


# ------------------------------------------------------------------ 1. blocks and kernels
def test_ggml_blocks_round_trip_within_a_step():
    w = torch.randn(24, 96) * 0.2
    q4, q8 = qblocks.quantise_q4_1(w), qblocks.quantise_q8_0(w)
    step4 = (q4.d.repeat_interleave(32, 1))
    assert ((q4.dequantised() - w).abs() <= 0.5 * step4 + 2e-3 * w.abs().max()).all()
    assert ((q8.dequantised() - w).abs() <= 0.5 * q8.d.repeat_interleave(32, 1) + 1e-3 * w.abs().max()).all()
    assert int(q4.values().max()) <= 15 and int(q8.values().abs().max()) <= 127


@pytest.mark.parametrize("kind", ["q4_1", "q8_0"])
@pytest.mark.parametrize("n", [8, 13, 40])
def test_the_kernels_multiply_by_the_blocks_values(tiny_q4, kind, n):
    lib = tiny_q4.forward.lib
    w = torch.randn(n, 64) * 0.3
    m = qblocks.quantise_q4_1(w) if kind == "q4_1" else qblocks.quantise_q8_0(w)
    keep: list = []
    cm = qlib.cmat_of(m, keep)
    x = torch.randn(7, 64)
    y = _matmul(lib, cm, x, n)
    ref = x @ m.dequantised().T
    assert ((y - ref).norm() / ref.norm()).item() < 0.02  # only the activations' int8 rounding


def _isas(lib) -> list[int]:
    return [i for i in qlib.ISAS if lib.qf_supports(i)]


def _reference(lib, cmat, x: torch.Tensor, n: int) -> torch.Tensor:
    y = torch.empty(x.shape[0], n)
    lib.qf_matmul_ref(ctypes.byref(cmat), x.data_ptr(), x.shape[0], y.data_ptr())
    return y


@pytest.mark.parametrize("n", [40, 61, 200])
def test_every_instruction_set_equals_the_scalar_reference_bit_for_bit(tiny_q4, n):
    """Each kernel (forced in turn) against qf_matmul_ref, plain C++: Q4_1 and Q8_0, with a bias, a
    partial last group, and 1-19 rows (every tile shape and its remainders), at 1 and 2 threads."""
    lib = tiny_q4.forward.lib
    best = lib.qf_isa()
    g = torch.Generator().manual_seed(n)
    w = torch.randn(n, 96, generator=g)
    keep: list = []
    q4 = qblocks.quantise_q4_1(w)
    q4.bias = torch.randn(n, generator=g)
    mats = [qlib.cmat_of(q4, keep), qlib.cmat_of(qblocks.quantise_q8_0(w), keep)]
    try:
        for rows in (1, 2, 3, 4, 5, 7, 8, 9, 13, 16, 19):
            x = torch.randn(rows, 96, generator=g) * 3
            refs = [_reference(lib, c, x, n) for c in mats]
            for i in _isas(lib):
                lib.qf_set_isa(i)
                for threads in (1, 2):
                    for c, ref in zip(mats, refs):
                        y = torch.empty(rows, n)
                        lib.qf_matmul(ctypes.byref(c), x.data_ptr(), rows, y.data_ptr(), threads)
                        assert torch.equal(y, ref), f"{qlib.ISAS[i]}, {rows} rows, {threads} threads"
    finally:
        lib.qf_set_isa(best)


def _after(fwd, prompt: list[int], room: int):
    """A cache of `fwd` holding `prompt` committed, with `room` free slots after it."""
    c = fwd.new_cache(len(prompt) + room)
    fwd.prefill(c, torch.tensor(prompt), torch.arange(len(prompt)))
    c.advance(len(prompt))
    return c


def _logits_everywhere(target, prompt: list[int], extra: list[int]) -> dict:
    """The logits of a causal forward of `extra` after `prompt`, for every instruction set, 1 and
    2 threads, and the matmuls and attention reading ahead or not (qf_set_prefetch, qf_set_kv_prefetch)."""
    lib, best, ahead, out = target.lib, target.lib.qf_isa(), target.lib.qf_prefetch(), {}
    kv_ahead = lib.qf_kv_prefetch()
    assert ahead > 0 and kv_ahead > 0, "the kernels read ahead by default"
    try:
        for i in _isas(lib):
            lib.qf_set_isa(i)
            for threads, prefetch in ((1, ahead), (2, ahead), (2, 0), (1, 64)):
                assert lib.qf_set_prefetch(prefetch) == 0
                assert lib.qf_set_kv_prefetch(kv_ahead if prefetch == ahead else min(prefetch, 3)) == 0
                with _threads(threads):
                    c = _after(target, prompt, len(extra) + 4)
                    T = len(extra)
                    _, logits = target.verify(c, torch.tensor(extra), torch.arange(len(prompt), len(prompt) + T),
                                              torch.ones(T, T, dtype=torch.bool).tril())
                    out[(qlib.ISAS[i], threads, prefetch)] = logits
    finally:
        lib.qf_set_isa(best)
        lib.qf_set_prefetch(ahead)
        lib.qf_set_kv_prefetch(kv_ahead)
    assert lib.qf_set_prefetch(-1) == -1 and lib.qf_prefetch() == ahead, "a negative distance is refused"
    assert lib.qf_set_kv_prefetch(-1) == -1 and lib.qf_kv_prefetch() == kv_ahead, "a negative count is refused"
    return out


class _threads:
    def __init__(self, n):
        self.n = n

    def __enter__(self):
        self.old = torch.get_num_threads()
        torch.set_num_threads(self.n)

    def __exit__(self, *exc):
        torch.set_num_threads(self.old)


def test_a_forward_is_the_same_bits_on_every_path_and_thread_count_tiny(tiny_q4):
    """A trace replays token for token on another x86 CPU: the logits do not depend on the
    instruction set the dot products use, the thread count, nor how far ahead the weights are read."""
    outs = _logits_everywhere(tiny_q4.forward, [5, 9, 13, 2, 7, 1, 40, 3, 3], [8, 21, 4, 60, 11])
    first = next(iter(outs.values()))
    for key, logits in outs.items():
        assert torch.equal(logits, first), key


def test_forwards_from_many_threads_at_once_are_the_same_bits_tiny(tiny_q4):
    """A server calls the kernels from many Python threads, each with an OpenMP team of its own:
    four of them at once, 2 kernel threads each on this machine's CPUs (the teams' barriers spin,
    then yield to a descheduled member), and every forward gives the logits it gives alone, every
    thread done within a bounded wait."""
    fwd, prompt, extra = tiny_q4.forward, [5, 9, 13, 2, 7, 1, 40, 3, 3], [8, 21, 4, 60, 11]
    T = len(extra)

    def logits_of(n_extra: int) -> torch.Tensor:
        c = _after(fwd, prompt, T + 4)
        _, logits = fwd.verify(c, torch.tensor(extra[:n_extra]), torch.arange(len(prompt), len(prompt) + n_extra),
                               torch.ones(n_extra, n_extra, dtype=torch.bool).tril())
        return logits

    with _threads(2):
        alone = {n: logits_of(n) for n in range(1, T + 1)}

        def worker(i: int) -> None:
            for k in range(12):
                n = 1 + (i + k) % T
                assert torch.equal(logits_of(n), alone[n]), f"thread {i}, {n} rows"

        with ThreadPoolExecutor(4) as pool:
            for f in [pool.submit(worker, i) for i in range(4)]:
                f.result(timeout=120)


def test_the_library_checks_its_layout_and_says_where_it_differs(tiny_q4, monkeypatch):
    """qlib.py's ctypes mirror against the library's own sizes and offsets: a field out of place
    is one clear line at load, not a wrong read later."""
    lib = tiny_q4.forward.lib
    assert qlib.layout_problem(lib) is None

    class Shifted(ctypes.Structure):  # one field too many in front: every offset moves
        _fields_ = [("extra", ctypes.c_int64)] + qlib.CMat._fields_
    monkeypatch.setitem(qlib.MIRRORED, "QMat", Shifted)
    problem = qlib.layout_problem(lib)
    assert problem == "QMat is 32 in the library and 40 in qlib.py"
    with pytest.raises(RuntimeError, match="does not match qlib.py: QMat"):
        qlib.declare(lib)


def test_each_exports_return_codes_are_one_table():
    """A code an export defines raises its exception with its line; one it does not define is named."""
    from eagle2.errors import UserError
    qlib.check_code("qf_draft", 0, qlib.DRAFT_CODES)
    with pytest.raises(ValueError, match=r"^the draft head's step ranks at most 1024 candidates a row \(asked 2000\)$"):
        qlib.check_code("qf_draft", -3, qlib.DRAFT_CODES, topk_max=qlib.TOPK_MAX, k=2000, head_size="")
    with pytest.raises(UserError, match="outside its vocabulary"):
        qlib.check_code("qf_draft_tree", -2, qlib.TREE_CODES)
    with pytest.raises(RuntimeError, match="^qf_forward returned -9, a code it does not define$"):
        qlib.check_code("qf_forward", -9, qlib.FORWARD_CODES)
    for codes in (qlib.FORWARD_CODES, qlib.DRAFT_CODES, qlib.TREE_CODES):
        assert sorted(codes) == [-4, -3, -2, -1]


def test_the_library_checks_the_numbers_both_sides_share(tiny_q4, monkeypatch):
    """tree_modes' modes and the top-k bounds against the library's: every one is listed, and one
    that differs is named at load."""
    from eagle2.model.tree_modes import Explore, TreeBudget
    lib = tiny_q4.forward.lib
    listed = {n.removeprefix("const."): int(v) for n, v in (i.split("=") for i in lib.qf_layout().decode().strip(";").split(";"))
              if n.startswith("const.")}
    assert listed == qlib.SHARED_CONSTANTS and listed["BUDGET_AUTO"] == TreeBudget.AUTO == 1
    assert listed["EXPLORE_HALF"] == Explore.HALF and listed["QT_TOPK"] == 16
    monkeypatch.setitem(qlib.SHARED_CONSTANTS, "QT_TOPK", 32)
    assert qlib.layout_problem(lib) == "QT_TOPK is 16 in the library and 32 in the Python side"


# ------------------------------------------------------------------ 2. row invariance
def _rows_alone_and_batched(target, prompt: list[int], extra: list[int]):
    """(each extra token run alone after the prompt, as plain decoding does; the same tokens as rows
    of one causal forward) -> (features, logits) of both."""
    c1 = _after(target, prompt, len(extra) + 8)
    alone = []
    for i, t in enumerate(extra):
        alone.append(target.verify(c1, torch.tensor([t]), torch.tensor([len(prompt) + i])))
        c1.advance(1)
    alone = tuple(torch.cat(parts) for parts in zip(*alone))
    c2 = _after(target, prompt, len(extra) + 8)
    T = len(extra)
    together = target.verify(c2, torch.tensor(extra), torch.arange(len(prompt), len(prompt) + T),
                             torch.ones(T, T, dtype=torch.bool).tril())
    return alone, together


def _tree_row_against_plain(target, prompt: list[int], path: list[int], noise: list[int]):
    """A tree whose nodes are `path` (a chain from the root) with `noise` siblings interleaved at
    every level: the deepest path node's row against plain decoding of the same tokens."""
    tokens, parents = [], []
    prev = -1
    for i, t in enumerate(path):
        tokens.append(noise[i % len(noise)])  # a sibling first: the path's rows are not contiguous
        parents.append(prev)
        tokens.append(t)
        parents.append(prev)
        prev = len(tokens) - 1
    T = len(tokens)
    mask = torch.zeros(T, T, dtype=torch.bool)
    depth = []
    for j in range(T):
        k, d = j, 0
        while k >= 0:
            mask[j, k] = True
            k, d = parents[k], d + 1
        depth.append(d - 1)
    L = len(prompt)
    c = _after(target, prompt, T + 8)
    tree, _ = target.verify(c, torch.tensor(tokens), torch.tensor([L + d for d in depth]), mask)
    (alone, _), _ = _rows_alone_and_batched(target, prompt, path)
    return tree[prev], alone[-1]


def test_a_row_is_the_same_bits_alone_or_in_a_batch_tiny(tiny_q4):
    g = torch.Generator().manual_seed(0)
    for n in (2, 3, 5, 8, 16):
        prompt = torch.randint(1, 97, (9,), generator=g).tolist()
        extra = torch.randint(1, 97, (n,), generator=g).tolist()
        (fa, la), (fb, lb) = _rows_alone_and_batched(tiny_q4.forward, prompt, extra)
        assert torch.equal(fa, fb) and torch.equal(la, lb), f"N={n}"
    for depth in (1, 2, 3, 5):
        prompt = torch.randint(1, 97, (7,), generator=g).tolist()
        path = torch.randint(1, 97, (depth,), generator=g).tolist()
        tree_row, plain_row = _tree_row_against_plain(tiny_q4.forward, prompt, path, [3, 11, 50])
        assert torch.equal(tree_row, plain_row), f"depth {depth}"


def _prefill_against_one_at_a_time(target, prompt: list[int], head: int):
    """(a causal prefill of the whole prompt; the first `head` tokens prefilled, then each later one
    alone as plain decoding runs it) -> (features, the last row's logits) of both, and both caches."""
    P = len(prompt)
    c1 = target.new_cache(P + 4)
    feats, logits = target.prefill(c1, torch.tensor(prompt), torch.arange(P))
    c2 = target.new_cache(P + 4)
    rows = [target.prefill(c2, torch.tensor(prompt[:head]), torch.arange(head))[0]]
    c2.advance(head)
    for i in range(head, P):
        f, lg = target.verify(c2, torch.tensor([prompt[i]]), torch.tensor([i]))
        rows.append(f)
        c2.advance(1)
    return (feats, logits), (torch.cat(rows), lg[-1]), (c1, c2)


def test_a_long_prefill_is_the_same_bits_as_its_rows_one_at_a_time_tiny(tiny_q4):
    """A prefill runs its attention in blocks of rows, each block sharing the keys before its first
    row (read once for the block): every row, and the K/V it leaves, are the bits that row gets
    decoded alone, at 1 and 2 threads and on every instruction set."""
    g = torch.Generator().manual_seed(3)
    prompt = torch.randint(1, 97, (150,), generator=g).tolist()
    lib, best = tiny_q4.forward.lib, tiny_q4.forward.lib.qf_isa()
    try:
        for i in _isas(lib):
            lib.qf_set_isa(i)
            for threads in (1, 2):
                with _threads(threads):
                    (fa, la), (fb, lb), (c1, c2) = _prefill_against_one_at_a_time(tiny_q4.forward, prompt, 3)
                    where = f"{qlib.ISAS[i]}, {threads} threads"
                    assert torch.equal(fa, fb) and torch.equal(la, lb), where
                    n = len(prompt)
                    assert torch.equal(c1.k[..., :n, :], c2.k[..., :n, :]), where
                    assert torch.equal(c1.v[..., :n, :], c2.v[..., :n, :]), where
    finally:
        lib.qf_set_isa(best)


# ------------------------------------------------------------------ 3. identity and sampling
@pytest.mark.parametrize("policy,kw", [("eagle2", dict(total_tokens=10, depth=4, top_k=3)),
                                       ("static", {}), ("eagle2-auto", {}), ("dyspec", dict(total_tokens=8)),
                                       ("ddd", dict(total_tokens=8, depth=4, top_k=3, check_levels=(2, 3)))])
def test_greedy_identity_in_q4_1_tiny(tiny_q4, policy, kw):
    for prompt in ([1, 2, 3], [5, 4], [9, 9, 9, 1]):
        ref = greedy_tokens(tiny_q4, "plain", 30, input_ids=prompt)
        d = Decoder(tiny_q4, policy, SamplingParams(), max_new_tokens=30, record=False, **kw)
        d.start(input_ids=prompt)
        d.generate()
        assert d.generated == ref, f"{policy} departs from plain q4_1 on {prompt}"


@pytest.mark.slow   # the full suite's: thousands of sampled tokens (the fast tier stays under two minutes)
def test_sampling_keeps_the_q4_1_distribution(tiny_target):
    """The first speculated token (after the prefill's own) under eagle2 against the q4_1 target's
    softmax given the same first token: counts against the summed conditional probabilities
    (chi-square; 600 draws, p > 0.001)."""
    from scipy.stats import chisquare
    V = 12
    folder, _ = tiny_target("q4-sampling", vocab=V, hidden=32, layers=1, heads=2, kv_heads=1, inter=64,
                            lm_std=0.5, seed=5)
    b = load_bundle(str(folder), "random", dtype="q4_1")
    prompt = [1, 2, 3]
    cond = {}
    for root in range(V):
        _, logits = b.forward.prefill(b.forward.new_cache(16), torch.tensor(prompt + [root]), torch.arange(4))
        cond[root] = torch.softmax(logits.double(), -1).numpy()
    counts, expected = np.zeros(V), np.zeros(V)
    for seed in range(600):
        d = Decoder(b, "eagle2", SamplingParams(temperature=1.0, seed=seed), max_new_tokens=3, record=False,
                    total_tokens=6, depth=3, top_k=2)
        d.start(input_ids=prompt)
        d.step()
        counts[d.generated[1]] += 1
        expected += cond[d.generated[0]]
    keep = expected >= 5
    obs = np.append(counts[keep], counts[~keep].sum())
    exp = np.append(expected[keep], expected[~keep].sum())
    assert chisquare(obs, exp).pvalue > 1e-3


# ------------------------------------------------------------------ 4-5. the real model, bad input
@pytest.fixture(scope="module")
def real_q4(real_model_cache):
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("EAGLE2_CACHE", str(real_model_cache))
        return load_bundle(dtype="q4_1")


@pytest.mark.slow
def test_the_embedded_blocks_are_the_ggufs_own(real_q4, real_bundle, real_model_cache, monkeypatch):
    """The GGUF's blocks hold exactly the converted fp32 weights, and the kernels' embedding lookup
    (rows of the blocks: the backend keeps no fp32 table) gives the fp32 embedding, bit for bit."""
    from eagle2.model.weights import embedded_gguf, embedded_key
    monkeypatch.setenv("EAGLE2_CACHE", str(real_model_cache))
    f = real_bundle.target
    layers, lm, embed = qbuild._gguf_blocks(embedded_gguf(embedded_key("smollm2-135m")), f.args)
    assert embed is None  # tied: the LM head's blocks are the embedding
    for i in (0, 17, 29):
        att, mlp = f.layers[i].self_attn, f.layers[i].mlp
        for name, lin in (("q", att.q_proj), ("k", att.k_proj), ("v", att.v_proj), ("o", att.o_proj),
                          ("gate", mlp.gate_proj), ("down", mlp.down_proj)):
            assert torch.equal(layers[i][name].dequantised(), lin.weight), f"layer {i} {name}"
    assert torch.equal(lm.dequantised(), f.lm_head.weight)
    norms, final = qbuild._gguf_norms(embedded_gguf(embedded_key("smollm2-135m")), f.args)
    for i in (0, 17, 29):   # the norms the q4_1 backend reads from the GGUF: the fp32 model's
        assert torch.equal(norms[i][0], f.layers[i].input_layernorm.weight)
        assert torch.equal(norms[i][1], f.layers[i].post_attention_layernorm.weight)
    assert torch.equal(final, f.norm.weight)
    assert torch.equal(real_q4.forward.embedding(), f.embed_tokens.weight)
    assert real_q4.target is None and real_q4.forward.streamed_bytes() < 100e6  # about a sixth of fp32's


@pytest.mark.slow
def test_real_model_rows_are_the_same_bits_alone_in_a_batch_and_in_a_tree(real_q4):
    tok = real_q4.tokenizer
    prompt = tok("The capital of France is")["input_ids"]
    g = torch.Generator().manual_seed(1)
    for n in (2, 4, 7, 16):
        extra = torch.randint(0, 49152, (n,), generator=g).tolist()
        (fa, la), (fb, lb) = _rows_alone_and_batched(real_q4.forward, prompt, extra)
        assert torch.equal(fa, fb) and torch.equal(la, lb), f"N={n}"
    for depth in (1, 3, 5):
        path = torch.randint(0, 49152, (depth,), generator=g).tolist()
        tree_row, plain_row = _tree_row_against_plain(real_q4.forward, prompt, path, [11, 4000, 30000])
        assert torch.equal(tree_row, plain_row), f"depth {depth}"


@pytest.mark.slow
def test_real_model_long_prefill_is_the_same_bits_as_its_rows_one_at_a_time(real_q4):
    g = torch.Generator().manual_seed(2)
    prompt = torch.randint(0, 49152, (90,), generator=g).tolist()
    (fa, la), (fb, lb), (c1, c2) = _prefill_against_one_at_a_time(real_q4.forward, prompt, 2)
    assert torch.equal(fa, fb) and torch.equal(la, lb)
    assert torch.equal(c1.k[..., :90, :], c2.k[..., :90, :]) and torch.equal(c1.v[..., :90, :], c2.v[..., :90, :])


@pytest.mark.slow
def test_real_model_logits_are_the_same_bits_on_every_path_and_thread_count(real_q4):
    prompt = real_q4.tokenizer("The capital of France is")["input_ids"]
    outs = _logits_everywhere(real_q4.forward, prompt, [264, 3000, 11, 4000, 30000, 7, 88, 15000])
    first = next(iter(outs.values()))
    assert len(outs) >= 2
    for key, logits in outs.items():
        assert torch.equal(logits, first), key


@pytest.mark.slow
@pytest.mark.parametrize("policy", ["eagle2-auto", "eagle2", "dyspec"])
def test_greedy_identity_real_model_q4_1(real_q4, policy):
    from eagle2.tools.prompt_files import HELDOUT, read_prompts
    for item in read_prompts(HELDOUT)[:3]:
        msgs = [{"role": "user", "content": item["turns"][0]}]
        assert greedy_tokens(real_q4, policy, 48, messages=msgs) == greedy_tokens(real_q4, "plain", 48, messages=msgs)


def test_a_model_the_kernels_cannot_take_is_a_clear_error(tiny_target):
    folder, _ = tiny_target("q4-odd", vocab=20, hidden=48, layers=1, heads=2, kv_heads=1, inter=96)
    with pytest.raises(UserError, match="multiple of 32.*--dtype float32"):
        load_bundle(str(folder), "random", dtype="q4_1")


@pytest.mark.slow   # the full suite's: a GGUF written and read (the fast tier stays under two minutes)
def test_a_gguf_type_the_kernels_do_not_read_names_the_tensor(tmp_path, tiny_target):
    import gguf
    from eagle2.model.loading import load_target
    folder, _ = tiny_target("q4", vocab=97, hidden=64, layers=2, heads=4, kv_heads=2, inter=128, weight_std=0.3)
    w = gguf.GGUFWriter(str(tmp_path / "m.gguf"), "llama")
    w.add_tensor("blk.0.attn_q.weight", np.zeros((64, 64), dtype=np.float16))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    from eagle2.model.head import EagleHead
    args = load_target(folder, torch.device("cpu"), torch.float32).args
    with pytest.raises(UserError, match=r"blk\.0\.attn_q\.weight is F16.*--dtype float32"):
        qbuild.gguf_backends(args, tmp_path / "m.gguf", EagleHead(args), None)


def test_without_avx2_the_fp32_forward_runs_and_a_line_says_why(tiny_target, monkeypatch, caplog):
    folder, _ = tiny_target("q4", vocab=97, hidden=64, layers=2, heads=4, kv_heads=2, inter=128, weight_std=0.3)
    monkeypatch.setattr(qlib, "cpu_problem", lambda: "this CPU has no AVX2 (torch reports DEFAULT)")
    b = load_bundle(str(folder), "random", dtype="q4_1")
    assert b.precision == "float32" and not isinstance(b.forward, Q.KernelTarget) and b.target is not None
    said = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING and r.name.startswith("eagle2.")]
    assert any("no AVX2" in s for s in said) and any("running float32" in s for s in said)


# how far the kernels' head may stray from the eager fp32 head per block format (its matrices'
# roundings: Q4_1's step is about 8x Q8_0's): the layer output's relative error, the share of rows
# whose best draft token agrees
HEAD_BLOCK_BOUNDS = {"q8_0": (0.05, 0.8), "q4_1": (0.15, 0.5)}


@pytest.mark.slow   # the full suite's: a head trained a few steps and quantised (the fast tier stays under two minutes)
@pytest.mark.parametrize("blocks", list(HEAD_BLOCK_BOUNDS))
def test_the_eagle3_head_layer_in_the_kernels_follows_the_eager_head(tiny_target, tmp_path, blocks, monkeypatch):
    """qf_draft (the EAGLE-3 head's draft step in Q4_1, the default, or Q8_0; fp16 cache) against
    the head's own fp32 forward: the same outputs within the blocks' roundings, over a prefix and a
    tree step with a mask."""
    from test_serving import random_eagle3_head
    folder, _ = tiny_target("q4-e3", layers=4)
    head = random_eagle3_head(folder, tmp_path / "head")
    monkeypatch.setenv("EAGLE2_HEAD_BLOCKS", blocks)
    b = load_bundle(str(folder), head, dtype="q4_1")
    e = load_bundle(str(folder), head, dtype="float32")  # the same head, eager: another bundle
    kern, eager = b.draft, e.draft
    assert isinstance(kern, Q.KernelDraft) and b.head is None and e.head is not None
    assert kern.blocks == blocks and blocks.upper() in b.description
    rel, agree = HEAD_BLOCK_BOUNDS[blocks]
    g = torch.Generator().manual_seed(2)
    F = len(e.head.aux_layers) * e.args.dim
    feats, toks = torch.randn(6, F, generator=g), torch.randint(1, 97, (6,), generator=g)
    c_k, c_e = kern.new_cache(32), eager.new_cache(32)
    assert c_k.k.dtype == torch.float16
    gk, lk, (top_v, top_i) = kern.step(c_k, feats, toks, torch.arange(6), 0, k=5)
    ge, le, _ = eager.step(c_e, feats, toks, torch.arange(6), 0)
    assert ((gk - ge).norm() / ge.norm()).item() < rel
    assert (lk.argmax(-1) == le.argmax(-1)).float().mean().item() >= agree
    # the call's log-softmax and its ranking: torch's over the same logits, ids in the target's vocabulary
    assert torch.allclose(lk.exp().sum(-1), torch.ones(6), atol=1e-4)
    assert torch.allclose(lk, torch.log_softmax(lk, -1), atol=1e-5)
    v, i = lk.topk(5, dim=-1)
    assert torch.equal(top_v, v) and torch.equal(top_i, kern.to_target_ids(i))
    c_k.advance(6)
    c_e.advance(6)
    mask = torch.tensor([[1, 0, 0], [1, 1, 0], [1, 0, 1]], dtype=torch.bool)  # a root-child-sibling tree
    d = e.args.dim
    par = torch.randn(3, d, generator=g)
    tt = torch.randint(1, 97, (3,), generator=g)
    gk, _, no_top = kern.step(c_k, par, tt, torch.tensor([6, 7, 7]), 6, mask)
    assert no_top is None
    ge, _, _ = eager.step(c_e, par, tt, torch.tensor([6, 7, 7]), 6, mask)
    assert ((gk - ge).norm() / ge.norm()).item() < rel


def test_the_draft_heads_blocks_are_a_setting_and_a_wrong_one_is_a_clear_error(tiny_target, tmp_path, monkeypatch):
    """EAGLE2_HEAD_BLOCKS picks the head's blocks (Q4_1 unless it says q8_0): every matrix the call
    reads is in them; another value is one clear line at load, naming the setting."""
    from test_serving import random_eagle3_head
    folder, _ = tiny_target("q4-e3", layers=4)
    head = random_eagle3_head(folder, tmp_path / "head")
    for blocks, kind in (("", qblocks.Q4_1), ("q8_0", qblocks.Q8_0), (" Q4_1", qblocks.Q4_1)):
        monkeypatch.setenv("EAGLE2_HEAD_BLOCKS", blocks)
        d = load_bundle(str(folder), head, dtype="q4_1").draft
        ly = d.c.layer
        mats = [d.c.fc, d.c.lm, ly.q, ly.k, ly.v, ly.o, ly.gate, ly.up, ly.down]
        assert [m.type for m in mats] == [kind] * len(mats), blocks
    monkeypatch.setenv("EAGLE2_HEAD_BLOCKS", "q2_k")
    with pytest.raises(UserError, match="EAGLE2_HEAD_BLOCKS"):
        load_bundle(str(folder), head, dtype="q4_1")


def test_absorbing_a_context_reads_only_its_last_row_and_gets_the_same_bits(tiny_target, tmp_path):
    """last_only (what absorbing a prompt asks: its reading is the last row's) runs the draft LM
    head on the last row alone, in the kernels and in the eager head: the layer's outputs and the
    cache are the bits of the full call, the last row's top k the same, its log-probs the same bits
    in the kernels."""
    from test_serving import random_eagle3_head
    folder, _ = tiny_target("q4-e3", layers=4)
    head = random_eagle3_head(folder, tmp_path / "head")
    g = torch.Generator().manual_seed(4)
    bundles = {dtype: load_bundle(str(folder), head, dtype=dtype) for dtype in ("q4_1", "float32")}
    width = len(bundles["float32"].head.aux_layers) * bundles["float32"].args.dim
    feats, toks = torch.randn(40, width, generator=g), torch.randint(1, 97, (40,), generator=g)
    for dtype, b in bundles.items():
        draft = b.draft
        caches = [draft.new_cache(48), draft.new_cache(48)]
        full = draft.step(caches[0], feats, toks, torch.arange(40), 0, k=5)
        last = draft.step(caches[1], feats, toks, torch.arange(40), 0, k=5, last_only=True)
        assert torch.equal(full[0], last[0]), dtype                          # every row's layer output
        assert torch.equal(caches[0].k, caches[1].k) and torch.equal(caches[0].v, caches[1].v), dtype
        assert last[1].shape[0] == 1 and torch.equal(full[2][1][-1:], last[2][1]), dtype   # the same top k
        if dtype == "q4_1":   # the kernels' rows are independent: the same bits
            assert torch.equal(full[1][-1:], last[1]) and torch.equal(full[2][0][-1:], last[2][0])
        else:                 # torch's matmul of one row may round apart from forty's
            torch.testing.assert_close(full[1][-1:], last[1], rtol=0, atol=1e-5)


def test_the_embedding_is_read_from_the_blocks(tiny_q4, tiny_target):
    """The kernels look tokens up in the embedding's blocks (no fp32 table kept): the rows they
    read are the blocks' values exactly, as QMatrix.dequantised computes them."""
    from eagle2.model.loading import load_target
    folder, _ = tiny_target("q4", vocab=97, hidden=64, layers=2, heads=4, kv_heads=2, inter=128, weight_std=0.3)
    model = load_target(folder, torch.device("cpu"), torch.float32)
    table = model.embed_tokens.weight if not model.args.tie_embeddings else model.lm_head.weight
    assert torch.equal(tiny_q4.forward.embedding(), qblocks.quantise_q8_0(table).dequantised())
    with pytest.raises(IndexError):
        qlib.rows_of(tiny_q4.forward.lib, tiny_q4.forward.c_embed, torch.tensor([97]))


def test_eagle2_q4_kernels_picks_a_slower_cpus_path_or_says_why(tiny_q4, monkeypatch):
    """EAGLE2_Q4_KERNELS=avx2 runs the AVX2 dot products on a VNNI CPU (their timings, the same
    results); a name this CPU lacks, or no name at all, is one warning and the best path stays."""
    lib = tiny_q4.forward.lib
    best = lib.qf_isa()
    warned = []
    try:
        monkeypatch.setenv("EAGLE2_Q4_KERNELS", "avx2")
        qlib._force_kernels(lib, warned.append)
        assert tiny_q4.forward.isa == "AVX2" and not warned
        lib.qf_set_isa(best)
        monkeypatch.setenv("EAGLE2_Q4_KERNELS", "sse9")
        qlib._force_kernels(lib, warned.append)
        assert lib.qf_isa() == best and len(warned) == 1 and "EAGLE2_Q4_KERNELS=sse9 ignored" in warned[0]
    finally:
        lib.qf_set_isa(best)


def test_the_kernels_refuse_what_they_would_misread(tiny_q4):
    """The C side takes pointers and sizes: a cache in another dtype, shape or layout, a mask or
    logits of another size, a matmul input of another width are refused with one line, before the
    call (an fp32 cache was read as fp16; a matmul never checked its inner dimension)."""
    f = tiny_q4.forward
    toks, pos = torch.tensor([5, 8]), torch.tensor([0, 1])
    fp32 = f.new_cache(16)
    fp32.k = fp32.k.float()
    strided = f.new_cache(16)
    strided.v = strided.v.transpose(3, 4).contiguous().transpose(3, 4)   # the same shape, another layout
    short = f.new_cache(16)
    short.k = short.k[:1]
    for cache, says in ((fp32, "got float32"), (strided, "not contiguous"), (short, "got float16 [1,")):
        with pytest.raises(ValueError, match="must be fp16") as e:
            f.verify(cache, toks, pos)
        assert says in str(e.value) and "\n" not in str(e.value)
    with pytest.raises(ValueError, match="positions"):
        f.verify(f.new_cache(16), toks, torch.tensor([0]))
    with pytest.raises(ValueError, match="tree mask"):
        f.verify(f.new_cache(16), toks, pos, torch.ones(3, 3, dtype=torch.bool))
    with pytest.raises(ValueError, match=r"\[rows, 64\]"):
        qlib.matmul(f.lib, f.c_model.lm_head, torch.zeros(2, 63))


@pytest.mark.parametrize("hidden, heads", [(96, 8), (256, 1)])
def test_a_head_size_attention_does_not_take_is_refused_by_the_kernels_too(tiny_target, tmp_path, monkeypatch,
                                                                           hidden, heads):
    """Attention's lanes are fixed per head size, multiples of 8 up to 128: a head of 12 was read as
    one of 8, one of 256 left the output unwritten. qbuild.py refuses such a model at load; with
    that check out of the way, the calls that reach attention (the forward, the draft step, the
    draft tree) refuse it themselves, before any work, and each says so in one line."""
    from test_serving import random_eagle3_head
    hd = hidden // heads
    folder, _ = tiny_target(f"q4-hd{hd}", hidden=hidden, heads=heads, kv_heads=max(1, heads // 2), layers=4)
    head = random_eagle3_head(folder, tmp_path / "head")
    for where in (qbuild, Q):   # the builder and the backends each ask it
        monkeypatch.setattr(where, "shape_problem", lambda a: None)
    b = load_bundle(str(folder), head, dtype="q4_1")
    f, d = b.forward, b.draft
    assert isinstance(f, Q.KernelTarget) and isinstance(d, Q.KernelDraft) and f.args.head_dim == hd
    says = rf"head sizes up to 128 in steps of 8 \(this model's is {hd}\)"
    toks, pos = torch.tensor([3, 4]), torch.tensor([0, 1])
    calls = (lambda: f.verify(f.new_cache(8), toks, pos),
             lambda: d.step(d.new_cache(8), torch.zeros(2, 3 * hidden), toks, pos, 0),
             lambda: d.draft_tree(d.new_cache(32), 3, torch.zeros(hidden), (torch.zeros(2), torch.tensor([5, 6])), 1,
                                  2, 2, 4, Q.KernelDraft.tree_arrays(2, 2, 4)))
    for call in calls:
        with pytest.raises(ValueError, match=says) as e:
            call()
        assert "\n" not in str(e.value)


@pytest.mark.slow
def test_a_draft_step_ranks_at_most_topk_max_candidates(real_q4):
    """The kernels rank at most TOPK_MAX candidates a row: qf_draft refuses a larger k, and the step
    says so in one line (it truncated the list silently)."""
    d = real_q4.draft
    feats = torch.zeros(1, len(real_q4.forward.aux_layers) * real_q4.args.dim)
    toks, pos = torch.tensor([5]), torch.tensor([0])
    with pytest.raises(ValueError, match="at most 1024 candidates") as e:
        d.step(d.new_cache(8), feats, toks, pos, 0, k=1025)
    assert "\n" not in str(e.value)
    _, _, (vals, ids) = d.step(d.new_cache(8), feats, toks, pos, 0, k=1024)
    assert vals.shape == (1, 1024) and bool((vals[0, :-1] >= vals[0, 1:]).all())


@pytest.mark.slow
def test_the_embedded_model_in_q4_1_loads_from_its_gguf_alone(real_model_cache, monkeypatch):
    """The q4_1 backend of the embedded model reads its GGUF's blocks and norms, never the fp32
    model first (540 MB read to be thrown away): with the fp32 loader made to fail, it loads, and
    its trees decode what plain decoding does (test_the_embedded_blocks_are_the_ggufs_own: the
    blocks and norms it reads are the fp32 model's exactly)."""
    import eagle2.model.loading as L
    monkeypatch.setenv("EAGLE2_CACHE", str(real_model_cache))

    def no_fp32(*a, **kw):
        raise AssertionError("the fp32 target was read")
    monkeypatch.setattr(L, "load_target", no_fp32)
    b = L.load_bundle(dtype="q4_1")
    assert b.precision == "q4_1" and isinstance(b.draft, Q.KernelDraft)
    monkeypatch.undo()
    monkeypatch.setenv("EAGLE2_CACHE", str(real_model_cache))
    ids = [1, 504, 6147, 282]
    assert greedy_tokens(b, "eagle2-auto", 24, input_ids=ids) == greedy_tokens(b, "plain", 24, input_ids=ids)
