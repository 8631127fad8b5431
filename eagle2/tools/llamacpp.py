"""llama.cpp as a peer in `python -m eagle2 bench`: rows `llama.cpp-q4_1` and `llama.cpp-f32`.

Both run llama.cpp (through llama-cpp-python, the optional extra `llamacpp`) greedily on the
same prompt token ids the engine's rows decode. `llama.cpp-q4_1` runs the embedded default
model's GGUF as shipped (Q4_1 weights, llama.cpp's own quantised kernels); `llama.cpp-f32` runs
that file with every tensor dequantised to F32 (written once into the cache folder), the same
weights the engine's fp32 model holds, since the engine's safetensors are a dequantisation of the
same file. llama.cpp is a peer, not a lossless policy: its tokens are reported against plain's,
not required to equal them (float sums in another order can break a near-tie).
"""
from __future__ import annotations

import logging
import time
from pathlib import Path

import numpy as np

from ..errors import check
from ..files import atomic_path
from ..model.weights import cache_dir, embedded_gguf, embedded_key

# row label -> which GGUF it runs
PEERS = {"llama.cpp-q4_1": "q4_1", "llama.cpp-f32": "f32"}
INSTALL_HINT = 'pip install -e ".[llamacpp]" (builds llama.cpp from source, a few minutes)'


def missing_reason() -> str | None:
    """Why the llama.cpp rows cannot run here (llama_cpp not importable), or None when they can."""
    try:
        import llama_cpp  # noqa: F401
    except Exception as e:  # ImportError, or a shared library that fails to load
        return f"{type(e).__name__}: {e}".splitlines()[0]
    return None


def version() -> str:
    import llama_cpp
    return getattr(llama_cpp, "__version__", "unknown")


def skip_line(labels: list[str], reason: str) -> str:
    return f"llama.cpp rows skipped ({', '.join(labels)}): {INSTALL_HINT} [{reason}]"


# ------------------------------------------------------------------------------------ GGUF -> F32
_KEPT = {"I8", "I16", "I32", "I64", "F64"}  # integer (and wider) tensors are copied as they are


def dequantize_gguf(src: Path, dst: Path) -> None:
    """Write `src` as a GGUF whose float tensors are all F32: every metadata field copied with its
    type (arrays with their element type, strings as their bytes, the tokenizer included) in the
    file's order, `general.file_type` set to ALL_F32, the tensors in the file's order. Written
    through a temporary file renamed over `dst` at the end (files.atomic_path)."""
    import gguf
    from gguf import GGMLQuantizationType, GGUFReader, GGUFValueType, GGUFWriter

    r = GGUFReader(str(src))
    fields = {k: f for k, f in r.fields.items() if not k.startswith("GGUF.")}  # the header's own
    arch = fields["general.architecture"].contents()
    with atomic_path(dst, suffix=".gguf") as tmp:
        w = GGUFWriter(str(tmp), arch)  # writes general.architecture first, as converters do
        for key, f in fields.items():
            if key == "general.architecture":
                continue
            vtype = f.types[0]
            if key == "general.file_type":
                w.add_key_value(key, int(gguf.LlamaFileType.ALL_F32), GGUFValueType.UINT32)
            elif vtype == GGUFValueType.ARRAY:
                check(len(f.types) == 2, f"{src.name}: {key} is an array of arrays, which is not copied.")
                check(len(f.data) > 0, f"{src.name}: {key} is an empty array, which gguf cannot write.")
                sub = f.types[1]
                val = ([bytes(f.parts[i]) for i in f.data] if sub == GGUFValueType.STRING
                       else [f.parts[i].tolist()[0] for i in f.data])
                w.add_key_value(key, val, vtype, sub_type=sub)
            elif vtype == GGUFValueType.STRING:
                w.add_key_value(key, bytes(f.parts[-1]), vtype)
            else:
                w.add_key_value(key, f.contents(), vtype)
        if "general.file_type" not in fields:
            w.add_uint32("general.file_type", int(gguf.LlamaFileType.ALL_F32))
        if "general.alignment" in fields:
            w.data_alignment = int(fields["general.alignment"].contents())

        def as_written(t) -> np.ndarray:
            shape = tuple(int(d) for d in reversed(t.shape))  # numpy order: ne reversed
            if t.tensor_type.name in _KEPT:
                return np.ascontiguousarray(t.data).reshape(shape)
            if t.tensor_type == GGMLQuantizationType.F32:
                return np.ascontiguousarray(t.data, dtype=np.float32).reshape(shape)
            return np.ascontiguousarray(gguf.quants.dequantize(t.data, t.tensor_type), dtype=np.float32).reshape(shape)

        # The tensor infos first, then the data one tensor at a time: the F32 model is never whole
        # in memory.
        for t in r.tensors:
            shape = tuple(int(d) for d in reversed(t.shape))
            dtype = np.dtype(t.data.dtype) if t.tensor_type.name in _KEPT else np.dtype(np.float32)
            w.add_tensor_info(t.name, shape, dtype, int(np.prod(shape)) * dtype.itemsize)
        w.write_header_to_file()
        w.write_kv_data_to_file()
        w.write_ti_data_to_file()
        for t in r.tensors:
            w.write_tensor_data(as_written(t))
        w.close()
    del r


def peer_gguf(target: str, kind: str) -> Path:
    """The GGUF a peer row runs: the embedded model's file (q4_1), or its F32 conversion (f32),
    made once under cache_dir()/gguf."""
    key = embedded_key(target)
    check(key is not None, "The llama.cpp rows run the embedded default model's GGUF file: "
                           f"leave --target at its default (got {target!r}).")
    src = embedded_gguf(key)
    if kind == "q4_1":
        return src
    out = cache_dir() / "gguf" / f"{src.stem}.f32.gguf"
    if not out.exists():
        logging.getLogger(__name__).info(f"writing {out.name}, {src.name} with every tensor F32 (once)...")
        dequantize_gguf(src, out)
    return out


# ------------------------------------------------------------------------------------ the runner
class LlamaCppPeer:
    """llama.cpp's greedy decoding of a GGUF, with HFBaseline's interface: run(ids, max_new, eos)."""

    def __init__(self, label: str, target: str, threads: int, n_ctx: int, seed: int = 0):
        from llama_cpp import Llama
        self.name = label
        self.path = peer_gguf(target, PEERS[label])
        self.llm = Llama(model_path=str(self.path), n_ctx=n_ctx, n_threads=threads, n_threads_batch=threads,
                         n_batch=512, seed=seed, logits_all=False, verbose=False)

    def run(self, ids, max_new, eos) -> dict:
        """Greedy tokens after `ids` until an eos id (kept, as the engine keeps it) or max_new.
        wall_s covers prefill and decoding, as the engine rows' wall time does (their prompt
        forward is the first step; the chat template's tokenising is outside both); one llama.cpp
        evaluation (the prompt, then each token) counts as one target forward."""
        llm, new = self.llm, []
        llm.reset()  # no KV prefix kept from the previous run: every run prefills its whole prompt
        t0 = time.perf_counter()
        if max_new > 0:
            for tok in llm.generate(list(ids), top_k=1, top_p=1.0, min_p=0.0, typical_p=1.0, temp=0.0,
                                    repeat_penalty=1.0, reset=True):
                new.append(int(tok))
                if tok in eos or len(new) >= max_new:
                    break
        wall = time.perf_counter() - t0
        return {"token_ids": new, "new_tokens": len(new), "target_forwards": len(new), "wall_s": wall}
