"""bench with some of the draft head's matrices in Q4_1 instead of Q8_0 (experiment): HEADQ=lm,mlp,attn,fc"""
import os, sys
from eagle2.model import quantized as Q
which = set(filter(None, os.environ.get("HEADQ", "").split(",")))
orig = Q.quantise_q8_0
def pick(w):
    N, K = w.shape
    kind = ("lm" if N >= 4096 else "fc" if K == 1728 else "mlp" if max(N, K) == 1536 else "attn")
    return Q.quantise_q4_1(w) if kind in which else orig(w)
Q.quantise_q8_0 = pick
from eagle2.tools.cli import main
sys.exit(main(sys.argv[1:]))
