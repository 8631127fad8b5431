"""Follow-up papers' tree policies (DDD, DySpec, LANTERN++) register here by name."""
REGISTRY: dict = {}
