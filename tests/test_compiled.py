"""The compiled forward (eagle2/model/compiled.py, exported.py) against the eager reference.

(a) Attention in two parts (the cached slots where they lie, then the new keys, merged by their
    log-sum-exps) and over the concatenation both equal SDPA over the committed cache, earlier
    tree slots and the new keys under a tree mask.
(b) The exported functions, run eagerly, equal the eager forwards of the target (logits and the
    K/V it returns) and of the draft head (its features, log-probabilities and K/V).
(c) AOTInductor packages built for a tiny Llama and its head: outputs equal the eager path's for
    every tree size (padded buckets included), and greedy decoding through the compiled target and
    head (plain, static, EAGLE-2) emits exactly the eager plain decoder's tokens.
    An EAGLE-3 head's target packages also return its layers' states, and its own packages equal
    its eager forward.
(d) The fallbacks: no package, a corrupt package, --no-compile.
"""
from __future__ import annotations

import subprocess
import sys
import time

import torch
import torch.nn.functional as F
import pytest

from eagle2.decoding.decoder import Decoder
from eagle2.model.compiled import CompiledTarget, attach, compilable_head
from eagle2.model.exported import HeadForward, TreeForward
from eagle2.model.llama import attend_concatenated, attend_in_parts, split_masks
from eagle2.model.loading import load_bundle

ATOL = 2e-4  # logits of O(1-10); the same bar test_model uses against transformers


def random_tree_mask(T: int, g: torch.Generator) -> torch.Tensor:
    parent = [-1] + [int(torch.randint(0, i, (1,), generator=g)) for i in range(1, T)]
    m = torch.eye(T, dtype=torch.bool)
    for i in range(T):
        j = parent[i]
        while j >= 0:
            m[i, j] = True
            j = parent[j]
    return m


@pytest.mark.parametrize("committed,tree,T", [(0, 0, 1), (0, 0, 5), (7, 0, 1), (7, 0, 6), (33, 0, 16),
                                             (7, 3, 1), (7, 5, 4), (20, 12, 10), (0, 4, 3)])
@pytest.mark.parametrize("attend", [attend_in_parts, attend_concatenated])
def test_attention_equals_sdpa(committed, tree, T, attend):
    g = torch.Generator().manual_seed(committed * 100 + tree * 10 + T)
    H, kv, d, C = 6, 2, 16, 64
    start = committed + tree
    q = torch.randn(1, H, T, d, generator=g)
    k, v = torch.randn(1, kv, T, d, generator=g), torch.randn(1, kv, T, d, generator=g)
    kc, vc = torch.randn(1, kv, C, d, generator=g), torch.randn(1, kv, C, d, generator=g)
    tm = torch.cat([torch.rand(T, tree, generator=g) < 0.4, random_tree_mask(T, g)], 1)
    past_mask, new_mask = split_masks(committed, start, tm, T, q.device)
    ours = attend(q, k, v, kc[:, :, :start], vc[:, :, :start], past_mask, new_mask)
    K = torch.cat([kc[:, :, :start], k], 2)
    V = torch.cat([vc[:, :, :start], v], 2)
    mask = torch.ones(T, start + T, dtype=torch.bool)
    mask[:, committed:] = tm
    ref = F.scaled_dot_product_attention(q, K, V, attn_mask=mask, enable_gqa=True)
    assert (ours - ref).abs().max().item() < 1e-5


@pytest.fixture(scope="module")
def tiny(tiny_target):
    folder, _ = tiny_target("llama")
    return load_bundle(str(folder), "random")


def prefilled(bundle, n_prompt: int = 9):
    m = bundle.target
    cache = m.new_cache(64)
    ids = torch.arange(1, n_prompt + 1)
    m.forward_cached(cache, ids, torch.arange(n_prompt))
    cache.advance(n_prompt)
    return cache


def test_tree_function_equals_eager_forward(tiny):
    m = tiny.target
    g = torch.Generator().manual_seed(1)
    for T in (1, 3, 8):
        cache = prefilled(tiny)
        toks = torch.randint(0, m.args.vocab_size, (T,), generator=g)
        pos = torch.arange(cache.length, cache.length + T)
        tm = random_tree_mask(T, g)
        feats, logits, new_k, new_v = TreeForward(m)(toks, *m.rope_at(pos), cache.k, cache.v,
                                                     torch.ones(T, cache.length, dtype=torch.bool), tm)
        ref = m.forward_cached(cache, toks, pos, tm)
        L = cache.length
        assert (logits - m.logits(ref)).abs().max().item() < ATOL
        assert (new_k - cache.k[:, :, :, L:L + T]).abs().max().item() < 1e-5
        assert (new_v - cache.v[:, :, :, L:L + T]).abs().max().item() < 1e-5


