"""The tools: the command line, the benchmark, the profile, training and its data (self-distillation)."""
