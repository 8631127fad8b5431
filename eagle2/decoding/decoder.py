"""Decoders with a step API: plain autoregressive and speculative (any tree policy).

A sequence between cycles is one value, `DecodeState` (state.py, docs/algorithms.md §2): the target's KV
cache of the committed tokens x_0..x_{L-1}, the `root` (the next token, sampled by the target and
not yet run through it), the `pending` (target feature, next token) pairs the draft head has not
absorbed yet, the head's `reading` of the context once it has, the counters and the random streams.
A cycle reads a state and returns the next one (`Decoder.speculate`, read it top to bottom):
absorb pending -> draft a tree under root -> verify root + tree in one target forward -> accept a
path -> commit its K/V -> the bonus token is the next root. The decoder holds its configuration
(bundle, policy, sampling, limits) and its current state; what people see of a run (the text, the
annotated trees, the trace) is kept by observers of its steps (text.py, recording.py).
"""
from __future__ import annotations

import copy
import time
from dataclasses import replace

import torch

from ..cycle.drafting import HeadRunner
from ..cycle.sampling import SamplingParams, choose
from ..cycle.trace import StepTrace, Trace
from ..cycle.tree_arrays import TreeArrays
from ..errors import UserError, check
from ..model.activity import DECODING
from ..model.chat import prompt_ids
from ..model.llama import KVCache
from ..model.loading import Bundle
from ..model.qcycle import KernelCycle
from ..model.stopwatch import syncer
from ..model.tree_modes import TREE_TOPK
from ..phases import PhaseClock, grouped, key
from ..policies.base import TreePolicy
from ..policies.registry import PLAIN, is_plain, make_policy
from .prefill import Prefill, checked_ids, prefill
from .recording import TraceRecorder, preview_trace, run_meta
from .state import Cycle, DecodeState, Reading
from .text import TextStream

MAX_NEW_TOKENS = 4096


