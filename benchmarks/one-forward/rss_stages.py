import ctypes, gc, os, sys, time
import psutil
p = psutil.Process()
def r(t): print(f"{t}: {p.memory_info().rss/2**20:.0f} MiB", flush=True)
r("start")
import torch, transformers, gradio, plotly
r("torch+transformers+gradio+plotly")
from eagle2 import threads; threads.use_threads(None, 2)
import ui.page, ui.model
r("ui imported")
from ui.model import MODEL
MODEL.start()
MODEL.wait(600)
r("model ready (loaded, warmed, t(N) measured)")
ctypes.CDLL(None).malloc_trim(0); r("model ready + trim"); sys.exit(0)
demo = launch("127.0.0.1", 0, 2, block=False)
r("page launched")
ctypes.CDLL(None).malloc_trim(0); r("after malloc_trim")
b = MODEL.bundle
print("token table", len(b.derived.get("token_texts", [])))
