"""Issue 6: the DDD, DySpec and LANTERN(++) tree policies.

- greedy identity of ddd and dyspec with plain greedy on the real default model (3 prompts x 64
  tokens) and on a tiny random Llama where drafts are often accepted;
- sampling losslessness of dyspec (max-heap; threshold variant with a reduced-vocabulary head and
  top-k sampling) and ddd: a chi-square test of the joint distribution of the first three
  generated tokens against the exact target distribution, false-alarm rate 1e-3;
- lantern: lambda = 1 / delta = 0 reproduce exact decoding token for token (greedy and sampling);
  with lambda > 1 every step's shift stays within the stated bound (checked on the decoder's step
  records and, exactly, on a hand-made node against the empirical distribution); the neighbour
  index on hand-made embedding matrices; its disk cache;
- every policy parameter is validated with a clear UserError (API and CLI).
"""
from __future__ import annotations

import dataclasses
import json
import math
from pathlib import Path

import numpy as np
import pytest
import torch

from eagle2.decoding.decoder import Decoder
from eagle2.errors import UserError
from eagle2.policies import lantern_rule as LR
from eagle2.policies.registry import TRACES, make_policy, names
from eagle2.cycle.sampling import SamplingParams, probs_from_logits

ALPHA = 1e-3  # false-alarm rate of every statistical test in this file


# ------------------------------------------------------------------------------------ fixtures
@pytest.fixture(scope="module")
def tiny(tiny_target):
    """(bundle, hf_model) for a 6-token-vocabulary random 1-layer target with a random EAGLE head
    (conftest's builder: every parameter randomised, word-level tokenizer)."""
    from eagle2.model.loading import load_bundle
    folder, hf = tiny_target("policies-v6", vocab=6, hidden=32, layers=1, heads=2, kv_heads=1, inter=64,
                             weight_std=0.3)
    return load_bundle(str(folder), "random"), hf


@pytest.fixture(scope="module")
def real(real_bundle):
    """The default bundle (conftest's session-wide `real_bundle`) and plain greedy references, memoised."""
    b = real_bundle
    refs = {}

    def plain(prompt: str) -> list[int]:
        if prompt not in refs:
            d = Decoder(b, "plain", SamplingParams(), max_new_tokens=64, record=False)
            d.start(prompt)
            d.generate()
            refs[prompt] = list(d.generated)
        return refs[prompt]

    return b, plain


@pytest.fixture
def tmp_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("EAGLE2_CACHE", str(tmp_path / "cache"))
    return tmp_path / "cache"


def _run(bundle, policy, sp, prompt_ids, n, record=False, **kw):
    d = Decoder(bundle, policy, sp, max_new_tokens=n, record=record, **kw)
    d.start(input_ids=prompt_ids)
    d.generate()
    return d


# ------------------------------------------------------------------------------------ greedy identity
REAL_PROMPTS = [
    "Write a short poem about a city at night seen from a rooftop.",
    "Two trains start 300 km apart and travel toward each other at 70 km/h and 80 km/h. "
    "After how long do they meet?",
    "Explain in simple terms why the sky is blue.",
]
# small trees keep this affordable on a 2-core CPU; identity does not depend on the tree size
REAL_POLICIES = {
    "ddd": dict(total_tokens=12, depth=5, top_k=4, check_levels=(2, 4), threshold=-0.3),
    "dyspec": dict(total_tokens=12),
}


@pytest.mark.parametrize("policy", sorted(REAL_POLICIES))
@pytest.mark.slow
def test_greedy_identity_real_model(real, policy):
    b, plain = real
    tokens = forwards = 0
    for prompt in REAL_PROMPTS:
        d = Decoder(b, policy, SamplingParams(), max_new_tokens=64, record=False, **REAL_POLICIES[policy])
        d.start(prompt)
        d.generate()
        assert d.generated == plain(prompt), f"{policy} departs from plain greedy on {prompt!r}"
        assert len(d.generated) == 64 or d.finished == "eos"
        tokens, forwards = tokens + len(d.generated), forwards + d.target_forwards
    if "random" not in b.head_name:  # a trained head: accepted paths were exercised too
        assert tokens / forwards > 1.2


