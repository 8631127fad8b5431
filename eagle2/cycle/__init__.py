"""The speculative cycle's building blocks: draft trees, drafting, the verify layout, verification,
sampling, typed records and traces. tree.py, trace.py and records.py are torch-free (the page replays
traces without a model)."""
