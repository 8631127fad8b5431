"""Decoders with a step API: plain autoregressive and speculative (any tree policy).

State of one sequence (docs/algorithms.md §2):
- the target's KV cache holds the committed tokens x_0..x_{L-1};
- `root` is the next token (sampled by the target, not yet run through it);
- `pending` are (target feature, next token) pairs the draft head has not absorbed yet (the
  feature is what the head reads: the final features, or EAGLE-3's fused layers).
A speculative cycle (`Decoder.speculate`, read it top to bottom): absorb pending -> draft a tree
under root -> verify root + tree in one target forward -> accept a path -> commit its K/V -> the
bonus token is the next root. What people see of a run (texts, annotated trees, the trace) is
recording.py's.
"""
from __future__ import annotations

import time
from dataclasses import dataclass

import torch

from ..cycle.drafting import HeadRunner
from ..cycle.layout import VerifyBatch, layout
from ..cycle.sampling import SamplingParams, choose
from ..cycle.trace import StepTrace, Trace
from ..cycle.tree import DraftTree
from ..errors import UserError, check
from ..model.activity import DECODING
from ..model.chat import prompt_ids
from ..model.llama import KVCache
from ..model.loading import Bundle
from ..model.timing import sync
from ..policies.base import TreePolicy
from ..policies.registry import PLAIN, is_plain, make_policy
from .recording import TraceRecorder, preview_trace

MAX_NEW_TOKENS = 4096