TINY_GREEDY = [
    ("dyspec", dict(total_tokens=8)),
    ("dyspec", dict(total_tokens=8, threshold=0.05, lookahead=2)),
    ("dyspec", dict(total_tokens=8, best_first=True)),
    ("ddd", dict(total_tokens=8, depth=4, top_k=3, check_levels=(2, 3), threshold=-0.7)),
    ("lantern", dict(lam=1.0, k=3)),
    ("lantern", dict(delta=0.0, k=2, metric="l2")),
]


@pytest.mark.parametrize("policy,kw", TINY_GREEDY, ids=[f"{p}-{i}" for i, (p, _) in enumerate(TINY_GREEDY)])
def test_greedy_identity_tiny(tiny, tmp_cache, policy, kw):
    """On the tiny target a random head's drafts are often accepted, so paths of depth > 1 are
    exercised (tau > 1), unlike on the real model with an untrained head."""
    b, _ = tiny
    forwards = tokens = 0
    for prompt in ([1, 2, 3], [5, 4], [2, 2, 2, 1]):
        ref = _run(b, "plain", SamplingParams(), prompt, 40).generated
        d = _run(b, policy, SamplingParams(), prompt, 40, **kw)
        assert d.generated == ref
        forwards += d.target_forwards
        tokens += len(d.generated)
    assert tokens / forwards > 1.2


# ------------------------------------------------------------------------------------ sampling losslessness
def _exact_joint(hf, prompt: list[int], V: int, sp: SamplingParams, n: int = 3) -> np.ndarray:
    """P(first n generated tokens) under the target (HF reference implementation), [V]*n."""
    joint = torch.ones(1, dtype=torch.float64)
    prefixes = [list(prompt)]
    for _ in range(n):
        with torch.no_grad():
            logits = hf(input_ids=torch.tensor(prefixes)).logits[:, -1].float()
        p = probs_from_logits(logits, sp).double()            # [B, V]
        joint = (joint[:, None] * p).reshape(-1)
        prefixes = [q + [t] for q in prefixes for t in range(V)]
    return joint.reshape([V] * n).numpy()


def _chi2_pvalue(counts: np.ndarray, probs: np.ndarray) -> float:
    """Pearson chi-square; cells with expected count < 5 are pooled into one cell."""
    from scipy.stats import chisquare
    N = counts.sum()
    exp = probs.reshape(-1) / probs.sum() * N
    obs = counts.reshape(-1).astype(float)
    small = exp < 5
    e = np.append(exp[~small], exp[small].sum())
    o = np.append(obs[~small], obs[small].sum())
    if e[-1] == 0:
        e, o = e[:-1], o[:-1]
    assert o.sum() == N and abs(e.sum() - N) < 1e-6 * N
    return float(chisquare(o, e).pvalue)


def _reduced_vocab_bundle(b, ids: list[int]):
    """The same target with a random head whose LM head covers only `ids` (d2t-style)."""
    from eagle2.model.head import EagleHead
    torch.manual_seed(1)
    h = EagleHead(b.target.args, draft_vocab=torch.tensor(ids)).float().eval()
    h.embed_tokens.weight = torch.nn.Parameter(b.target.embed_tokens.weight.detach(), requires_grad=False)
    h.attach(b.target.lm_head.weight)
    for p in h.parameters():
        p.requires_grad_(False)
    return dataclasses.replace(b, head=h)


LOSSLESS = [
    ("dyspec-heap", "dyspec", dict(total_tokens=6), SamplingParams(temperature=1.0), None, 2000),
    ("dyspec-threshold-reduced-vocab", "dyspec", dict(total_tokens=7, threshold=0.08),
     SamplingParams(temperature=0.8, top_k=4), [1, 2, 4, 5], 1000),
    # threshold -1.3: the beam at the check stops about one cycle in six, so both branches run
    ("ddd", "ddd", dict(total_tokens=7, depth=3, top_k=4, check_levels=(2,), threshold=-1.3),
     SamplingParams(temperature=1.0), None, 1000),
]