def head_call_inputs(bundle, T, tree, g):
    """A head cache with 6 committed slots and `tree` earlier tree slots, and a call on T nodes."""
    h = bundle.head
    cache = h.new_cache(64)
    D = h.args.dim
    h.forward_cached(cache, torch.randn(6, D, generator=g), torch.arange(2, 8), torch.arange(6), 0)
    cache.advance(6)
    if tree:
        h.forward_cached(cache, torch.randn(tree, D, generator=g), torch.arange(3, 3 + tree),
                         torch.full((tree,), 6), 6, torch.eye(tree, dtype=torch.bool))
    feats = torch.randn(T, D, generator=g)
    toks = torch.randint(0, h.args.vocab_size, (T,), generator=g)
    pos = torch.full((T,), 7)
    tm = torch.cat([torch.rand(T, tree, generator=g) < 0.5, torch.eye(T, dtype=torch.bool)], 1)
    return cache, feats, toks, pos, tm


def test_head_function_equals_eager_head(tiny):
    h = tiny.head
    g = torch.Generator().manual_seed(3)
    for T, tree in ((1, 0), (3, 4), (8, 2)):
        cache, feats, toks, pos, tm = head_call_inputs(tiny, T, tree, g)
        start = cache.length + tree
        past, new = split_masks(cache.length, start, tm, T, tm.device)
        past = torch.ones(T, start, dtype=torch.bool) if past is None else past
        out, logp, new_k, new_v = HeadForward(h)(h.embed_tokens(toks), feats, *h.rope_at(pos), cache.k[0],
                                                 cache.v[0], past, new)
        ref = h.forward_cached(cache, feats, toks, pos, start, tm)
        assert (out - ref).abs().max().item() < 1e-5
        assert (logp - h.draft_logprobs(ref)).abs().max().item() < 1e-4
        assert (new_k - cache.k[0, :, :, start:start + T]).abs().max().item() < 1e-5


@pytest.fixture(scope="module")
def compiled_tiny(tiny, tmp_path_factory):
    """Target packages for tree sizes 1 and 4 (3 and 2 run padded to 4; 5+ run eagerly), the
    head's for 4 (1-3 padded)."""
    folder = tmp_path_factory.mktemp("aoti")
    (folder / "T1.pt2").write_bytes(b"left by a build that stopped")  # not a package: rebuilt
    ct = CompiledTarget(tiny.target, tiny.head, buckets=(1, 4), head_buckets=(4,), folder=folder)
    ct.build()
    assert sorted(ct.runners) == [1, 4] and sorted(ct.head_set.runners) == [4]
    # each package is unpacked once (its .so maps in well under a second) and the .pt2 dropped
    assert not list(folder.glob("*.pt2")) and (folder / "T1.so").exists() and (folder / "T1.blob").exists()
    yield ct
    tiny.target.compiled = tiny.head.compiled = None


@pytest.mark.slow
def test_compiled_logits_equal_eager(tiny, compiled_tiny):
    m = tiny.target
    g = torch.Generator().manual_seed(2)
    for T in (1, 2, 3, 4, 6):
        toks = torch.randint(0, m.args.vocab_size, (T,), generator=g)
        tm = random_tree_mask(T, g)
        c1, c2 = prefilled(tiny), prefilled(tiny)
        pos = torch.arange(c1.length, c1.length + T)
        out = compiled_tiny.run(c1, toks, pos, tm)
        if T > 4:
            assert out is None  # above the largest bucket: the caller runs the eager path
            continue
        feats, logits = out
        ref = m.forward_cached(c2, toks, pos, tm)
        assert logits.shape == (T, m.args.vocab_size)
        assert (logits - m.logits(ref)).abs().max().item() < ATOL
        assert (feats - ref).abs().max().item() < ATOL
        L = c1.length
        assert torch.allclose(c1.k[:, :, :, L:L + T], c2.k[:, :, :, L:L + T], atol=1e-5)  # K/V written