class Decoder:
    """One prompt's decoding, cycle by cycle. `policy`: a registry name, a TreePolicy, or None (or
    "plain") for plain decoding; no default here (registry.default_policy chooses one for a device)."""

    def __init__(self, bundle: Bundle, policy, sampling: SamplingParams | None = None,
                 max_new_tokens: int = 128, record: bool = True, **policy_kw):
        self.b = bundle
        self._sync = syncer(bundle.device)   # before each clock reading (a GPU's work is asynchronous)
        self.sampling = sampling or SamplingParams()
        self.sampling.validate()
        check(isinstance(max_new_tokens, int) and 1 <= max_new_tokens <= MAX_NEW_TOKENS,
              f"max new tokens must be an integer in [1, {MAX_NEW_TOKENS}] (got {max_new_tokens!r}).")
        self.max_new_tokens = max_new_tokens
        self.set_policy(policy, **policy_kw)
        # a greedy cycle whole in one call of the kernels, where the target and its head run there
        self.kcycle = KernelCycle.of(bundle.forward, bundle.draft)
        self.record = record
        self.state: DecodeState | None = None
        self.text_stream: TextStream | None = None     # observers of the steps, set by start()
        self.recorder: TraceRecorder | None = None

    # ------------------------------------------------------------------ configuration
    def set_policy(self, policy, **kw) -> None:
        """'plain', a registered policy's name (with its parameters), or a TreePolicy (which the
        decoder then owns: it learns from the cycles); takes effect from the next cycle."""
        if isinstance(policy, str | None) and is_plain(policy):
            self.policy = None
            return
        if isinstance(policy, str):
            policy = make_policy(policy, **kw)
        elif isinstance(policy, TreePolicy):
            policy.validate()
        else:
            raise UserError(f"Not a tree policy: {policy!r}.")
        policy.prepare(self.b)  # per-model set-up outside the timed steps
        self.policy = policy

    @property
    def policy_name(self) -> str:
        return PLAIN if self.policy is None else self.policy.name

    # ------------------------------------------------------------------ start
    # Each start, step and preview counts as decoding in flight (model/activity.py): a t(N)
    # measurement that overlaps one is not this machine's cost and is not cached.
    @DECODING
    def start(self, prompt: str | None = None, messages: list | None = None, input_ids: list[int] | None = None,
              raw: bool = False, prefilled: "Prefill | None" = None) -> StepTrace:
        """Prefill the prompt; emits the first token (cycle 0). With `prefilled` (a Prefill of the
        same prompt's ids by the same bundle: the race's decoders share one), its K/V are copied
        and its forward's seconds charged as this decoder's own, as a run alone would pay them."""
        ids = checked_ids(self.b, list(input_ids)) if input_ids is not None else self.ids_of(prompt, messages, raw)
        ctx = self.b.args.max_positions
        seed = self.sampling.seed if self.sampling.seed is not None else 0
        accept_gen = torch.Generator(device="cpu").manual_seed(seed)
        draft_gen = torch.Generator(device="cpu").manual_seed(((self.sampling.seed or 0) * 1_000_003 + 7919) % (2 ** 63))
        slack = 64 + (self.policy.total_tokens if self.policy is not None else 0)
        cap = min(len(ids) + self.max_new_tokens + slack, ctx + slack)
        cache, hcache = self.b.forward.new_cache(cap), self.b.draft.new_cache(cap + 1024)
        clock = self.clock()
        if prefilled is None:
            prefilled = prefill(self.b, ids, cache, clock)
        else:
            check(prefilled.ids == tuple(ids) and prefilled.bundle is self.b,
                  "A shared prefill must be of the same prompt by the same model.")
            for phase, seconds in prefilled.seconds.items():
                clock.add(phase, seconds)
            prefilled.copy(cache)
            clock.lap("cache_commit")
        root = choose(prefilled.logits, self.sampling, accept_gen)
        clock.lap("accept")
        cache.advance(len(ids))
        s = DecodeState(prompt_ids=tuple(ids), cache=cache, hcache=hcache, root=root,
                        pending=(prefilled.feats, ids[1:] + [root]), reading=None,
                        accept_gen=accept_gen, draft_gen=draft_gen, target_forwards=1)
        clock.lap("cache_commit")
        self.state = s
        self.text_stream = TextStream(self.b.tokenizer)
        self.recorder = TraceRecorder(self.b, run_meta(self))
        return self._conclude(s, [root], None, clock.timings())

    def ids_of(self, prompt: str | None = None, messages: list | None = None, raw: bool = False) -> list[int]:
        """The ids `start` would decode after (checked against the model's context)."""
        return checked_ids(self.b, prompt_ids(self.b.tokenizer, prompt, messages, raw))

    # ------------------------------------------------------------------ one cycle
    @DECODING
    def step(self) -> StepTrace:
        """One cycle: draft -> verify -> accept -> commit (or one plain token)."""
        s = self._live_state()
        check(s.finished is None, f"Generation has finished ({s.finished}); reset to start again.")
        if self.policy is None:
            s, tok, clock = self.plain_step(s)
            return self._conclude(s, [tok], None, clock.timings())
        s, c = self.speculate(s, self.policy, s.draft_gen, s.accept_gen)
        return self._conclude(s, c.path_tokens + [c.bonus], c, c.timings)

    def speculate(self, s: DecodeState, policy: TreePolicy, draft_gen: torch.Generator,
                  accept_gen: torch.Generator, commit: bool = True) -> tuple[DecodeState, Cycle]:
        """The speculative cycle (docs/algorithms.md §2): state in, state out. Without commit (the
        page's preview of another policy on this context) the state that comes back is the one
        that went in, absorbed; the policy learns nothing."""
        b, dev = self.b, self.b.device
        clock = self.clock()   # the cycle's phases (eagle2/phases.py): each lap closes one
        # 1. The head reads what the last cycle committed (perhaps already: Decoder.absorb).
        s = self.absorbed(s, clock, preview=not commit)
        # 2. Draft a tree under the root: the policy decides its shape.
        hc = s.hcache
        runner = HeadRunner(b.draft, hc, s.reading.g, base_pos=hc.length - 1, root_logp=s.reading.logp,
                            sampling=self.sampling, gen=draft_gen, clock=clock, root_top=s.reading.top,
                            root_seconds=s.reading.seconds)
        if commit and self.kcycle is not None and self.sampling.greedy and policy.native_tree(runner):
            return self.speculate_in_kernels(s, policy, runner, clock)
        tree = policy.draft(runner, s.root)
        clock.lap("draft_tree")
        # 3. Verify the root and the kept nodes in one target forward (tree attention; their K/V
        #    land after the committed tokens, in this state's cache view); greedy decoding reads
        #    only each row's argmax, which the forward gives beside the logits.
        L = s.cache.length
        cache = self._room(s.cache, L + tree.n_kept)
        vb = tree.layout(L, dev)
        best = torch.empty(tree.n_kept, dtype=torch.long) if self.sampling.greedy else None
        feats, logits = b.forward.verify(cache, vb.tokens, vb.positions, vb.mask, clock=clock, best=best)
        clock.lap("target_forward")
        # 4. Accept a path by the policy's rule (lossless unless it says otherwise) and a bonus token.
        path_pos, bonus = policy.accept(tree, vb, logits, self.sampling, accept_gen,
                                        best=None if best is None else best.tolist())
        clock.lap("accept")
        c = Cycle(drafted=tree, root=s.root, vb=vb, feats=feats, logits=logits, path_pos=path_pos, bonus=bonus,
                  timings={})
        if not commit:
            c.timings = clock.timings()
            return s, c
        # what t(N) measures: the forward and its inputs
        policy.observe(tree.n_kept, clock.spent["verify_inputs"] + clock.spent["target_forward"])
        policy.observe_acceptance(tree, vb, path_pos)
        clock.lap("policy")
        # 5. Commit: keep the accepted nodes' K/V, give their features to the head next cycle; the
        #    bonus token becomes the next root.
        keep = [0] + path_pos
        cache.commit(torch.tensor([L + p for p in keep], device=dev))
        s = replace(s, cache=cache, root=bonus, pending=(feats[keep], c.path_tokens + [bonus]), reading=None,
                    target_forwards=s.target_forwards + 1, draft_calls=s.draft_calls + tree.draft_calls)
        clock.lap("cache_commit")
        c.timings = clock.timings()
        return s, c

    def speculate_in_kernels(self, s: DecodeState, policy: TreePolicy, runner: HeadRunner,
                             clock: PhaseClock) -> tuple[DecodeState, Cycle]:
        """Steps 2-5 of `speculate` for greedy decoding in one call of the kernels (model/qcycle.py:
        the tree, the forward, the path, the commit) and the head's reading of what it kept, which
        the next cycle starts from: the same calls in the same order as above, so the same tokens,
        trees and policy state (tests/test_native_cycle.py). The policy sets the call's inputs
        before it and learns from what it left after."""
        dev = self.b.device
        cyc = policy.begin(runner)
        shape = policy.top_k, policy.depth, policy.total_tokens
        L = s.cache.length
        cache, hc = self._room(s.cache, L + self.kcycle.rows(*shape)), copy.copy(s.hcache)
        clock.lap("draft_tree")
        r = self.kcycle.run(cache, hc, s.root, s.reading.g, s.reading.top, *shape, policy.native_inputs(cyc))
        sec = r.seconds   # the call's wall time split as it measured its parts; the rest, its inputs
        clock.lap_split({"draft_head": sec["head"] + sec["absorb"], "draft_tree": sec["tree"] - sec["head"],
                         "target_forward": sec["forward"], "accept": sec["accept"], "cache_commit": sec["commit"]},
                        rest="verify_inputs")
        tree = TreeArrays.filled(r.cols, r.tree)
        policy.native_learn(tree, r.tree, cyc)
        vb = tree.layout(L, dev)
        policy.observe(tree.n_kept, sec["forward"])
        policy.observe_acceptance(tree, vb, r.path)
        c = Cycle(drafted=tree, root=s.root, vb=vb, feats=r.feats, logits=r.logits, path_pos=r.path, bonus=r.bonus,
                  timings={})
        s = replace(s, cache=cache, hcache=hc, root=r.bonus, pending=None,
                    reading=Reading(r.g, r.logp, r.top, sec["absorb"], charged=True),
                    target_forwards=s.target_forwards + 1, draft_calls=s.draft_calls + tree.draft_calls)
        clock.lap("policy")
        c.timings = clock.timings()
        return s, c

    def absorbed(self, s: DecodeState, clock: PhaseClock | None = None, preview: bool = False) -> DecodeState:
        """The state with the pending (target feature, next token) pairs fed to the head: its last
        output predicts the feature at the root, whose logits give the root's children. The state
        given stays as it was (the head's K/V go past its head cache's length). With `clock` (a
        cycle's), the absorbing's seconds are charged to its draft_head phase, now or, when it ran
        earlier, as it took then; a reading the cycle that took it counted already (`charged`: the
        kernels' one call) only in a `preview`, whose cycle is another policy's whole."""
        if s.reading is not None:
            if clock is not None and (preview or not s.reading.charged):
                clock.add("draft_head", s.reading.seconds)
            return s
        clock = clock or self.clock()
        feats, toks = s.pending
        hc, n, dev = copy.copy(s.hcache), len(toks), self.b.device
        g, logp, top = self.b.draft.step(hc, feats, torch.tensor(toks, device=dev),
                                         torch.arange(hc.length, hc.length + n, device=dev), hc.length,
                                         k=TREE_TOPK, last_only=True)   # the reading is the last row's
        hc.advance(n)
        seconds = clock.lap("draft_head")
        return replace(s, hcache=hc, pending=None,
                       reading=Reading(g[-1], logp[-1], (top[0][-1], top[1][-1]), seconds))

    def plain_step(self, s: DecodeState) -> tuple[DecodeState, int, PhaseClock]:
        """One target forward on the root: the next token (state, token, the step's clock)."""
        clock = self.clock()
        cache = self._room(s.cache, s.cache.length + 1)
        dev = self.b.device
        best = torch.empty(1, dtype=torch.long) if self.sampling.greedy else None
        _, logits = self.b.forward.verify(cache, torch.tensor([s.root], device=dev),
                                          torch.tensor([cache.length], device=dev), clock=clock, best=best)
        clock.lap("target_forward")
        nxt = int(best[0]) if best is not None else choose(logits[0], self.sampling, s.accept_gen)
        clock.lap("accept")
        cache.advance(1)
        s = replace(s, cache=cache, root=nxt, target_forwards=s.target_forwards + 1)
        clock.lap("cache_commit")
        return s, nxt, clock

    @DECODING
    def absorb(self) -> None:
        """Let the head read the context now, as the first part of the next step (whose drafting
        time includes it): a preview on this context then reads it without absorbing it again."""
        self.state = self.absorbed(self._live_state())

    @DECODING
    def take_reading(self, other: "Decoder") -> bool:
        """The head's reading of the context copied from `other`, a decoder of the same bundle on
        the same context that has absorbed it (the race's comparison decoder after the prompt,
        from the main one): the same head on the same pairs gives the same K/V and reading, so a
        long prompt is read by the head once, not once a decoder. Its seconds count in this
        decoder's next step, as absorbing them itself would. False, and nothing changed, where the
        two are not on the same context or this one has nothing to absorb."""
        s, o = self._live_state(), other._live_state()
        if (other.b is not self.b or s.pending is None or o.reading is None or s.hcache.length != 0
                or (o.prompt_ids, o.generated) != (s.prompt_ids, s.generated)
                or o.hcache.length != len(s.pending[1]) or o.hcache.length > s.hcache.max_len):
            return False
        n, hc = o.hcache.length, copy.copy(s.hcache)
        hc.k[:, :, :, :n] = o.hcache.k[:, :, :, :n]
        hc.v[:, :, :, :n] = o.hcache.v[:, :, :, :n]
        hc.length = n
        r = o.reading
        top = None if r.top is None else tuple(t.clone() for t in r.top)
        self.state = replace(s, hcache=hc, pending=None,
                             reading=Reading(r.g.clone(), r.logp.clone(), top, r.seconds))
        return True

    @DECODING
    def preview(self, policy) -> StepTrace:
        """The cycle another policy would run on the current context, without committing (the
        page's side-by-side view), numbered like the next step. A pure function of the state: a
        policy object runs as a fork (it reads what the policy learnt and teaches it nothing), the
        random streams are the preview's own, and the state is not changed."""
        s = self._live_state()
        check(s.finished is None, "Nothing to preview: start a prompt first.")
        policy = make_policy(policy) if isinstance(policy, str) else policy.fork()
        s, c = self.speculate(s, policy, torch.Generator().manual_seed(s.cycle + 7919),
                              torch.Generator().manual_seed(s.cycle), commit=False)
        return preview_trace(self.b, s.cycle, s.root, c, policy.name, self.sampling)

    def generate(self) -> Trace:
        if not self.started:
            raise UserError("Start a prompt first.")
        while self.finished is None:
            self.step()
        return self.trace

    def release(self) -> None:
        """Free what the sequence holds in memory (KV caches, features); its counts, text and trace
        stay. It cannot step again."""
        if self.state is not None:
            self.state = replace(self.state, cache=None, hcache=None, pending=None, reading=None)
        if self.kcycle is not None:   # its arrays: the last cycle's logits, the rows it verified
            self.kcycle.release()

    # ------------------------------------------------------------------ internals
    def _live_state(self) -> DecodeState:
        check(self.state is not None, "Start a prompt first.")
        check(self.state.cache is not None, "This decoder's memory was freed; start a prompt again.")
        return self.state

    def _now(self) -> float:
        self._sync()
        return time.perf_counter()

    def clock(self) -> PhaseClock:
        """A clock for one step, started now (eagle2/phases.py), reading this decoder's time."""
        return PhaseClock(self._now)

    def _room(self, cache: KVCache, n: int) -> KVCache:
        """A view of the cache for this cycle, with room for n slots (a larger copy if need be)."""
        if n <= cache.max_len:
            return copy.copy(cache)
        new = self.b.forward.new_cache(n + 64)
        new.k[:, :, :, : cache.length] = cache.k[:, :, :, : cache.length]
        new.v[:, :, :, : cache.length] = cache.v[:, :, :, : cache.length]
        new.length = cache.length
        return new

    def _conclude(self, s: DecodeState, toks: list[int], c: Cycle | None, timings: dict) -> StepTrace:
        """Apply the stop rules to the tokens a cycle produced, make it the decoder's state, and
        report the step to the observers (the text, the trace)."""
        eos = self.b.eos_ids
        out, finished = [], s.finished
        for t in toks:
            out.append(t)
            if t in eos:
                finished = "eos"
                break
        room = max(0, self.max_new_tokens - len(s.generated))
        if len(out) >= room:
            out = out[:room]
            finished = finished or "max_new_tokens"
        if s.cache.length + 2 >= self.b.args.max_positions - 1:
            finished = finished or "context"
        spent = tuple((k, v + timings[key(k)]) for k, v in s.spent)
        self.state = s = replace(s, generated=s.generated + tuple(out), finished=finished, spent=spent,
                                 cycle=s.cycle + 1)
        st = StepTrace(
            cycle=s.cycle - 1, policy=self.policy_name, new_tokens=out, new_texts=[],
            accepted_len=0 if c is None else len(c.path_pos), bonus=None if c is None else c.bonus,
            timings=timings,
            cumulative={"tokens": len(s.generated), "target_forwards": s.target_forwards,
                        "wall_s": self.wall, "draft_calls": s.draft_calls},
            # the tree as lists only where a trace keeps it (a bench's or a tool's steps draw none)
            tree=None if c is None or not self.record else c.tree, accepted_path=[] if c is None else c.accepted_pool,
            root=None if c is None else c.root, finished=finished,
            text_delta=self.text_stream.push(out) + (self.text_stream.finish() if finished else ""))
        if self.record:
            self.recorder.record(st, c, self.sampling)
        return st

    # ------------------------------------------------------------------ what the state says
    @property
    def started(self) -> bool:
        return self.state is not None

    @property
    def finished(self) -> str | None:
        return None if self.state is None else self.state.finished

    @property
    def generated(self) -> list[int]:
        return [] if self.state is None else list(self.state.generated)

    @property
    def prompt_ids(self) -> list[int]:
        return list(self.state.prompt_ids)

    @property
    def cycle(self) -> int:
        return self.state.cycle

    @property
    def target_forwards(self) -> int:
        return self.state.target_forwards

    @property
    def draft_calls(self) -> int:
        return self.state.draft_calls

    @property
    def phases(self) -> dict[str, float]:
        """Seconds spent in each phase of a cycle (eagle2/phases.py), over every step."""
        return dict(self.state.spent)

    @property
    def split(self) -> dict[str, float]:
        """Seconds spent drafting, verifying and committing, over every step."""
        return grouped(self.phases)

    @property
    def text(self) -> str:
        return "" if self.text_stream is None else self.text_stream.text

    @property
    def trace(self) -> Trace:
        return self.recorder.trace

    @property
    def wall(self) -> float:
        """Seconds of this decoder's own work: every phase of every step."""
        return sum(self.phases.values())

    @property
    def tau(self) -> float:
        return len(self.state.generated) / max(1, self.state.target_forwards)

    def summary(self) -> dict:
        s = self.state
        return {"policy": self.policy_name, "text": self.text, "token_ids": list(s.generated),
                "new_tokens": len(s.generated), "target_forwards": s.target_forwards,
                "tau": self.tau, "wall_s": self.wall, **self.split,
                "phases_s": self.phases,
                "tokens_per_s": len(s.generated) / self.wall if self.wall > 0 else 0.0,
                "draft_calls": s.draft_calls, "finished": s.finished,
                "lossy": self.policy is not None and self.policy.lossy,
                **({"policy_stats": self.policy.summary_stats()} if self.policy is not None else {})}
