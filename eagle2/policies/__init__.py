"""Tree policies: how each cycle's draft tree is built (and, for a lossy policy, accepted), behind
one interface (base.TreePolicy) and one registry (registry.py)."""