@pytest.mark.slow
def test_compiled_head_equals_eager(tiny, compiled_tiny):
    h = tiny.head
    g = torch.Generator().manual_seed(4)
    for T, tree in ((1, 0), (3, 0), (4, 5), (2, 9), (6, 0)):
        args = head_call_inputs(tiny, T, tree, g)
        c1, rest = args[0], args[1:]
        c2, _, _, _, _ = head_call_inputs(tiny, T, tree, torch.Generator().manual_seed(0))
        c2.k.copy_(c1.k)
        c2.v.copy_(c1.v)
        start = c1.length + tree
        tm = rest[3] if tree or T == 1 else None  # absorbing accepted tokens: causal, no mask
        out = compiled_tiny.run_head(c1, *rest[:3], start, tm)
        if T > 4:
            assert out is None
            continue
        g1, logp, _ = out
        ref = h.forward_cached(c2, *rest[:3], start, tm)
        assert (g1 - ref).abs().max().item() < ATOL and (logp - h.draft_logprobs(ref)).abs().max().item() < ATOL
        assert torch.allclose(c1.k[0, :, :, start:start + T], c2.k[0, :, :, start:start + T], atol=1e-5)


def decode(bundle, policy, prompt, **kw):
    d = Decoder(bundle, policy, max_new_tokens=40, record=False, **kw)
    d.start(input_ids=prompt)
    d.generate()
    return d.generated


def test_pruning_removes_only_folders_no_build_here_can_load(tmp_path):
    """Older formats, another torch, and folders without a record go; other thread counts stay."""
    import json
    from eagle2.model.packages import FORMAT, META, prune_stale, write_meta
    keep, other_threads, old_format, old_torch, unrecorded = (tmp_path / n for n in ("keep", "t2", "v1", "tv", "none"))
    for d in (keep, other_threads, old_format, old_torch, unrecorded):
        d.mkdir()
        (d / "T4.so").write_bytes(b"x" * 1000)
    write_meta(keep)
    write_meta(other_threads)
    meta = json.loads((keep / META).read_text())
    (old_format / META).write_text(json.dumps({**meta, "format": FORMAT - 1}))
    (old_torch / META).write_text(json.dumps({**meta, "torch": "2.0.0"}))
    assert prune_stale(keep) == (3, 3000 + len(json.dumps({**meta, "format": FORMAT - 1}))
                                 + len(json.dumps({**meta, "torch": "2.0.0"})))
    assert sorted(d.name for d in tmp_path.iterdir()) == ["keep", "t2"]


@pytest.mark.parametrize("policy,kw", [("plain", {}), ("static", {}),
                                       ("eagle2", dict(total_tokens=4, depth=3, top_k=2)),
                                       ("eagle2", dict(total_tokens=12, depth=4, top_k=3))],
                         ids=["plain", "static", "eagle2-4", "eagle2-12"])
@pytest.mark.slow
def test_greedy_identity_on_compiled_path(tiny, compiled_tiny, policy, kw):
    prompts = [[5, 17, 33, 2, 9], [40, 41, 42], list(range(3, 20))]
    tiny.target.compiled = tiny.head.compiled = None
    refs = [decode(tiny, "plain", p) for p in prompts]
    tiny.target.compiled = tiny.head.compiled = compiled_tiny
    try:
        for p, ref in zip(prompts, refs):
            assert decode(tiny, policy, p, **kw) == ref
    finally:
        tiny.target.compiled = tiny.head.compiled = None


def test_fallbacks(tiny, tmp_path):
    ct = CompiledTarget(tiny.target, buckets=(1,), folder=tmp_path)
    assert ct.runners == {} and ct.run(prefilled(tiny), torch.tensor([3]), torch.tensor([9]), None) is None
    assert ct.describe().startswith("eager forward")
    (tmp_path / "T1.so").write_bytes(b"not a package")
    ct.poll()
    assert ct.runners == {} and "unusable" in ct.describe() and not (tmp_path / "T1.so").exists()
    assert attach(tiny, "no").startswith("eager forward") and tiny.target.compiled is None
    assert tiny.head.compiled is None


def test_compile_status_lists_the_packages_on_disk(tiny, monkeypatch, tmp_path):
    from eagle2.model import packages
    monkeypatch.setattr(packages, "package_dir", lambda model: tmp_path)
    (tmp_path / "T4.so").write_bytes(b"x" * 10)
    (tmp_path / "T8.so.123.part").write_bytes(b"half")  # a package still being written is not listed
    assert packages.compile_report(tiny.target) == {"folder": str(tmp_path), "packages": {"T4.so": 10}}


def test_a_torch_without_the_package_loader_stays_eager(tiny, monkeypatch):
    monkeypatch.delattr(torch._C._aoti, "AOTIModelContainerRunnerCpu")
    line = attach(tiny, "auto")
    assert tiny.target.compiled is None and "cannot load compiled packages" in line


