"""eagle2: speculative decoding with dynamic draft trees (EAGLE-2) and its baselines.

Layers: model/ (target, head, loading) -> cycle/ (tree, drafting, verification, decoder, traces,
the lockstep race) <-> policies/ (tree policies behind one interface and registry) -> tools/
(command line, bench, profile, train). `import eagle2` stays light: torch loads on first use, and
the trace types (cycle/trace.py, cycle/tree.py) never need it.
"""
from .errors import UserError

__all__ = ["UserError", "SamplingParams", "load_bundle", "Decoder"]


def __getattr__(name):
    if name == "load_bundle":
        from .model.loading import load_bundle
        return load_bundle
    if name == "Decoder":
        from .decoding.decoder import Decoder
        return Decoder
    if name == "SamplingParams":
        from .cycle.sampling import SamplingParams
        return SamplingParams
    raise AttributeError(name)