@pytest.mark.slow  # 1000-2000 sampled decodes per case (10-20 s each)
@pytest.mark.parametrize("case,policy,kw,sp,draft_vocab,n", LOSSLESS, ids=[c[0] for c in LOSSLESS])
def test_sampling_lossless_tiny(tiny, case, policy, kw, sp, draft_vocab, n):
    b, hf = tiny
    V = b.target.args.vocab_size
    if draft_vocab is not None:
        b = _reduced_vocab_bundle(b, draft_vocab)
    prompt = [1, 2, 3]
    exact = _exact_joint(hf, prompt, V, sp)
    d = Decoder(b, policy, dataclasses.replace(sp), max_new_tokens=3, record=False, **kw)
    counts = np.zeros([V] * 3, dtype=np.int64)
    forwards = 0
    for i in range(n):
        d.sampling.seed = 1000 + i
        d.start(input_ids=prompt)
        d.generate()
        counts[tuple(d.generated[:3])] += 1
        forwards += d.target_forwards
    p = _chi2_pvalue(counts, exact)
    print(f"{case}: chi-square p = {p:.3g}, {forwards / n:.2f} target forwards per sample")
    assert p > ALPHA, f"{case}: chi-square p = {p:.2e} < {ALPHA}: output differs from the target"
    assert forwards < 2.5 * n  # drafts were accepted: the speculative paths were exercised
    # power check: the same counts against a nearby wrong distribution (target at 1.25x the
    # temperature) are rejected
    wrong = _exact_joint(hf, prompt, V, dataclasses.replace(sp, temperature=sp.temperature * 1.25))
    pw = _chi2_pvalue(counts, wrong)
    print(f"{case}: power check p = {pw:.3g}")
    assert pw < ALPHA


# ------------------------------------------------------------------------------------ tree records
def assert_round_trips(st) -> None:
    """The step as a trace file holds it reads back equal, its policy's record included."""
    back = TRACES.step(json.loads(json.dumps(st.to_dict())))
    assert back == st and type(back.tree.record) is type(st.tree.record)


@pytest.mark.parametrize("sp", [SamplingParams(), SamplingParams(temperature=1.0, seed=3)], ids=["greedy", "sampling"])
def test_every_policys_recorded_trace_meets_the_trace_contract(tiny, tmp_cache, sp):
    """What the engine writes its reader accepts: every registered policy's recorded run, as its
    trace file holds it, reads back equal under every rule of the contract (the tree's sizes and
    links, each step's texts and accepted path, cycles in order, the run's totals)."""
    b, _ = tiny
    for name in names():
        own = {"k": 3} if name == "lantern" else {}      # its neighbours: within the tiny vocabulary
        d = _run(b, name, dataclasses.replace(sp), [1, 2, 3], 12, record=True, total_tokens=8, depth=3, top_k=3, **own)
        assert any(st.tree is not None for st in d.trace.steps), name
        assert TRACES.from_json(d.trace.to_json()) == d.trace, name


def test_ddd_records_beam_mass_and_stops(tiny):
    b, _ = tiny
    kw = dict(total_tokens=7, depth=3, top_k=4, check_levels=(2,), threshold=-1.3)
    decisions = set()
    for seed in range(6):
        d = _run(b, "ddd", SamplingParams(temperature=1.0, seed=seed), [1, 2, 3], 12, record=True, **kw)
        for st in d.trace.steps[1:]:
            t, dd = st.tree, st.tree.record
            assert dd.threshold == -1.3 and dd.check_levels == [2] and dd.max_depth == 3
            assert len(t.beam_mass) >= 2
            for c in dd.checks:
                assert c["stop"] == (c["beam_mass"] < -1.3)
                assert math.isclose(c["beam_mass"], t.beam_mass[c["level"] - 1], abs_tol=1e-5)
                decisions.add(c["stop"])
            deepest = max(t.levels)
            if dd.stopped_at is not None:
                assert deepest == dd.stopped_at - 1 and t.draft_calls == dd.stopped_at
            else:
                assert deepest == 3 and t.draft_calls == 4
            assert_round_trips(st)  # the app's trace stays serialisable, the record typed
    assert decisions == {True, False}


