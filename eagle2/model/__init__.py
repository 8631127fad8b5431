"""The model layer: the target transformer, the EAGLE draft head, and loading them (weights, presets)."""