@pytest.mark.slow
def test_packages_load_as_the_background_compile_lands_them(tiny, compiled_tiny, tmp_path):
    """While the background compile runs, one watcher thread loads each package as it lands (no
    forward or describe() looks at the disk), then ends with the compile."""
    src = compiled_tiny.folder
    ct = CompiledTarget(tiny.target, tiny.head, buckets=(1, 4), head_buckets=(4,), folder=tmp_path)
    assert ct.describe() == "eager forward" and ct.runners == {}
    # a stand-in for `python -m eagle2 compile`: writes the packages one by one, as it would
    copier = ("import shutil, sys, time\n"
              "for name in sys.argv[3:]:\n"
              "    time.sleep(1.0)\n"
              "    for ext in ('.blob', '.so'):\n"
              "        shutil.copy(f'{sys.argv[1]}/{name}{ext}', f'{sys.argv[2]}/{name}{ext}.part')\n"
              "        shutil.move(f'{sys.argv[2]}/{name}{ext}.part', f'{sys.argv[2]}/{name}{ext}')\n")
    names = ["T1", "T4", f"{ct.head_set.prefix}T4"]
    ct.watch(subprocess.Popen([sys.executable, "-c", copier, str(src), str(tmp_path), *names]))
    deadline = time.monotonic() + 60
    while not ct.complete() and time.monotonic() < deadline:
        time.sleep(0.2)
    assert ct.complete() and sorted(ct.runners) == [1, 4]
    ct._watcher.join(timeout=30)
    assert not ct._watcher.is_alive() and ct.worker.poll() == 0
    assert ct.describe().startswith("compiled forward")
    ct.stop()


def test_each_size_takes_its_fastest_option_and_runs_are_described():
    from eagle2.model import routes
    times = {1: {"eager": 2.0, "T4": 3.0, "T8": 4.0}, 2: {"eager": 3.0, "T4": 3.0, "T8": 4.0},
             3: {"eager": 5.0, "T4": 3.0, "T8": 4.0}, 4: {"eager": 6.0, "T4": 3.0, "T8": 4.0},
             5: {"eager": 7.0, "T8": 4.0}, 6: {"eager": 3.9, "T8": 4.0}}
    chosen = routes.fastest(times)
    assert chosen == {1: None, 2: None, 3: 4, 4: 4, 5: 8, 6: None}  # a tie goes to eager
    assert routes.describe(chosen) == "1-2 eager, 3-4 as 4, 5 as 8, 6 eager"


@pytest.mark.slow
def test_each_tree_size_runs_on_the_forward_timed_fastest(tiny, compiled_tiny, monkeypatch):
    """Once every package is in, every tree size up to the largest bucket is timed eager and
    through each bucket that holds it; it then runs on the fastest (eager: run() returns None), the
    table is kept beside the packages for the next start, and describe() says what was chosen."""
    from eagle2.model import routes
    folder = compiled_tiny.folder
    (folder / routes.FILE).unlink(missing_ok=True)
    real = routes.interleaved_medians
    taken = []

    def rigged(dev, switches, call, repeats):  # really timed, then eager made the winner at size 2
        out = real(dev, switches, call, 1)
        taken.append(dict(out))
        if len(switches) > 1 and len(taken) in (2, 6):  # target size 2, head size 2
            out = {k: (0.0 if k == "eager" else 1.0) for k in out}
        elif len(switches) > 1:
            out = {k: (1.0 if k == "eager" else 0.0 if k == "T4" else 0.5) for k in out}
        return out

    from eagle2.model import timing
    monkeypatch.setattr(routes, "interleaved_medians", rigged)
    monkeypatch.setattr(timing, "interleaved_medians", rigged)   # the target's sizes: the one t(N) harness
    lines = []
    ct = CompiledTarget(tiny.target, tiny.head, buckets=(1, 4), head_buckets=(4,), folder=folder)
    tiny.target.compiled = tiny.head.compiled = ct
    try:
        ct.choose_routes, ct.log = True, lines.append
        ct.poll()
        # target sizes 1-4: eager, T1 (size 1 only), T4; head sizes 1-4: eager, T4 -- each really timed
        assert [sorted(t) for t in taken[:4]] == [["T1", "T4", "eager"], ["T4", "eager"], ["T4", "eager"], ["T4", "eager"]]
        assert all(v > 0 for t in taken for v in t.values())
        assert ct.target.routes == {1: 4, 2: None, 3: 4, 4: 4} and ct.head_set.routes == {1: 4, 2: None, 3: 4, 4: 4}
        c = prefilled(tiny)
        assert ct.run(c, torch.tensor([3, 4]), torch.arange(c.length, c.length + 2), None) is None  # size 2: eager
        assert ct.run(c, torch.tensor([3]), torch.tensor([c.length]), None) is not None
        assert "target 1 as 4, 2 eager, 3-4 as 4, above eager; head 1 as 4, 2 eager, 3-4 as 4" in ct.describe()
        assert lines and "timed each tree size" in lines[0]
        # kept: the next start on this CPU at this thread count reads it instead of timing again
        monkeypatch.setattr(routes, "interleaved_medians", lambda *a: pytest.fail("timed again"))
        monkeypatch.setattr(timing, "interleaved_medians", lambda *a: pytest.fail("timed again"))
        again = CompiledTarget(tiny.target, tiny.head, buckets=(1, 4), head_buckets=(4,), folder=folder)
        again.choose_routes = True
        again.poll()
        assert again.target.routes == ct.target.routes and again.head_set.routes == ct.head_set.routes
    finally:
        tiny.target.compiled = tiny.head.compiled = None
        (folder / routes.FILE).unlink(missing_ok=True)