def test_dyspec_tree_records(tiny):
    b, _ = tiny
    for sp in (SamplingParams(temperature=1.0, seed=4), SamplingParams()):
        d = _run(b, "dyspec", sp, [1, 2, 3], 10, record=True, total_tokens=8)
        for st in d.trace.steps[1:]:
            t = st.tree
            n = len(t.tokens)
            assert n == 8 and all(t.kept) and t.order == list(range(n))
            for i in range(1, n):  # value = product of the draft probabilities on the path
                assert math.isclose(t.values[i], t.values[t.parents[i]] + t.logp[i], abs_tol=1e-9)
            for i in range(n):
                ch = [j for j in range(n) if t.parents[j] == i]
                assert len({t.tokens[j] for j in ch}) == len(ch)       # without replacement
                assert [t.ranks[j] for j in ch] == list(range(len(ch)))  # ranks = drawing order
                if sp.greedy:  # deterministic: siblings are the head's top tokens in order
                    assert [t.logp[j] for j in ch] == sorted((t.logp[j] for j in ch), reverse=True)
            assert t.sampled_drafts == (not sp.greedy) and t.record.greedy == sp.greedy
            assert len(t.record.slot_value) == n
            assert_round_trips(st)


def test_dyspec_keeps_q_at_each_sampled_parent():
    """Sampled siblings: the tree carries q over the target vocabulary at every parent (what
    SpecInfer's rule reads); greedy trees carry none."""
    from eagle2.policies.dyspec import DySpecPolicy
    for sp in (SamplingParams(temperature=1.0, seed=4), SamplingParams()):
        arrays = DySpecPolicy(total_tokens=8, depth=3).draft(_FakeRunner(sp=sp), root=0)
        t = arrays.to_tree()
        assert arrays.sampled_drafts == t.sampled_drafts == (not sp.greedy)
        if sp.greedy:
            assert arrays.draft_dists == {}
            continue
        assert set(arrays.draft_dists) == {t.parents[i] for i in range(1, len(t))}
        for q in arrays.draft_dists.values():
            assert q.shape == (5,) and abs(float(q.sum()) - 1) < 1e-5


class _FakeRunner:
    """A HeadRunner stand-in whose draft distribution after token y is softmax(W[y]) (root: W[0]);
    token `bad` makes the head return NaN (a diverging head)."""

    def __init__(self, V=5, seed=0, bad=None, sp=None):
        g = torch.Generator().manual_seed(seed)
        self.W = 2.0 * torch.randn(V, V, generator=g)
        self.draft = type("D", (), {"draft_ids": None, "vocab_size": V})()  # a DraftForward's vocabularies
        self.root_logp = torch.log_softmax(self.W[0], -1)
        self.root_g = torch.zeros(2)
        self.calls, self.bad = 1, bad
        self.sampling, self.gen = sp or SamplingParams(), torch.Generator().manual_seed(seed)

    def run(self, tokens, parent_g, parent_slots, depths):
        self.calls += 1
        lp = torch.log_softmax(self.W[tokens], -1)
        for j, t in enumerate(tokens):
            if t == self.bad:
                lp[j] = float("nan")
        return torch.zeros(len(tokens), 2), lp, list(range(len(tokens)))


@pytest.mark.parametrize("budget", [3, 9, 20])
def test_dyspec_greedy_heap_is_best_first(budget):
    """Greedy DySpec with best_first: its nodes are exactly the budget highest-value sequences;
    with the paper's keys every node still has a value no larger than its parent's and the budget
    is filled."""
    from itertools import product
    from eagle2.policies.dyspec import DySpecPolicy
    r = _FakeRunner()
    t = DySpecPolicy(total_tokens=budget + 1, depth=3).draft(_FakeRunner(), root=0).to_tree()
    assert len(t.tokens) == budget + 1
    assert all(t.values[i] <= t.values[t.parents[i]] for i in range(1, budget + 1))
    t = DySpecPolicy(total_tokens=budget + 1, depth=3, best_first=True).draft(r, root=0).to_tree()
    W = torch.log_softmax(r.W, -1)
    vals = []
    for d in (1, 2, 3):
        for seq in product(range(5), repeat=d):
            v, prev = 0.0, 0
            for y in seq:
                v, prev = v + float(W[prev, y]), y
            vals.append(v)
    best = sorted(vals, reverse=True)[:budget]
    assert np.allclose(sorted(t.values[1:], reverse=True), best, atol=1e-5)
    internal = {t.parents[i] for i in range(1, len(t.tokens))} - {0}
    assert len(internal) <= r.calls - 1 <= len(t.tokens) - 1  # the head ran only where it was needed