class Decoder:
    def __init__(self, bundle: Bundle, policy="eagle2", sampling: SamplingParams | None = None,
                 max_new_tokens: int = 128, record: bool = True, **policy_kw):
        self.b = bundle
        self.sampling = sampling or SamplingParams()
        self.sampling.validate()
        check(isinstance(max_new_tokens, int) and 1 <= max_new_tokens <= MAX_NEW_TOKENS,
              f"max new tokens must be an integer in [1, {MAX_NEW_TOKENS}] (got {max_new_tokens!r}).")
        self.max_new_tokens = max_new_tokens
        self.set_policy(policy, **policy_kw)
        self.record = record
        self.started = False

    # ------------------------------------------------------------------ configuration
    def set_policy(self, policy, **kw) -> None:
        """'plain', a registered policy's name (with its parameters), or a TreePolicy; takes effect
        from the next cycle."""
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
              raw: bool = False) -> StepTrace:
        """Prefill the prompt; emits the first token (cycle 0)."""
        ids = list(input_ids) if input_ids is not None else prompt_ids(self.b.tokenizer, prompt, messages, raw)
        check(len(ids) >= 1, "The prompt is empty: type something first.")
        ctx = self.b.target.args.max_positions
        check(len(ids) + 2 <= ctx,
              f"The prompt is {len(ids)} tokens long; this model's context is {ctx} tokens. Shorten it.")
        dev = self.b.device
        self.prompt_ids = ids
        self.generated: list[int] = []
        self.finished: str | None = None
        self.cycle = 0
        self.target_forwards = 0
        self.draft_calls = 0
        self.split = {"draft_s": 0.0, "verify_s": 0.0, "commit_s": 0.0}  # where the wall time went
        self.text = ""
        self.gen = torch.Generator(device="cpu")
        self.gen.manual_seed(self.sampling.seed if self.sampling.seed is not None else 0)
        # policies that sample their drafts (DySpec) draw from their own stream, seeded alike
        self.draft_gen = torch.Generator(device="cpu")
        self.draft_gen.manual_seed(((self.sampling.seed or 0) * 1_000_003 + 7919) % (2 ** 63))
        slack = 64 + (self.policy.total_tokens if self.policy is not None else 0)
        cap = min(len(ids) + self.max_new_tokens + slack, ctx + slack)
        self.cache: KVCache = self.b.target.new_cache(cap)
        self.hcache: KVCache = self.b.head.new_cache(cap + 1024)
        self.recorder = TraceRecorder(self)

        t0 = self._now()
        tokens = torch.tensor(ids, dtype=torch.long, device=dev)
        feats, head_feats = self.b.target.forward_draft(self.cache, tokens, torch.arange(len(ids), device=dev))
        self.cache.advance(len(ids))
        root = choose(self.b.target.logits(feats[-1]), self.sampling, self.gen)
        self.target_forwards = 1
        self.pending = (head_feats, ids[1:] + [root])
        self.root_g = self.root_logp = None
        self.root = root
        self.started = True
        dt = self._now() - t0
        return self._emit([root], None, {"draft_s": 0.0, "verify_s": dt, "commit_s": 0.0})

    # ------------------------------------------------------------------ one cycle
    @DECODING
    def step(self) -> StepTrace:
        """One cycle: draft -> verify -> accept -> commit (or one plain token)."""
        check(self.started, "Start a prompt first.")
        check(self.finished is None, f"Generation has finished ({self.finished}); reset to start again.")
        if self.policy is None:
            return self._plain_step()
        c = self.speculate(self.policy, self.draft_gen, self.gen)
        return self._emit(c.path_tokens + [c.bonus], c, c.timings)

    def speculate(self, policy: TreePolicy, draft_gen: torch.Generator, accept_gen: torch.Generator,
              commit: bool = True) -> "Cycle":
        """The speculative cycle (docs/algorithms.md §2). Without commit (the page's preview of
        another policy on this context) the sequence is left as it was; only the head's reading of
        the new context is kept, for the cycle that follows."""
        b, dev, L = self.b, self.b.device, self.cache.length
        t0 = self._now()
        # 1. The head reads what the last cycle committed (a preview on this context may have
        #    done so already: those seconds still count as this context's drafting).
        earlier_s = 0.0 if self.root_g is None else self._absorb_s
        self.absorb()
        # 2. Draft a tree under the root: the policy decides its shape.
        runner = HeadRunner(b.head, self.hcache, self.root_g, base_pos=self.hcache.length - 1,
                            sampling=self.sampling, gen=draft_gen, root_logp=self.root_logp)
        tree = policy.draft(runner, self.root)
        t1 = self._now()
        # 3. Verify the root and the kept nodes in one target forward (tree attention; their K/V
        #    land after the committed tokens).
        if L + tree.n_kept > self.cache.max_len:
            self._grow(L + tree.n_kept + 64)
        vb = layout(tree, L, dev)
        feats, logits = b.target.forward_logits(self.cache, vb.tokens, vb.positions, vb.mask)
        # 4. Accept a path by the policy's rule (lossless unless it says otherwise) and a bonus token.
        path_pos, bonus = policy.accept(tree, vb, logits, self.sampling, accept_gen)
        t2 = self._now()
        c = Cycle(tree=tree, vb=vb, feats=feats, logits=logits, path_pos=path_pos, bonus=bonus,
                  timings={"draft_s": t1 - t0 + earlier_s, "verify_s": t2 - t1, "commit_s": 0.0})
        if not commit:
            return c
        policy.observe(tree.n_kept, t2 - t1)
        # 5. Commit: keep the accepted nodes' K/V, give their features to the head next cycle; the
        #    bonus token becomes the next root.
        keep = [0] + path_pos
        self.cache.commit(torch.tensor([L + p for p in keep], device=dev))
        self.pending = (feats[keep], c.path_tokens + [bonus])
        self.root_g = self.root_logp = None
        self.root = bonus
        self.target_forwards += 1
        self.draft_calls += tree.draft_calls
        c.timings["commit_s"] = self._now() - t2
        return c

    def absorb(self) -> None:
        """Feed the pending (target feature, next token) pairs to the head; its last output
        predicts the feature at the root, whose logits give the root's children (once per context)."""
        if self.root_g is not None:
            return
        t0 = self._now()
        feats, toks = self.pending
        hc, n, dev = self.hcache, len(toks), self.b.device
        g, logp = self.b.head.forward_logprobs(hc, feats, torch.tensor(toks, device=dev),
                                               torch.arange(hc.length, hc.length + n, device=dev), hc.length)
        hc.advance(n)
        self.root_g, self.root_logp = g[-1], logp[-1]
        self._absorb_s = self._now() - t0

    @DECODING
    def preview(self, policy) -> StepTrace:
        """The cycle another policy would run on the current context, without committing (the
        page's side-by-side view), numbered like the next step. A policy object runs as a fork: the
        preview reads what it learnt but teaches it nothing. The random streams are the preview's own."""
        check(self.started and self.finished is None, "Nothing to preview: start a prompt first.")
        policy = make_policy(policy) if isinstance(policy, str) else policy.fork()
        c = self.speculate(policy, torch.Generator().manual_seed(self.cycle + 7919),
                           torch.Generator().manual_seed(self.cycle), commit=False)
        return preview_trace(self, c, policy.name)

    def generate(self) -> Trace:
        if not self.started:
            raise UserError("Start a prompt first.")
        while self.finished is None:
            self.step()
        return self.trace

    @property
    def trace(self) -> Trace:
        return self.recorder.trace

    # ------------------------------------------------------------------ internals
    def _now(self) -> float:
        sync(self.b.device)
        return time.perf_counter()

    def _plain_step(self) -> StepTrace:
        t0 = self._now()
        L = self.cache.length
        dev = self.b.device
        _, logits = self.b.target.forward_logits(self.cache, torch.tensor([self.root], device=dev),
                                                 torch.tensor([L], device=dev))
        nxt = choose(logits[0], self.sampling, self.gen)
        t1 = self._now()
        self.cache.advance(1)
        self.target_forwards += 1
        self.root = nxt
        return self._emit([nxt], None, {"draft_s": 0.0, "verify_s": t1 - t0, "commit_s": 0.0})

    def _grow(self, n: int) -> None:
        old = self.cache
        new = self.b.target.new_cache(n)
        new.k[:, :, :, : old.length] = old.k[:, :, :, : old.length]
        new.v[:, :, :, : old.length] = old.v[:, :, :, : old.length]
        new.length = old.length
        self.cache = new

    def _emit(self, toks, c: "Cycle | None", timings) -> StepTrace:
        """Apply the stop rules to the tokens a cycle produced, extend the text, record the step."""
        eos = self.b.eos_ids
        out = []
        for t in toks:
            out.append(t)
            if t in eos:
                self.finished = "eos"
                break
        room = max(0, self.max_new_tokens - len(self.generated))
        if len(out) >= room:
            out = out[:room]
            self.finished = self.finished or "max_new_tokens"
        if self.cache.length + 2 >= self.b.target.args.max_positions - 1:
            self.finished = self.finished or "context"
        self.generated += out
        prev = self.text
        self.text = self.b.tokenizer.decode(self.generated, skip_special_tokens=True)
        timings["total_s"] = timings["draft_s"] + timings["verify_s"] + timings["commit_s"]
        for k in self.split:
            self.split[k] += timings[k]
        st = StepTrace(
            cycle=self.cycle, policy=self.policy_name, new_tokens=out, new_texts=[],
            accepted_len=0 if c is None else len(c.path_pos), bonus=None if c is None else c.bonus,
            timings=timings,
            cumulative={"tokens": len(self.generated), "target_forwards": self.target_forwards,
                        "wall_s": self.wall, "draft_calls": self.draft_calls},
            tree=None if c is None else c.tree, accepted_path=[] if c is None else c.accepted_pool,
            root=None if c is None else c.tree.tokens[0], finished=self.finished,
            text_delta=self.text[len(prev):] if self.text.startswith(prev) else self.text)
        self.cycle += 1
        if self.record:
            self.recorder.record(st, c, self.sampling)
        return st

    # ------------------------------------------------------------------ summaries
    @property
    def wall(self) -> float:
        """Seconds of this decoder's own work: drafting + verifying + committing, every cycle."""
        return sum(self.split.values())

    @property
    def tau(self) -> float:
        return len(self.generated) / max(1, self.target_forwards)

    def summary(self) -> dict:
        return {"policy": self.policy_name, "text": self.text, "token_ids": list(self.generated),
                "new_tokens": len(self.generated), "target_forwards": self.target_forwards,
                "tau": self.tau, "wall_s": self.wall, **self.split,
                "tokens_per_s": len(self.generated) / self.wall if self.wall > 0 else 0.0,
                "draft_calls": self.draft_calls, "finished": self.finished,
                "lossy": self.policy is not None and self.policy.lossy,
                **({"policy_stats": self.policy.summary_stats()} if self.policy is not None else {})}


@dataclass
class Cycle:
    """What one draft -> verify -> accept produced."""
    tree: DraftTree
    vb: VerifyBatch
    feats: torch.Tensor          # what the draft head reads at every verified node (forward_logits)
    logits: torch.Tensor
    path_pos: list[int]          # accepted verify positions (root excluded)
    bonus: int
    timings: dict

    @property
    def path_tokens(self) -> list[int]:
        return [int(self.vb.tokens[p]) for p in self.path_pos]

    @property
    def accepted_pool(self) -> list[int]:
        """The accepted nodes as pool indices."""
        return [self.vb.pool_idx[p] for p in self.path_pos]