@pytest.mark.slow
def test_routes_timed_while_a_visitor_decodes_are_neither_used_nor_kept(tiny, compiled_tiny, monkeypatch):
    """The routes are a quiet measurement: a decode starting while they are timed ends the try
    (the load of that moment is not this machine's cost); with no quiet try the packages serve on
    their default routes and nothing is written for the next start."""
    from eagle2.model import routes, timing
    from eagle2.model.activity import DECODING
    folder = compiled_tiny.folder
    (folder / routes.FILE).unlink(missing_ok=True)
    real, sizes = timing.interleaved_medians, []

    def a_visitor_steps_meanwhile(dev, switches, call, repeats):
        sizes.append(len(switches))
        with DECODING:   # a Step in flight while this size is timed
            return real(dev, switches, call, 1)

    monkeypatch.setattr(timing, "interleaved_medians", a_visitor_steps_meanwhile)
    monkeypatch.setattr(routes, "interleaved_medians", a_visitor_steps_meanwhile)
    monkeypatch.setattr(routes.MEASURER, "wait_for_quiet", lambda: True)
    lines = []
    ct = CompiledTarget(tiny.target, tiny.head, buckets=(1, 4), head_buckets=(4,), folder=folder)
    tiny.target.compiled = tiny.head.compiled = ct
    try:
        for ps in ct.sets:
            assert ps.load_landed() is None
        assert routes.choose(ct, lines.append, tries=2) == {}
        assert len(sizes) == 2   # each try gave way after its first size
        assert ct.target.routes == {} and not (folder / routes.FILE).exists()
        assert lines == ["not timed per tree size (no quiet moment): the default routes serve"]
        assert ct.target.bucket(3) == 4   # the default: the smallest bucket holding the size
    finally:
        tiny.target.compiled = tiny.head.compiled = None
        (folder / routes.FILE).unlink(missing_ok=True)


@pytest.mark.slow
def test_attach_loads_buckets_built_beyond_the_defaults(tiny, compiled_tiny, monkeypatch):
    from eagle2.model import compiled
    monkeypatch.setattr(compiled, "package_dir", lambda model: compiled_tiny.folder)
    monkeypatch.setattr(compiled, "BUCKETS", (4, 8))
    try:
        line = attach(tiny, "auto")  # defaults of 4 and 8 here; T1 was built too (compile --buckets 1,4)
        ct = tiny.target.compiled
        assert ct.buckets == (1, 4, 8) and sorted(ct.runners) == [1, 4] and ct.missing() == [("target", 8)]
        assert "`python -m eagle2 compile --threads" in line
    finally:
        tiny.target.compiled = tiny.head.compiled = None


@pytest.mark.slow
def test_a_route_tried_in_one_thread_leaves_the_others_alone(tiny, compiled_tiny):
    import threading
    ps = compiled_tiny.target
    seen = []
    ps.set_trial({3: None})
    try:
        assert ps.bucket(3) is None
        t = threading.Thread(target=lambda: seen.append(ps.bucket(3)))
        t.start()
        t.join(timeout=30)
    finally:
        ps.set_trial({})
    assert seen == [4] and ps.bucket(3) == 4


@pytest.mark.slow
def test_profile_times_the_draft_call_both_ways(tiny, compiled_tiny):
    from eagle2.tools.profile import draft_calls_s
    tiny.head.compiled = compiled_tiny
    try:
        out = draft_calls_s(tiny, grid=(1, 4, 6), context=16, tree=3, repeats=2)
    finally:
        tiny.head.compiled = None
    assert [out[k]["bucket"] for k in (1, 4, 6)] == [4, 4, None]  # 6 is above the head's largest bucket here
    assert all(v["eager"] > 0 and v["compiled"] > 0 for v in out.values())


