"""Training and data tools for the draft heads (self-instruct prompts, self-distillation, head
training), beside the runtime: the page and the decoders never import this package. Users reach
it through the same CLI, `python -m eagle2 train|prompts ...`."""
