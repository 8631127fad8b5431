"""Two builds of the q4_1 kernels in one process, for A/B timings that alternate (the machine's
speed moves): this checkout's, and OTHER's qforward.cpp with its headers (another checkout)."""
from pathlib import Path


def this_and_other(other: Path):
    """(this checkout's q4_1 bundle, one on OTHER's kernel sources)."""
    from eagle2.model import qlib as Q   # where the library is built from
    from eagle2.model.loading import load_bundle
    a = load_bundle(dtype="q4_1")
    src = Path(other) / "eagle2" / "model"
    Q.SOURCE = src / Q.SOURCE.name
    Q.HEADERS = tuple(sorted(src.glob("q*.h")))   # its own headers (the two checkouts may split them differently)
    return a, load_bundle(dtype="q4_1")