# ------------------------------------------------------------------ the real default model

@pytest.fixture(scope="module")
def compiled_real(real_bundle, tmp_path_factory):
    """The default model compiled for tree size 4 (1-3 run padded to 4, larger trees eagerly) and
    its head for 4: two minutes or so of compiling on CI's 2 cores, once per test session."""
    ct = CompiledTarget(real_bundle.target, compilable_head(real_bundle), buckets=(4,), head_buckets=(4,),
                        folder=tmp_path_factory.mktemp("aoti-real"))
    ct.build()
    assert ct.complete()
    yield ct
    real_bundle.target.compiled = real_bundle.head.compiled = None


@pytest.mark.slow
def test_real_model_greedy_identity_on_compiled_path(real_bundle, compiled_real):
    """Plain and EAGLE-2 decoding through the compiled target and head emit exactly the eager
    plain decoder's tokens on the lossless suite's prompts."""
    from lossless_cases import EAGLE2_COMPACT, PROMPTS
    prompts = PROMPTS[:3]

    def run(policy, p, **kw):
        d = Decoder(real_bundle, policy, max_new_tokens=48, record=False, **kw)
        d.start(p["prompt"], raw=p.get("raw", False))
        d.generate()
        return d.generated

    real_bundle.target.compiled = real_bundle.head.compiled = None
    refs = [run("plain", p) for p in prompts]
    real_bundle.target.compiled = real_bundle.head.compiled = compiled_real
    try:
        for p, ref in zip(prompts, refs):
            assert run("plain", p) == ref
            assert run("eagle2", p, total_tokens=4, depth=3, top_k=2) == ref
            assert run("eagle2", p, **EAGLE2_COMPACT) == ref  # verification on the eager path, drafting alike
            assert run("eagle2-auto", p) == ref
    finally:
        real_bundle.target.compiled = real_bundle.head.compiled = None


@pytest.mark.slow
def test_one_token_and_n_token_logits_are_bitwise_equal_row_for_row(real_bundle, compiled_real):
    """On the real model, through one package (one kernel shape, one packing): a token's logits
    from a one-token forward equal, bit for bit, its row in a four-token forward over the same
    context, whether the other rows are its siblings (each sees the cache and itself) or its
    descendants (a chain: row 0 sees the cache and itself). Rows never leak into each other."""
    m = real_bundle.target
    ids = real_bundle.tokenizer("Speculative decoding verifies a tree of guesses in one forward. " * 3)["input_ids"]
    cache = m.new_cache(256)
    m.forward_cached(cache, torch.tensor(ids), torch.arange(len(ids)))
    cache.advance(len(ids))
    L = len(ids)
    toks = torch.tensor([1010, 28, 9038, 355])
    alone = [compiled_real.run(cache, toks[i:i + 1], torch.tensor([L]), None)[1][0] for i in range(4)]
    siblings = compiled_real.run(cache, toks, torch.full((4,), L), torch.eye(4, dtype=torch.bool))[1]
    chain = compiled_real.run(cache, toks, torch.arange(L, L + 4), None)[1]
    for i in range(4):
        assert torch.equal(siblings[i], alone[i]), i
    assert torch.equal(chain[0], alone[0])
    eager = m.logits(m.forward_cached(cache, toks[:1], torch.tensor([L])))[0]
    assert (eager - alone[0]).abs().max().item() < ATOL  # and the eager forward agrees to rounding


# ------------------------------------------------------------------ the CLIs around it

@pytest.mark.slow
def test_bench_eager_rows_detach_the_compiled_forward(tiny, compiled_tiny):
    from eagle2.tools.bench import Row, forward_path, summarise
    tiny.target.compiled = tiny.head.compiled = compiled_tiny
    try:
        with forward_path(tiny, Row.parse("plain@eager")):
            assert tiny.target.compiled is None and tiny.head.compiled is None
        assert tiny.target.compiled is compiled_tiny and tiny.head.compiled is compiled_tiny
        with forward_path(tiny, Row.parse("eagle2-auto@eager-head")):
            assert tiny.target.compiled is compiled_tiny and tiny.head.compiled is None
        with forward_path(tiny, Row.parse("eagle2-auto")):
            assert tiny.target.compiled is compiled_tiny and tiny.head.compiled is compiled_tiny
    finally:
        tiny.target.compiled = tiny.head.compiled = None
    row = dict(question_id=1, category="c", repeat=0, new_tokens=10, target_forwards=10, token_ids=[1] * 10)
    rows = [dict(row, policy="plain", wall_s=1.0), dict(row, policy="plain@eager", wall_s=2.0),
            dict(row, policy="eagle2", wall_s=0.5, target_forwards=5)]
    s = summarise(rows, ["plain", "plain@eager", "eagle2"], greedy=True)["policies"]
    assert s["eagle2"]["speedup"] == 2.0 and s["eagle2"]["speedup_vs_plain_eager"] == 4.0
    assert s["plain@eager"]["identical_to_plain"] == 1.0


