"""The speculative cycle's building blocks: draft trees, drafting, the verify layout, verification,
sampling and traces. tree.py and trace.py are torch-free (the page replays traces without a model).
Nothing here knows a particular policy: each policy's record type and any lossy rule live beside it
in eagle2/policies/."""
