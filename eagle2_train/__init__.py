"""Training and data tools for the draft heads (self-instruct prompts, self-distillation, head
training), beside the runtime: the page and the decoders never import this package. Its commands
have their own entry point, `python -m eagle2_train train|prompts ...` (cli.py)."""