def test_dyspec_survives_a_diverging_head():
    from eagle2.policies.dyspec import DySpecPolicy
    for sp in (SamplingParams(), SamplingParams(temperature=1.0)):
        r = _FakeRunner(bad=2, sp=sp)
        arrays = DySpecPolicy(total_tokens=30, depth=4).draft(r, root=0)
        t = arrays.to_tree()
        assert len(t.tokens) == 30
        assert t.record.nonfinite_draft_nodes
        for n in t.record.nonfinite_draft_nodes:
            assert t.tokens[n] == 2 and n not in t.parents  # no children under a NaN distribution
        if not sp.greedy:
            assert all(torch.isfinite(q).all() for q in arrays.draft_dists.values())


def test_dyspec_draws_are_reproducible(tiny):
    b, _ = tiny
    sp = SamplingParams(temperature=1.0, seed=11)
    runs = [_run(b, "dyspec", dataclasses.replace(sp), [1, 2, 3], 15, record=True, total_tokens=8) for _ in range(2)]
    assert runs[0].generated == runs[1].generated
    assert [s.tree.tokens for s in runs[0].trace.steps[1:]] == [s.tree.tokens for s in runs[1].trace.steps[1:]]


# ------------------------------------------------------------------------------------ LANTERN
def test_knn_index_handmade():
    from eagle2.policies.lantern import knn_index
    # points on a line at 0, 1, 3, 7, 15: L2 neighbours are known by hand
    E = torch.tensor([[0.0, 0.0], [1.0, 0.0], [3.0, 0.0], [7.0, 0.0], [15.0, 0.0]])
    want = [[1, 2, 3], [0, 2, 3], [1, 0, 3], [2, 1, 0], [3, 2, 1]]
    for chunk in (1, 2, 1024):
        assert knn_index(E, 3, "l2", chunk=chunk).tolist() == want
    # directions at 0, 10, 30, 70, 150 degrees with different norms: cosine ignores the norm
    ang = torch.tensor([0.0, 10.0, 30.0, 70.0, 150.0]) * math.pi / 180
    r = torch.tensor([1.0, 5.0, 0.3, 2.0, 9.0])
    E = torch.stack([r * torch.cos(ang), r * torch.sin(ang)], 1)
    assert knn_index(E, 2, "cosine", chunk=2).tolist() == [[1, 2], [0, 2], [1, 0], [2, 1], [3, 2]]
    # l2 on the same points differs (norms matter): 2's nearest is 0 (distance ~0.72)
    assert knn_index(E, 1, "l2").tolist()[2] == [0]
    # random matrix: brute force agrees, the row itself is never its own neighbour
    g = torch.Generator().manual_seed(0)
    E = torch.randn(300, 16, generator=g)
    idx = knn_index(E, 5, "l2", chunk=64)
    d = torch.cdist(E, E)
    d.fill_diagonal_(float("inf"))
    assert torch.equal(idx, d.topk(5, largest=False).indices)
    assert not (idx == torch.arange(300)[:, None]).any()
    with pytest.raises(UserError, match="metric"):
        knn_index(E, 3, "dot")
    with pytest.raises(UserError, match="k must be"):
        knn_index(E, 300, "l2")