@pytest.mark.parametrize("args,msg", [(["--buckets", "0,4"], "--buckets"), (["--buckets", "x"], "--buckets"),
                                      (["--device", "cuda"], "CPU")])
def test_compile_cli_rejects_bad_input(args, msg, capsys):
    from eagle2.tools.cli import main as cli_main
    assert cli_main(["compile", *args]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and msg in err and "Traceback" not in err


@pytest.fixture(scope="module")
def eagle3_tiny(tiny_target, tmp_path_factory):
    """A 4-layer tiny target with a random EAGLE-3 head reading layers 1, 2 and 4 (4 = the last
    layer's output), and its compiled target packages for 1 and 4 rows (they return those states)."""
    from eagle2.model.head3 import Eagle3Head, save_head3
    from eagle2.model.loading import load_target
    folder, _ = tiny_target("llama4", layers=4)
    tgt = load_target(folder, torch.device("cpu"), torch.float32)
    torch.manual_seed(5)
    head = Eagle3Head(tgt.args, (1, 2, 4))
    with torch.no_grad():
        for name, p in head.named_parameters():
            p.copy_(1.0 + 0.2 * torch.randn(p.shape) if "norm" in name else 0.1 * torch.randn(p.shape))
    head.attach(tgt.lm_head.weight.detach())
    hdir = tmp_path_factory.mktemp("e3head")
    save_head3(head, hdir, dtype=torch.float32)
    b = load_bundle(str(folder), str(hdir))
    assert b.target.aux_layers == (1, 2, 4) and compilable_head(b) is b.head
    ct = CompiledTarget(b.target, b.head, buckets=(1, 4), head_buckets=(4,), folder=tmp_path_factory.mktemp("aoti3"))
    ct.build()
    yield b, ct
    b.target.compiled = b.head.compiled = None


@pytest.mark.slow  # its fixture compiles the tiny EAGLE-3 packages (a minute)
def test_eagle3_head_function_equals_the_eager_head(eagle3_tiny):
    """HeadForward of an EAGLE-3 head run eagerly (what is exported) against Eagle3Head.forward_cached
    + draft_logprobs, for fused target states (fc outside the function) and fed-back outputs."""
    b, _ = eagle3_tiny
    h = b.head
    g = torch.Generator().manual_seed(8)
    for T, tree, fused in ((1, 0, True), (3, 4, False), (5, 2, True)):
        cache, feats, toks, pos, tm = head_call_inputs(b, T, tree, g)
        if fused:
            feats = 3 * torch.randn(T, 3 * h.args.dim, generator=g)
        start = cache.length + tree
        past, new = split_masks(cache.length, start, tm, T, tm.device)
        past = torch.ones(T, start, dtype=torch.bool) if past is None else past
        out, logp, new_k, _ = HeadForward(h)(h.embed_tokens(toks), h.hidden_input(feats), *h.rope_at(pos),
                                             cache.k[0], cache.v[0], past, new)
        ref = h.forward_cached(cache, feats, toks, pos, start, tm)
        assert (out - ref).abs().max().item() < 1e-5
        assert (logp - h.draft_logprobs(ref)).abs().max().item() < 1e-4
        assert (new_k - cache.k[0, :, :, start:start + T]).abs().max().item() < 1e-5


@pytest.mark.slow
def test_eagle3_head_package_equals_the_eager_head(eagle3_tiny):
    """The EAGLE-3 head's package (bucket 4) gives the eager head's outputs and K/V for fused
    target states and fed-back outputs, padded rows included; above the bucket it defers to eager."""
    b, ct = eagle3_tiny
    h = b.head
    g = torch.Generator().manual_seed(9)
    for T, tree, fused in ((1, 0, True), (3, 0, True), (4, 5, False), (2, 9, False), (6, 0, True)):
        c1, feats, toks, pos, tm = head_call_inputs(b, T, tree, g)
        c2 = head_call_inputs(b, T, tree, torch.Generator().manual_seed(0))[0]
        c2.k.copy_(c1.k)
        c2.v.copy_(c1.v)
        if fused:
            feats = 3 * torch.randn(T, 3 * h.args.dim, generator=g)
        start = c1.length + tree
        mask = tm if tree or T == 1 else None
        out = ct.run_head(c1, feats, toks, pos, start, mask)
        if T > 4:
            assert out is None
            continue
        ref = h.forward_cached(c2, feats, toks, pos, start, mask)
        assert (out[0] - ref).abs().max().item() < ATOL
        assert (out[1] - h.draft_logprobs(ref)).abs().max().item() < ATOL
        assert torch.allclose(c1.k[0, :, :, start:start + T], c2.k[0, :, :, start:start + T], atol=1e-5)


@pytest.mark.slow
def test_eagle3_target_packages_return_the_aux_states_and_decode_exactly(eagle3_tiny):
    """An EAGLE-3 head's target on the compiled path: the packages give the states entering the aux
    layers (as forward_draft does) with the logits, and greedy decoding through them emits the
    eager plain decoder's tokens."""
    b, ct = eagle3_tiny
    m = b.target
    g = torch.Generator().manual_seed(4)
    for T in (1, 3, 4):
        toks = torch.randint(0, m.args.vocab_size, (T,), generator=g)
        tm = random_tree_mask(T, g)
        c1, c2 = prefilled(b), prefilled(b)
        pos = torch.arange(c1.length, c1.length + T)
        head_in, logits = ct.run(c1, toks, pos, tm)
        feats, ref_in = m.forward_draft(c2, toks, pos, tm)
        assert head_in.shape == (T, 3 * m.args.dim)
        assert (head_in - ref_in).abs().max().item() < ATOL
        assert (logits - m.logits(feats)).abs().max().item() < ATOL
    prompts = [[5, 17, 33, 2, 9], list(range(3, 20))]
    m.compiled = None
    refs = [decode(b, "plain", p) for p in prompts]
    m.compiled = b.head.compiled = ct  # the target's packages and the head's
    try:
        for p, ref in zip(prompts, refs):
            for policy, kw in (("static", {}), ("eagle2", dict(total_tokens=4, depth=3, top_k=2))):
                assert decode(b, policy, p, **kw) == ref, (policy, p)
    finally:
        m.compiled = b.head.compiled = None


@pytest.mark.slow
def test_every_package_points_at_one_copy_of_the_weights(tiny, compiled_tiny):
    """The target's buckets and the head's package hold no weights of their own: each constant is
    the model's own tensor or the one shared packed copy (constants.py), and that copy is no
    larger than one package's packed weights."""
    model_ptrs = {t.data_ptr() for m in (tiny.target, tiny.head) for t in m.state_dict().values()}
    model_ptrs.add(tiny.head.lm_weight.data_ptr())
    shared = {t.data_ptr() for t in compiled_tiny.constants._by_content.values()}
    per_package = []
    for s in compiled_tiny.sets:
        for T, runner in s.runners.items():
            consts = runner.container.extract_constants_map(False)
            assert consts, (s.kind, T)
            ptrs = {t.data_ptr() for t in consts.values()}
            assert ptrs <= model_ptrs | shared, (s.kind, T)
            per_package.append(sum(t.numel() * t.element_size() for t in consts.values()
                                   if t.data_ptr() in shared))
    assert compiled_tiny.constants.bytes_held() <= sum(per_package)
    target_packed = [n for n in per_package[:len(compiled_tiny.runners)]]
    assert len(set(target_packed)) == 1  # the target's buckets pack alike: they share every copy


@pytest.mark.slow  # builds the extension (30 s)
def test_the_gil_free_runner_builds_and_runs_a_package(compiled_tiny, tiny):
    """The packages run through the extension that lets go of the GIL (nogil.py), with the results
    of torch's own binding."""
    from eagle2.model import nogil
    assert nogil.build() and nogil.built().exists()
    run, releases = nogil.run_function()
    assert releases
    runner = compiled_tiny.target.runners[4]
    m = tiny.target
    cache = prefilled(tiny)
    args = [torch.arange(4), *m.rope_at(torch.arange(9, 13)), cache.k, cache.v,
            torch.ones(4, 9, dtype=torch.bool), torch.ones(4, 4, dtype=torch.bool).tril()]
    ours, theirs = run(runner.container, args), runner.container.run(args)
    assert all(torch.equal(a, b) for a, b in zip(ours, theirs))
