"""Trees given whole, for tests: a TreeBuilder holding the lists (a policy's keep and rerank read
them), or the columnar tree it builds (what a cycle lays out and verifies)."""
from eagle2.cycle.tree_builder import TreeBuilder


def builder_of(tokens, parents, depths, ranks=None, values=None, kept=None) -> TreeBuilder:
    n = len(tokens)
    b = TreeBuilder(tokens[0])
    b.tokens, b.parents, b.depths = list(tokens), list(parents), list(depths)
    b.ranks = list(ranks) if ranks is not None else [0] * n
    b.logp, b.values = [0.0] * n, list(values) if values is not None else [0.0] * n
    b.levels = [0] * n
    b.kept = list(kept) if kept is not None else [True] * n
    return b


def tree_of(tokens, parents, depths, ranks=None, values=None, kept=None):
    return builder_of(tokens, parents, depths, ranks, values, kept).build()