def test_neighbour_cache(tmp_cache):
    from types import SimpleNamespace
    from eagle2.policies.lantern import knn_index, neighbours_for
    E = torch.randn(50, 8, generator=torch.Generator().manual_seed(1))
    fake = SimpleNamespace(name="fake model/1", forward=SimpleNamespace(embedding=lambda: E), derived={})
    a = neighbours_for(fake, 6, "cosine")
    files = list((tmp_cache / "lantern").glob("*.safetensors"))
    assert len(files) == 1 and "cosine-k6" in files[0].name and "fake-model-1-50x8" in files[0].name
    assert torch.equal(a, knn_index(E, 6, "cosine"))
    fresh = SimpleNamespace(name="fake model/1", forward=fake.forward, derived={})  # new process: from disk
    assert torch.equal(neighbours_for(fresh, 4, "cosine"), a[:, :4])    # smaller k from the k=6 file
    assert len(list((tmp_cache / "lantern").glob("*.safetensors"))) == 1
    neighbours_for(fresh, 4, "l2")                                       # another metric: another key
    assert len(list((tmp_cache / "lantern").glob("*.safetensors"))) == 2


def test_relaxed_greedy_rule():
    # V = 6; target p at the root; token 2's neighbours are 0 then 1; token 3's are 4 then 5
    p = torch.tensor([0.30, 0.05, 0.20, 0.25, 0.10, 0.10])
    logits = torch.log(p)[None].repeat(2, 1)  # one row per verify position
    nbrs = torch.tensor([[1, 2], [0, 2], [0, 1], [4, 5], [3, 5], [4, 3]])
    tokens, children = [9, 2], [[1], []]
    # exact: token 2 is not the argmax (0) -> rejected, bonus 0
    assert LR.relaxed_greedy(tokens, children, logits, nbrs, 1.0, None) == ([], 0)
    # lam = 2: bound 0.2 < p(0) = 0.3 -> nothing moves -> still rejected
    assert LR.relaxed_greedy(tokens, children, logits, nbrs, 2.0, None) == ([], 0)
    # lam = 2.6: bound 0.32 >= 0.30 moves token 0 (not 0+1 = 0.35) onto 2: 0.5 > 0.25 -> accepted
    log = []
    assert LR.relaxed_greedy(tokens, children, logits, nbrs, 2.6, None, log) == ([1], 0)
    assert log[0]["moved"] == [0] and abs(log[0]["moved_mass"] - 0.3) < 1e-6 and log[0]["relaxed"]
    assert log[0]["p_max"] <= 2.6 * log[0]["p"]
    # token 3: neighbours 4 (0.10) then 5 (0.10); delta 0.15 moves 4: 0.35 > 0.30 -> accepted
    assert LR.relaxed_greedy([9, 3], children, logits, nbrs, None, 0.15) == ([1], 0)
    assert LR.relaxed_greedy([9, 3], children, logits, nbrs, None, 0.04) == ([], 0)
    # the longest acceptable path wins over the exact child: 0 (exact, leaf) vs 3 (relaxed, with
    # an accepted child below it)
    logits2 = torch.log(torch.stack([p, p, torch.tensor([0.1, 0.1, 0.1, 0.1, 0.5, 0.1]), p]))
    tokens2, children2 = [9, 0, 3, 4], [[1, 2], [], [3], []]
    assert LR.relaxed_greedy(tokens2, children2, logits2, nbrs, None, 0.15) == ([2, 3], 0)
    assert LR.relaxed_greedy(tokens2, children2, logits2, nbrs, None, 0.0) == ([1], 0)


