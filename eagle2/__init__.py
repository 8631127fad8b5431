"""eagle2: speculative decoding with dynamic draft trees (EAGLE-2) and its baselines."""
from .errors import UserError
from .sampling import SamplingParams

__all__ = ["UserError", "SamplingParams", "load_bundle", "Decoder"]


def __getattr__(name):  # keep `import eagle2` light: torch-heavy modules load on first use
    if name == "load_bundle":
        from .loading import load_bundle
        return load_bundle
    if name == "Decoder":
        from .decoder import Decoder
        return Decoder
    raise AttributeError(name)
