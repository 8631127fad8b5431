"""Follow-up papers' tree policies (DDD, DySpec, LANTERN++) register here by name.

REGISTRY maps a policy name to a factory taking total_tokens=None, depth=None, top_k=None (the
common tree flags; None = the policy's default) plus the policy's own keyword parameters.
`add_cli_args` / `cli_kwargs` give the command-line flags of those own parameters, so generate
and bench expose the same ones.
"""
from __future__ import annotations

from .errors import UserError


def _ddd(**kw):
    from .policy_ddd import make_ddd
    return make_ddd(**kw)


def _dyspec(**kw):
    from .policy_dyspec import make_dyspec
    return make_dyspec(**kw)


def _lantern(**kw):
    from .policy_lantern import make_lantern
    return make_lantern(**kw)


REGISTRY: dict = {"ddd": _ddd, "dyspec": _dyspec, "lantern": _lantern}

# (policy, flag, factory keyword, argparse type, help)
_FLAGS = [
    ("ddd", "--ddd-threshold", "threshold", float,
     "DDD: stop expanding when the beam's log mass is below this at a check level (default -0.3)"),
    ("ddd", "--ddd-checks", "check_levels", str,
     "DDD: comma-separated check levels in draft calls (default 5,7,9; max depth via --depth, default 10)"),
    ("dyspec", "--dyspec-threshold", "threshold", float,
     "DySpec: use the threshold variant with this t (about 1/budget) instead of the max-heap"),
    ("dyspec", "--dyspec-lookahead", "lookahead", int,
     "DySpec: nodes the draft head runs per call in the heap variant (default 1)"),
    ("lantern", "--lantern-lambda", "lam", float,
     "LANTERN++ multiplicative bound lambda >= 1 (default 5; 1 = exact)"),
    ("lantern", "--lantern-delta", "delta", float,
     "LANTERN additive bound delta in [0, 1] instead of lambda (0 = exact)"),
    ("lantern", "--lantern-k", "k", int, "LANTERN: latent neighbours per token (default 10)"),
    ("lantern", "--lantern-metric", "metric", str, "LANTERN: embedding distance, cosine (default) or l2"),
]


def add_cli_args(p) -> None:
    g = p.add_argument_group("policy parameters (ddd, dyspec, lantern)")
    for _, flag, _, typ, hlp in _FLAGS:
        g.add_argument(flag, type=typ, default=None, help=hlp)


def _levels(text: str) -> tuple:
    try:
        return tuple(int(s) for s in text.replace(" ", "").split(",") if s != "")
    except ValueError:
        raise UserError(f"--ddd-checks must be comma-separated integers such as 5,7,9 (got {text!r}).") from None


def cli_kwargs(policy: str, a, strict: bool = True) -> dict:
    """The policy's own parameters from parsed flags (only those given), validated by building
    the policy. With strict (generate), flags of another policy are an error, so a typo'd
    combination is not silently ignored; a command running several policies passes
    strict=False and each policy takes only its own flags."""
    name = (policy or "").lower()
    out = {}
    for pol, flag, key, _, _ in _FLAGS:
        v = getattr(a, flag.lstrip("-").replace("-", "_"), None)
        if v is None:
            continue
        if pol != name:
            if not strict:
                continue
            raise UserError(f"{flag} applies to --policy {pol}, not {policy!r}.")
        out[key] = _levels(v) if key == "check_levels" else v
    if name in REGISTRY:  # fail fast, before a model is loaded
        from .policies import make_policy
        make_policy(name, total_tokens=getattr(a, "total_tokens", None), depth=getattr(a, "depth", None),
                    top_k=getattr(a, "top_k", None), **out)
    return out
