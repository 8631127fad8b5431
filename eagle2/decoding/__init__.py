"""What drives the speculative cycle: the decoder (plain or any tree policy, one step at a time)
and the lockstep race of several decoders. Above the cycle's building blocks and the policies."""
