"""The speculative cycle: draft trees, drafting, verification, sampling, the decoder, traces and the
lockstep race. tree.py and trace.py are torch-free (the page replays traces without a model)."""