@pytest.mark.parametrize("lam,delta", [(3.0, None), (None, 0.08)])
def test_relaxed_sampling_distribution_and_bound(lam, delta):
    """One node with three draft children: the logged distribution o is what the rule samples
    (chi-square, 3000 draws), departs from p (TV > 0) and stays within the stated bound."""
    p = torch.tensor([0.22, 0.05, 0.18, 0.15, 0.12, 0.08, 0.11, 0.09])
    logits = torch.log(p)[None].repeat(4, 1)
    nbrs = torch.tensor([[1, 2, 3], [0, 2, 3], [5, 6, 0], [6, 7, 1], [1, 0, 2], [2, 4, 7], [3, 2, 0], [0, 6, 4]])
    tokens, children = [9, 2, 3, 4], [[1, 2, 3], [], [], []]
    sp = SamplingParams(temperature=1.0)
    log = []
    LR.relaxed_sampling(tokens, children, logits, nbrs, lam, delta, sp, torch.Generator().manual_seed(0), log)
    o = log[0]["dist"].numpy()
    assert abs(o.sum() - 1) < 1e-6 and log[0]["tv"] > 0.05
    assert log[0]["tv"] <= log[0]["tv_bound"] + 1e-6  # float32 probabilities
    if lam is not None:
        assert log[0]["max_ratio"] <= lam * (1 + 1e-6)
        assert log[0]["tv_bound"] <= (lam - 1) * float(p[[2, 3, 4]].sum()) + 1e-9
    else:
        assert log[0]["tv_bound"] == delta
    gen = torch.Generator().manual_seed(1)
    counts = np.zeros(8)
    for _ in range(3000):
        path, bonus = LR.relaxed_sampling(tokens, children, logits, nbrs, lam, delta, sp, gen)
        counts[tokens[path[0]] if path else bonus] += 1
    assert _chi2_pvalue(counts, o) > ALPHA
    assert _chi2_pvalue(counts, p.double().numpy()) < ALPHA  # and it is measurably not p


def test_lantern_exact_when_lambda_1(tiny, tmp_cache):
    """lambda = 1 / delta = 0: token for token the static policy's exact sampling, same seed."""
    b, _ = tiny
    for seed in (0, 1, 2):
        sp = SamplingParams(temperature=1.0, seed=seed)
        ref = _run(b, "static", dataclasses.replace(sp), [1, 2, 3], 30).generated
        for kw in (dict(lam=1.0, k=3), dict(delta=0.0, k=3)):
            d = _run(b, "lantern", dataclasses.replace(sp), [1, 2, 3], 30, record=True, **kw)
            assert d.generated == ref
            assert d.summary()["lossy"] is False  # nothing moved: not reported as lossy
            for st in d.trace.steps[1:]:
                rx = st.tree.record
                assert rx.lossy is False
                assert rx.tv_max == 0.0 and rx.relaxed_tokens == 0
                assert all(tr["moved"] == [] for e in rx.positions for tr in e["trials"])


@pytest.mark.parametrize("sp", [SamplingParams(temperature=1.0, seed=5), SamplingParams()], ids=["sampling", "greedy"])
def test_lantern_steps_within_bound(tiny, tmp_cache, sp):
    b, _ = tiny
    lam = 3.0
    relaxed = 0
    for prompt in ([1, 2, 3], [5, 4], [2, 2, 2, 1]):
        d = _run(b, "lantern", dataclasses.replace(sp), prompt, 30, record=True, lam=lam, k=3)
        assert d.summary()["lossy"] is True and d.summary()["policy_stats"]["rule"] == "lantern++"
        for st in d.trace.steps[1:]:
            rx = st.tree.record
            assert rx.lam == lam and rx.k == 3
            assert_round_trips(st)
            for e in rx.positions:
                if sp.greedy:  # accepted token within a factor lam of the argmax's probability
                    assert e["p_max"] <= lam * e["p"] * (1 + 1e-6)
                    assert e["moved_mass"] <= (lam - 1) * e["p"] * (1 + 1e-6)
                    relaxed += e["relaxed"]
                else:
                    assert e["max_ratio"] <= lam * (1 + 1e-6)
                    assert e["tv"] <= e["tv_bound"] + 1e-6 <= (lam - 1) + 1e-6
                    for tr in e["trials"]:
                        assert tr["p_relaxed"] <= lam * tr["p"] * (1 + 1e-6) + 1e-12
                        assert set(tr["moved"]) <= set(range(b.target.args.vocab_size)) - {tr["token"]}
                    relaxed += any(tr["moved_mass"] > 0 for tr in e["trials"])
    assert relaxed > 0  # the relaxation was actually used


