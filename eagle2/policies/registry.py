"""The one registry of tree policies: name -> class. The CLI, the benchmark and the page all read it,
and TRACES, the trace reader that knows every policy's tree record.

Adding a policy is one module in this package (a TreePolicy subclass) plus one line below. "plain"
(no tree: one target forward per token) is not a policy; PLAIN is the one place that names it.
"""
from __future__ import annotations

from ..cycle.trace import TraceReader
from ..devices import is_cuda
from ..errors import UserError
from .auto import AutoBudgetNPolicy, AutoBudgetPolicy
from .base import TreePolicy
from .ddd import DDDPolicy
from .dyspec import DySpecPolicy
from .eagle2 import Eagle2Policy
from .lantern import LanternPolicy
from .static import StaticPolicy

PLAIN = "plain"   # the decoder without a tree, every speedup's reference

# name: (class, one line for people)
REGISTRY: dict[str, tuple[type[TreePolicy], str]] = {c.name: (c, d) for c, d in (
    (Eagle2Policy, "EAGLE-2: a context-aware dynamic tree (expand the best nodes, keep the N best of the pool)."),
    (AutoBudgetPolicy, "EAGLE-2 whose N, depth and beam width are chosen every cycle from this machine's "
                       "measured costs (N, depth and top-k become caps): it starts from the cached t(N) table, or "
                       "an estimate while one is measured in the background, and corrects it from every "
                       "verification it times."),
    (AutoBudgetNPolicy, "the auto budget choosing N only, at a fixed depth."),
    (StaticPolicy, "EAGLE-1's fixed 25-node tree, the same shape whatever the context."),
    (DDDPolicy, "EAGLE-2 that stops expanding when the beam's draft mass is low (DDD)."),
    (DySpecPolicy, "a greedy tree of sampled drafts grown from a max-heap (DySpec)."),
    (LanternPolicy, "static tree with relaxed acceptance, LOSSY (LANTERN++); its first use builds a neighbour "
                    "index (minutes on a CPU)."),
)}

EAGLE2 = Eagle2Policy.name                # EAGLE-2's dynamic tree: the default on a GPU (default_policy)
BASELINE = StaticPolicy.name              # the static-tree baseline (EAGLE-1) the page races against
HARDWARE_AWARE = AutoBudgetPolicy.name    # suggested where a fixed tree costs more than it returns

# every record type a policy's trees carry, each once (a variant shares its parent's)
RECORD_TYPES = tuple(dict.fromkeys(c.record_type for c, _ in REGISTRY.values() if c.record_type is not None))
TRACES = TraceReader(RECORD_TYPES)        # reads trace files (and previews) recorded with any of them


def is_plain(name) -> bool:
    return name is None or str(name).strip().lower() == PLAIN


def default_policy(device) -> str:
    """The default policy, the one place it is chosen (the page, `generate`, the race, the shipped
    traces): the one that pays on this kind of device. On a CPU only small trees pay (verifying 60
    tokens costs several times one token), so the hardware-aware budget; on a GPU, where 60
    tokens cost about what one does, EAGLE-2 at its paper's (60, 5, 10)."""
    return EAGLE2 if is_cuda(device) else HARDWARE_AWARE


def uses_costs(name) -> bool:
    """Whether the policy prices its trees with this machine's t(N) (a tool measures it first)."""
    return not is_plain(name) and policy_class(name).uses_costs


def names() -> list[str]:
    return list(REGISTRY)


def describe(name: str) -> str:
    return REGISTRY[name][1]


def policy_class(name: str):
    key = (name or "").lower()
    if key not in REGISTRY:
        raise UserError(f"Unknown policy {name!r}: choose {PLAIN}, {', '.join(REGISTRY)}.")
    return REGISTRY[key][0]


def check_policy(name: str, total_tokens=None, depth=None, top_k=None, **own) -> None:
    """UserError unless these are valid parameters of the policy `name`. Its rules read only its
    parameters, so this builds a throwaway instance (a dataclass of them: microseconds) and keeps
    nothing."""
    make_policy(name, total_tokens=total_tokens, depth=depth, top_k=top_k, **own)


def make_policy(name: str, total_tokens=None, depth=None, top_k=None, **own):
    """A validated policy from the common tree flags (None = its default) and its own parameters."""
    p = policy_class(name).from_options(total_tokens=total_tokens, depth=depth, top_k=top_k, **own)
    p.validate()
    return p


def all_options() -> list[tuple[str, object]]:
    """(policy name, Option) for every policy's own parameters, in registry order."""
    return [(n, o) for n in REGISTRY for o in policy_class(n).options]


def add_cli_args(p) -> None:
    g = p.add_argument_group("policy parameters (" + ", ".join(n for n in REGISTRY if policy_class(n).options) + ")")
    for _, o in all_options():
        g.add_argument(o.flag, type=o.type, default=None, help=o.help)


def cli_kwargs(policy: str, a, strict: bool = True) -> dict:
    """The policy's own parameters from parsed flags (only those given), validated by building
    the policy. With strict (generate), flags of another policy are an error, so a typo'd
    combination is not silently ignored; a command running several policies passes
    strict=False and each policy takes only its own flags."""
    name = (policy or "").lower()
    out = {}
    for pol, o in all_options():
        v = getattr(a, o.flag.lstrip("-").replace("-", "_"), None)
        if v is None:
            continue
        if pol != name:
            if not strict:
                continue
            raise UserError(f"{o.flag} applies to --policy {pol}, not {policy!r}.")
        out[o.field] = v
    if name in REGISTRY:  # fail fast, before a model is loaded
        make_policy(name, total_tokens=getattr(a, "total_tokens", None), depth=getattr(a, "depth", None),
                    top_k=getattr(a, "top_k", None), **out)
    return out