# ------------------------------------------------------------------------------------ validation
@pytest.mark.parametrize("name,kw,msg", [
    ("ddd", dict(threshold=0.5), "must be <= 0"),
    ("ddd", dict(threshold=float("nan")), "finite"),
    ("ddd", dict(check_levels=(5, 7, 11)), r"check levels must lie in \[1, depth=10\]"),
    ("ddd", dict(check_levels=("5",)), "list of integers"),
    ("ddd", dict(check_levels=(3, 3)), "distinct"),
    ("ddd", dict(depth=0), "depth must be an integer"),
    ("ddd", dict(top_k=0), "top k must be an integer"),
    ("dyspec", dict(total_tokens=1), r"total tokens must be an integer in \[2, 1024\]"),
    ("dyspec", dict(depth=0), "depth must be"),
    ("dyspec", dict(top_k=0), "max children per node"),
    ("dyspec", dict(threshold=1.0), r"threshold must be a probability in \(0, 1\)"),
    ("dyspec", dict(threshold=0.0), "threshold must be"),
    ("dyspec", dict(lookahead=0), "lookahead must be"),
    ("dyspec", dict(best_first=1), "best_first must be True or False"),
    ("lantern", dict(lam=0.9), r"lambda must be a number in \[1, 1000\]"),
    ("lantern", dict(lam=float("inf")), "lambda must be"),
    ("lantern", dict(delta=1.5), r"delta must be a probability in \[0, 1\]"),
    ("lantern", dict(delta=-0.1), "delta must be"),
    ("lantern", dict(lam=2.0, delta=0.1), "not both"),
    ("lantern", dict(k=0), r"k \(latent neighbours per token\) must be"),
    ("lantern", dict(metric="dot"), "metric must be one of cosine, l2"),
    ("lantern", dict(bogus=1), "has no parameter"),
    ("eagle2", dict(threshold=0.1), "has no parameter"),
])
def test_policy_parameters_validated(name, kw, msg):
    with pytest.raises(UserError, match=msg):
        make_policy(name, **kw)


def test_policy_defaults():
    ddd = make_policy("ddd")
    assert (ddd.depth, ddd.top_k, ddd.check_levels, ddd.threshold) == (10, 10, (5, 7, 9), -0.3)
    assert make_policy("ddd", depth=6).check_levels == (5,)  # the checks that fit a shallower max depth
    lan = make_policy("lantern")
    assert lan.lossy and (lan.lam, lan.delta, lan.k, lan.metric) == (5.0, None, 10, "cosine")
    assert make_policy("lantern", delta=0.1).lam is None
    dy = make_policy("dyspec", total_tokens=32)
    assert dy.total_tokens == 32 and not dy.lossy and dy.lossy_note(greedy=False) is None


def test_cli(tiny, tmp_cache, capsys):
    from eagle2.tools.cli import main
    b, _ = tiny
    folder = str(Path(b.name))
    base = ["generate", "--target", folder, "--head", "random", "--prompt", "w1 w2 w3", "--raw",
            "--max-new-tokens", "12", "--json"]
    for extra in (["--policy", "ddd", "--ddd-threshold", "-1.0", "--ddd-checks", "1,2", "--depth", "3",
                   "--top-k", "3", "--total-tokens", "8"],
                  ["--policy", "dyspec", "--dyspec-threshold", "0.1", "--total-tokens", "8",
                   "--temperature", "0.7"],
                  ["--policy", "lantern", "--lantern-lambda", "2", "--lantern-k", "2"]):
        assert main(base + extra) == 0
        out, err = capsys.readouterr()
        s = json.loads(out.strip().splitlines()[-1])
        assert s["policy"] == extra[1] and s["new_tokens"] == 12
        assert s["lossy"] == (extra[1] == "lantern") and ("is LOSSY" in err) == (extra[1] == "lantern")
    assert main(base + ["--policy", "lantern", "--lantern-delta", "0", "--lantern-k", "2"]) == 0  # exact: said so
    assert "verification is exact" in capsys.readouterr().err
    for bad, msg in ((["--policy", "eagle2", "--lantern-lambda", "2"], "applies to --policy lantern"),
                     (["--policy", "ddd", "--ddd-checks", "5;7"], "comma-separated integers"),
                     (["--policy", "lantern", "--lantern-lambda", "0.5"], "lambda must be")):
        assert main(base + bad) == 2
        assert msg in capsys.readouterr().err
