"""The target in the GGUF's own precision (`--dtype q4_1`): weights in their blocks, integer dot
products, every row's result independent of the batch (qforward.cpp says how).

Where the weights come from:
- the embedded model: its GGUF's own blocks, read as shipped (Q4_1 for the layers' matrices, Q8_0
  for the tied embedding / LM head; the norms are F32). llama.cpp stores the q and k projections'
  rows interleaved for its RoPE; they are put back in Hugging Face's order, whole blocks moved.
- any other folder or hub id: its fp32 weights quantised here the way ggml does (Q4_1 for the
  matrices, Q8_0 for the LM head and an untied embedding), so every Llama-family model gets the
  same forward.

The backend (`KernelTarget`, `KernelDraft`: forward.py's interface) keeps the blocks and no fp32
copy of the target's weights: the embedding lookup reads rows of the embedding's blocks (for the
embedded model they hold exactly the fp32 values the converted safetensors hold).
"""
from __future__ import annotations

import ctypes
import logging
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from ..errors import UserError
from . import native
from .llama import KVCache, LlamaModel, rope_covering
from .tree_modes import TREE_TOPK, Explore, TreeBudget

QK = 32            # values per block
TOPK_MAX = 1024    # the most candidates the kernels rank a row (qattention.h's TOPK_MAX)
# the numbers qf_layout lists beside the structs, by its names: checked when the library loads
SHARED_CONSTANTS = {"TOPK_MAX": TOPK_MAX, "QT_TOPK": TREE_TOPK,
                    **{f"BUDGET_{m.name}": int(m) for m in TreeBudget}, **{f"EXPLORE_{e.name}": int(e) for e in Explore}}
Q4_1, Q8_0 = 0, 1  # qforward.cpp's QMat.type
SOURCE = Path(__file__).with_name("qforward.cpp")
HEADERS = tuple(Path(__file__).with_name(n) for n in ("qblocks.h", "qmatmul.h", "qattention.h", "qprobe.h", "qtree.h"))
NAME = "eagle2_qforward"
PRECISION = "q4_1"


def flags() -> list[str]:
    """AVX2 (with FMA and F16C) as the baseline; the VNNI dot products are chosen at run time.
    OpenMP links torch's own runtime (its lib folder first), so one thread pool serves both."""
    lib = str(Path(torch.__file__).parent / "lib")
    return ["-O3", "-shared", "-fPIC", "-std=c++17", "-mavx2", "-mfma", "-mf16c", "-ffp-contract=off",
            "-fopenmp", f"-L{lib}", f"-Wl,-rpath,{lib}"]


def cpu_problem() -> str | None:
    """Why this CPU cannot run the integer forward, or None."""
    cap = torch.backends.cpu.get_cpu_capability()
    if cap not in ("AVX2", "AVX512"):
        return f"this CPU has no AVX2 (torch reports {cap})"
    return None


_lib: dict[Path, ctypes.CDLL] = {}


def library(log=None) -> ctypes.CDLL | None:
    """The kernels (built once into the cache, about 5 s), or None with the reason logged."""
    problem = cpu_problem()
    if problem:
        (log or logging.getLogger(__name__).warning)(f"q4_1 kernels not used: {problem}")
        return None
    path = native.build_library(NAME, SOURCE, flags(), log, headers=HEADERS)
    if path is None:
        return None
    lib = _lib.get(path)
    if lib is None:
        lib = ctypes.CDLL(str(path))  # ctypes lets go of the GIL for the length of each call
        declare(lib)
        _lib[path] = lib
        _force_kernels(lib, log)
    return lib


def _force_kernels(lib: ctypes.CDLL, log=None) -> None:
    """EAGLE2_Q4_KERNELS: run a slower CPU's dot products here (the same results; its timings)."""
    from .. import config
    want = config.current().q4_kernels
    if not want:
        return
    which = {name.lower(): i for i, name in ISAS.items()}.get(want)
    if which is None or not lib.qf_supports(which):
        (log or logging.getLogger(__name__).warning)(
            f"EAGLE2_Q4_KERNELS={want} ignored: use one of {', '.join(n.lower() for n in ISAS.values())} that this CPU has")
        return
    lib.qf_set_isa(which)


ISAS = {0: "AVX2", 1: "AVX-VNNI", 2: "AVX512-VNNI"}
# What profile splits a forward into: qforward.cpp's Op, in its order.
OPS = ("qkv", "o", "gate_up", "down", "lm_head", "attention", "quantise", "norm_rope_silu", "wait")


def shape_problem(a) -> str | None:
    """Why the kernels cannot take a model (or head) of these sizes, or None: blocks of 32 along
    every matmul's input, head sizes up to 128 in steps of 8 (qforward.cpp's attention)."""
    for what, n in (("hidden size", a.dim), ("intermediate size", a.intermediate), ("heads x head dim", a.n_heads * a.head_dim)):
        if n % QK:
            return f"The q4_1 forward needs a {what} that is a multiple of {QK} (this model's is {n})"
    if a.head_dim % 8 or a.head_dim > 128:
        return head_size_problem(a.head_dim)
    return None


def head_size_problem(hd: int) -> str:
    """The kernels' line for a head size their attention does not take (qattention.h's head_dim_ok;
    the calls that reach attention return -4 for one)."""
    return f"The q4_1 forward takes head sizes up to 128 in steps of 8 (this model's is {hd})"


# ------------------------------------------------------------------ blocks


@dataclass
class QMatrix:
    """One matrix [N, K] in blocks of 32 along K: qs (Q4_1 uint8 [N, K/2], two values a byte as
    ggml packs them; Q8_0 int8 [N, K]), scales d and (Q4_1) offsets m [N, K/32] in fp32 (the
    file's fp16 values, exactly)."""
    kind: int
    qs: torch.Tensor
    d: torch.Tensor
    m: torch.Tensor | None
    bias: torch.Tensor | None = None

    @property
    def shape(self) -> tuple[int, int]:
        N, nb = self.d.shape
        return N, nb * QK

    def nbytes(self) -> int:
        """Bytes as stored in a GGUF (fp16 scales): what a forward streams."""
        N, nb = self.d.shape
        return N * nb * (20 if self.kind == Q4_1 else 34)

    def dequantised(self) -> torch.Tensor:
        """The fp32 values the blocks hold: for the embedded model, its converted fp32 weights
        exactly (the GGUF is what it was converted from)."""
        N, nb = self.d.shape
        if self.kind == Q4_1:
            q = torch.cat([self.qs.view(N, nb, 16) & 15, self.qs.view(N, nb, 16) >> 4], -1).float()
            w = q * self.d[..., None] + self.m[..., None]
        else:
            w = self.qs.view(N, nb, QK).float() * self.d[..., None]
        return w.reshape(N, nb * QK)

    def values(self) -> torch.Tensor:
        """The integer values [N, nb, 32] (Q4_1: 0..15, Q8_0: -127..127)."""
        N, nb = self.d.shape
        if self.kind == Q4_1:
            q = self.qs.view(N, nb, 16)
            return torch.cat([q & 15, q >> 4], -1)
        return self.qs.view(N, nb, QK)

    def packed(self) -> torch.Tensor:
        """The blocks as qforward.cpp's kernels read them (qblocks.h says how): groups of 16
        outputs, one output per 32-bit lane, each block's quants and fp16 scales one record."""
        N, nb = self.d.shape
        G = (N + 15) // 16
        pad = G * 16 - N
        v, d, m = self.values(), self.d, self.m
        if pad:
            v = torch.cat([v, v.new_zeros(pad, nb, QK)])
            d = torch.cat([d, d.new_zeros(pad, nb)])
            m = None if m is None else torch.cat([m, m.new_zeros(pad, nb)])
        v = v.view(G, 16, nb, QK)
        if self.kind == Q4_1:
            lo = v[..., :16].view(G, 16, nb, 4, 4)
            hi = v[..., 16:].view(G, 16, nb, 4, 4)
            qs = (lo | (hi << 4)).permute(0, 2, 3, 1, 4).reshape(G, nb, 256)
            scales = torch.cat([d.view(G, 16, nb).transpose(1, 2), m.view(G, 16, nb).transpose(1, 2)], -1)
        else:
            qs = v.view(G, 16, nb, 8, 4).permute(0, 2, 3, 1, 4).reshape(G, nb, 512).view(torch.uint8)
            scales = d.view(G, 16, nb).transpose(1, 2)
        scales = scales.half().contiguous().view(torch.uint8)  # [G, nb, 2 x 16 or 2 x 32]
        return torch.cat([qs, scales], -1).contiguous()

    def rows(self, order: torch.Tensor) -> "QMatrix":
        return QMatrix(self.kind, self.qs[order].contiguous(), self.d[order].contiguous(),
                       None if self.m is None else self.m[order].contiguous(), self.bias)


def _half(raw: torch.Tensor) -> torch.Tensor:
    return raw.contiguous().view(torch.float16).float().squeeze(-1)


def from_gguf(raw: torch.Tensor, kind: int) -> QMatrix:
    """A GGUF tensor's bytes [N, nb * block bytes] as a QMatrix (block_q4_1: fp16 d, fp16 m, 16
    bytes of nibbles; block_q8_0: fp16 d, 32 int8)."""
    N = raw.shape[0]
    if kind == Q4_1:
        b = raw.view(N, -1, 20)
        return QMatrix(Q4_1, b[..., 4:].reshape(N, -1).contiguous(), _half(b[..., 0:2]), _half(b[..., 2:4]))
    b = raw.view(N, -1, 34)
    return QMatrix(Q8_0, b[..., 2:].reshape(N, -1).contiguous().view(torch.int8), _half(b[..., 0:2]), None)


def quantise_q4_1(w: torch.Tensor) -> QMatrix:
    """ggml's Q4_1 of fp32 rows: per block min and (max - min) / 15, values rounded half up."""
    N, K = w.shape
    b = w.detach().float().reshape(N, K // QK, QK)
    lo, hi = b.min(-1).values, b.max(-1).values
    d = (hi - lo) / 15
    inv = torch.where(d != 0, 1 / d, torch.zeros_like(d))
    q = torch.clamp(((b - lo[..., None]) * inv[..., None] + 0.5).to(torch.int32), 0, 15).to(torch.uint8)
    qs = (q[..., :16] | (q[..., 16:] << 4)).reshape(N, -1).contiguous()
    return QMatrix(Q4_1, qs, d.half().float(), lo.half().float())


def quantise_q8_0(w: torch.Tensor) -> QMatrix:
    """ggml's Q8_0 of fp32 rows: per block amax / 127, values rounded to nearest."""
    N, K = w.shape
    b = w.detach().float().reshape(N, K // QK, QK)
    d = b.abs().max(-1).values / 127
    inv = torch.where(d != 0, 1 / d, torch.zeros_like(d))
    q = torch.round(b * inv[..., None]).to(torch.int8)
    return QMatrix(Q8_0, q.reshape(N, -1).contiguous(), d.half().float(), None)


# ------------------------------------------------------------------ ctypes mirror of qforward.cpp

_i32, _ptr_t = ctypes.c_int32, ctypes.c_void_p


class _CMat(ctypes.Structure):
    _fields_ = [("data", _ptr_t), ("bias", _ptr_t), ("N", _i32), ("K", _i32), ("type", _i32), ("pad_", _i32)]


class _CLayer(ctypes.Structure):
    _fields_ = [("attn_norm", _ptr_t), ("q", _CMat), ("k", _CMat), ("v", _CMat), ("o", _CMat),
                ("ffn_norm", _ptr_t), ("gate", _CMat), ("up", _CMat), ("down", _CMat)]


class _CModel(ctypes.Structure):
    _fields_ = [("D", _i32), ("H", _i32), ("KV", _i32), ("hd", _i32), ("F", _i32), ("L", _i32),
                ("eps", ctypes.c_float), ("vocab", _i32), ("layers", ctypes.POINTER(_CLayer)), ("norm", _ptr_t),
                ("lm_head", _CMat), ("embed", _CMat)]


class _CHead3(ctypes.Structure):
    _fields_ = [("D", _i32), ("H", _i32), ("KV", _i32), ("hd", _i32), ("F", _i32), ("norm_before_residual", _i32),
                ("eps", ctypes.c_float), ("pad_", _i32),
                ("input_norm", _ptr_t), ("hidden_norm", _ptr_t), ("post_norm", _ptr_t),
                ("q", _CMat), ("k", _CMat), ("v", _CMat), ("o", _CMat), ("gate", _CMat), ("up", _CMat), ("down", _CMat)]


class _CDraft(ctypes.Structure):
    _fields_ = [("layer", _CHead3), ("fc", _CMat), ("embed", _CMat), ("norm", _ptr_t), ("lm", _CMat), ("ids", _ptr_t),
                ("vocab", _i32), ("pad_", _i32)]


_dbl = ctypes.c_double


class _CTreeIn(ctypes.Structure):
    _fields_ = [("root", ctypes.c_int64), ("root_g", _ptr_t), ("root_vals", _ptr_t), ("root_ids", _ptr_t),
                ("n_root", _i32), ("top_k", _i32), ("depth", _i32), ("total_tokens", _i32),
                ("committed", _i32), ("base_pos", _i32), ("cap", _i32), ("rope_rows", _i32),
                ("kc", _ptr_t), ("vc", _ptr_t), ("cos", _ptr_t), ("sin", _ptr_t),
                ("budget", _i32), ("explore_depth", _i32), ("explore", _i32), ("max_width", _i32),
                ("spent0", _dbl), ("call_guess", _dbl), ("decay", _dbl),
                ("tn", _ptr_t), ("rank_prob", _ptr_t), ("prices", _ptr_t), ("threads", _i32), ("pad_", _i32)]


class _CTreeOut(ctypes.Structure):
    _fields_ = [("cap_nodes", _i32), ("cap_verify", _i32), ("tokens", _ptr_t), ("parents", _ptr_t),
                ("depths", _ptr_t), ("ranks", _ptr_t), ("logp", _ptr_t), ("values", _ptr_t), ("levels", _ptr_t),
                ("kept", _ptr_t), ("beam", _ptr_t), ("rank_sum", _ptr_t), ("rank_count", _ptr_t), ("beam_len", _ptr_t),
                ("order", _ptr_t), ("parent_pos", _ptr_t),
                ("mask", _ptr_t), ("n", _i32), ("n_beams", _i32), ("draft_calls", _i32), ("n_verify", _i32),
                ("best_n", _i32), ("pad_", _i32), ("expected", _dbl), ("head_s", _dbl)]


_int = ctypes.c_int
_MAT, _MODEL, _DRAFT = ctypes.POINTER(_CMat), ctypes.POINTER(_CModel), ctypes.POINTER(_CDraft)
# Every exported function's arguments and result (pointers to tensors' data as c_void_p).
SIGNATURES = {
    "qf_layout": ([], ctypes.c_char_p),
    "qf_block_bytes": ([_int], _int),
    "qf_rows": ([_MAT, _ptr_t, _int, _ptr_t], _int),
    "qf_ops": ([], _int),
    "qf_isa": ([], _int),
    "qf_supports": ([_int], _int),
    "qf_set_isa": ([_int], _int),
    "qf_matmul": ([_MAT, _ptr_t, _int, _ptr_t, _int], None),
    "qf_matmul_ref": ([_MAT, _ptr_t, _int, _ptr_t], None),
    "qf_int8_peak": ([_int, _int], _dbl),
    "qf_fma_peak": ([_int], _dbl),
    "qf_read_gbs": ([ctypes.c_int64, _int, _int], _dbl),
    "qf_forward": ([_MODEL, _ptr_t, _ptr_t, _int, _ptr_t, _ptr_t, _int, _ptr_t, _ptr_t, _int, _int, _ptr_t, _ptr_t,
                    _ptr_t, _int, _ptr_t, _ptr_t, _ptr_t, _int, _ptr_t], _int),
    "qf_draft": ([_DRAFT, _ptr_t, _ptr_t, _int, _int, _ptr_t, _ptr_t, _ptr_t, _ptr_t, _int, _int, _int, _ptr_t,
                  _ptr_t, _ptr_t, _int, _ptr_t, _ptr_t, _int, _int], _int),
    "qf_draft_tree": ([_DRAFT, ctypes.POINTER(_CTreeIn), ctypes.POINTER(_CTreeOut)], _int),
    "qf_commit": ([_ptr_t, _ptr_t, ctypes.c_int64, _int, _int, _int, _ptr_t, _int], _int),
    "qf_argmax": ([_ptr_t, _int, _int], ctypes.c_int64),
    "qf_rmsnorm": ([_ptr_t, _ptr_t, _ptr_t, _int, ctypes.c_float, _int], None),
    "qf_exp": ([_ptr_t, _ptr_t, _int, _int], _int),
    "qf_silu_mul": ([_ptr_t, _ptr_t, _int, _int], _int),
    "qf_log_softmax": ([_ptr_t, _int, _int], None),
    "qf_top_k": ([_ptr_t, _int, _int, _ptr_t, _ptr_t, _ptr_t, _int], _int),
    "qf_attend": ([_ptr_t, _int, _int, _ptr_t, _ptr_t, _int, _ptr_t, _ptr_t, _int, ctypes.c_float, _ptr_t, _int], _int),
    "qf_best_width": ([_ptr_t, _int, _ptr_t, _int, _ptr_t, _int, _dbl, _ptr_t, _int, _dbl, _ptr_t, _int], _int),
}
_MIRRORED = {"QMat": _CMat, "QLayer": _CLayer, "QModel": _CModel, "QHead3": _CHead3, "QDraft": _CDraft,
             "QTreeIn": _CTreeIn, "QTreeOut": _CTreeOut}


def layout_problem(lib: ctypes.CDLL) -> str | None:
    """Where the ctypes mirror above disagrees with the library's structs (qf_layout: sizes and
    field offsets) or the Python side with its constants (SHARED_CONSTANTS), or None."""
    for item in lib.qf_layout().decode().strip(";").split(";"):
        name, value = item.split("=")
        struct, _, field = name.partition(".")
        if struct == "const":   # a number both sides must agree on
            mine = SHARED_CONSTANTS[field]
            if mine != int(value):
                return f"{field} is {value} in the library and {mine} in the Python side"
            continue
        mirror = _MIRRORED[struct]
        mine = ctypes.sizeof(mirror) if not field else getattr(mirror, field).offset
        if mine != int(value):
            return f"{name} is {value} in the library and {mine} in quantized.py"
    for kind, size in ((Q4_1, 320), (Q8_0, 544)):
        if lib.qf_block_bytes(kind) != size:
            return f"a block of type {kind} is {lib.qf_block_bytes(kind)} bytes in the library, {size} here"
    return None


def declare(lib: ctypes.CDLL) -> None:
    """Give every exported function its argument and result types, then check the structs'
    layout; a library that disagrees is refused with one line (RuntimeError)."""
    for name, (args, result) in SIGNATURES.items():
        fn = getattr(lib, name)
        fn.argtypes, fn.restype = args, result
    problem = layout_problem(lib)
    if problem:
        raise RuntimeError(f"the q4_1 kernels' library does not match quantized.py: {problem}")


def check_cache(cache: KVCache, layers: int, kv: int, hd: int, who: str) -> None:
    """What the kernels read a cache as: fp16 [layers, 1, kv, max_len, hd], contiguous, on the CPU
    (they take a pointer and these sizes, and would read anything else as that); else one line."""
    want = (layers, 1, kv, cache.max_len, hd)
    for t in (cache.k, cache.v):
        if t.dtype != torch.float16 or tuple(t.shape) != want or not t.is_contiguous() or t.device.type != "cpu":
            raise ValueError(f"{who}: its cache must be fp16 {list(want)}, contiguous, on the CPU "
                             f"(got {str(t.dtype).removeprefix('torch.')} {list(t.shape)} on {t.device.type}"
                             f"{'' if t.is_contiguous() else ', not contiguous'})")


def matmul(lib: ctypes.CDLL, cmat: "_CMat", x: torch.Tensor) -> torch.Tensor:
    """x [rows, K] times a packed matrix: [rows, N] in fp32 (its bias added in the kernels)."""
    if x.dim() != 2 or x.shape[1] != cmat.K:
        raise ValueError(f"matmul: the input must be [rows, {cmat.K}] (got {list(x.shape)})")
    x = x.float().contiguous()
    y = torch.empty(x.shape[0], cmat.N)
    lib.qf_matmul(ctypes.byref(cmat), x.data_ptr(), x.shape[0], y.data_ptr(), torch.get_num_threads())
    return y


def rows_of(lib: ctypes.CDLL, cmat: "_CMat", rows: torch.Tensor) -> torch.Tensor:
    """Rows of a packed matrix as the fp32 values its blocks hold [len(rows), K]."""
    rows = rows.to(torch.int64).contiguous()
    out = torch.empty(rows.numel(), cmat.K)
    if lib.qf_rows(ctypes.byref(cmat), rows.data_ptr(), rows.numel(), out.data_ptr()) != 0:
        raise IndexError("a row outside the matrix")
    return out


def _ptr(t: torch.Tensor | None) -> int | None:
    return None if t is None else t.data_ptr()


def _owned(t: torch.Tensor, keep: list) -> int:
    """A float32 copy of `t` that the kernels read (kept in `keep`): never a pointer into a
    module's parameter, which a later `.to()` or load would leave dangling."""
    c = t.detach().float().clone().contiguous()
    keep.append(c)
    return c.data_ptr()


def _cmat(m: QMatrix, keep: list) -> _CMat:
    """The kernels' view of `m` (its packed copy appended to `keep`, which must outlive it)."""
    N, K = m.shape
    packed = m.packed()
    keep.append(packed)
    bias = None if m.bias is None else _owned(m.bias, keep)
    return _CMat(packed.data_ptr(), bias, N, K, m.kind, 0)


MATRICES = ("q", "k", "v", "o", "gate", "up", "down")


class KernelCache(KVCache):
    """The kernels' KV cache (fp16): a cycle's accepted rows are kept in one C call (qf_commit)."""

    def __init__(self, lib: ctypes.CDLL, *args):
        super().__init__(*args)
        self.lib = lib

    def commit(self, slots) -> None:
        slots = torch.as_tensor(slots, dtype=torch.int64).contiguous()
        k = self.k
        planes = k.shape[0] * k.shape[1] * k.shape[2]
        if self.lib.qf_commit(k.data_ptr(), self.v.data_ptr(), planes, self.max_len, k.shape[-1] * k.element_size(),
                              self.length, slots.data_ptr(), slots.numel()) != 0:
            raise RuntimeError(f"commit: slots {slots.tolist()} are not ascending past {self.length} in the cache")
        self.length += slots.numel()


class KernelTarget:
    """forward.TargetForward in qforward.cpp: the target's matrices in their blocks (`layers`: per
    layer a dict of MATRICES; `lm_head`; `embed`, the token embedding's blocks, which the kernels
    read rows of: for a tied model the LM head's own), its norms and biases as owned fp32 copies,
    RoPE tables. No fp32 copy of a weight it never runs is kept: the fp32 module it was built from
    can go. The cache is fp16, as llama.cpp keeps it: attention reads half fp32's bytes (the kernels
    convert exactly on load; rows stay independent of the batch)."""

    precision = PRECISION

    def __init__(self, args, layers: list[dict], lm_head: QMatrix, embed: QMatrix | None, norms: list,
                 final_norm: torch.Tensor, lib: ctypes.CDLL, aux_layers: tuple[int, ...] = ()):
        """`norms`: per layer (attention norm, MLP norm); `embed` None: the LM head's blocks (tied)."""
        a = self.args = args
        self.device = torch.device("cpu")
        self.lib = lib
        # each matrix's (outputs, inputs, bytes as a GGUF holds it): what profile's roofline reads
        self.sizes = {n: [(*blk[n].shape, blk[n].nbytes()) for blk in layers] for n in MATRICES}
        self.sizes["lm_head"] = [(*lm_head.shape, lm_head.nbytes())]
        # what one forward streams: the blocks, and the norms
        self._streamed = sum(b for mats in self.sizes.values() for _, _, b in mats) + 4 * a.dim * (2 * a.n_layers + 1)
        self.aux_layers = tuple(aux_layers)
        if any(not 0 <= t <= a.n_layers for t in self.aux_layers) or len(set(self.aux_layers)) != len(self.aux_layers):
            raise UserError(f"The draft head reads layers {list(self.aux_layers)}: they must be distinct, in 0..{a.n_layers} "
                            f"(this target's layers, {a.n_layers} the last one's output).")
        keep: list = []  # the packed copies the C structures point into, kept alive with this object
        c_layers = (_CLayer * a.n_layers)()
        for i, (blk, (attn_norm, ffn_norm)) in enumerate(zip(layers, norms)):
            c_layers[i] = _CLayer(_owned(attn_norm, keep), *[_cmat(blk[n], keep) for n in MATRICES[:4]],
                                  _owned(ffn_norm, keep), *[_cmat(blk[n], keep) for n in MATRICES[4:]])
        c_lm = _cmat(lm_head, keep)
        self.c_embed = c_lm if embed is None else _cmat(embed, keep)
        if (self.c_embed.N, self.c_embed.K) != (a.vocab_size, a.dim):
            raise UserError(f"The token embedding's blocks are [{self.c_embed.N}, {self.c_embed.K}], "
                            f"not [{a.vocab_size}, {a.dim}].")
        self._c_layers, self._packed = c_layers, keep
        self._c_model = _CModel(a.dim, a.n_heads, a.n_kv_heads, a.head_dim, a.intermediate, a.n_layers,
                                a.norm_eps, a.vocab_size, c_layers, _owned(final_norm, keep), c_lm, self.c_embed)
        self._taps = (ctypes.c_int32 * max(1, len(self.aux_layers)))(*self.aux_layers)
        self._rope = (None, None)
        self.rope(2048)

    @property
    def isa(self) -> str:
        return ISAS.get(self.lib.qf_isa(), "?")

    @property
    def kernels_id(self) -> str:
        """The dot products that run and the kernels' build (their sources' hash): what a t(N)
        table measured on them is keyed by, so that new kernels are timed anew."""
        return f"{self.isa} {Path(self.lib._name).parent.name}"

    @property
    def timing_id(self) -> str:
        return f"{PRECISION} {self.kernels_id}"

    @property
    def description(self) -> str:
        return f"q4_1 forward (integer kernels, {self.isa})"

    def rope(self, n: int):
        """cos/sin tables covering positions < n (grown on demand, shared read-only). One attribute
        holds both: a call reads the pair once and holds it for its length, so a table that another
        session's cache grows is never freed under it, nor paired with the other's older table."""
        self._rope = rope_covering(self._rope, self.args, n, torch.empty(0))
        return self._rope

    def new_cache(self, max_len: int) -> KVCache:
        self.rope(max_len + 1)
        a = self.args
        return KernelCache(self.lib, a.n_layers, a.n_kv_heads, max_len, a.head_dim, torch.float16, self.device)

    def streamed_bytes(self) -> int:
        return self._streamed

    def embedding(self) -> torch.Tensor:
        return rows_of(self.lib, self.c_embed, torch.arange(self.c_embed.N))

    @torch.no_grad()
    def prefill(self, cache: KVCache, tokens, positions):
        feats, taps = self._call(cache, tokens, positions, None, bool(self.aux_layers), None)
        return (feats if taps is None else taps), self.logits(feats[-1:])[0]

    @torch.no_grad()
    def verify(self, cache: KVCache, tokens, positions, tree_mask=None, clock=None, best: torch.Tensor | None = None,
               prof: torch.Tensor | None = None):
        """forward.TargetForward.verify as one call of the kernels: the forward, every row's logits
        and, into `best` [N] (int64), each row's argmax (`prof`: see _call)."""
        if clock is not None:
            clock.lap("verify_inputs")
        logits = torch.empty(tokens.numel(), self.args.vocab_size)
        feats, taps = self._call(cache, tokens, positions, tree_mask, bool(self.aux_layers), logits, prof, best)
        return (feats if taps is None else taps), logits

    def logits(self, features: torch.Tensor) -> torch.Tensor:
        """The LM head of rows [.., D] (fp32)."""
        y = matmul(self.lib, self._c_model.lm_head, features.reshape(-1, self.args.dim))
        return y.reshape(*features.shape[:-1], -1)

    def _call(self, cache: KVCache, tokens, positions, tree_mask, with_taps: bool, logits: torch.Tensor | None,
              prof: torch.Tensor | None = None, best: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor | None]:
        """One qf_forward of T new tokens after the committed cache, `tree_mask` [T, T] (None:
        causal): (post-norm features [T, D], the states entering `aux_layers` side by side [T,
        len * D] or None); with `logits` [T, vocab], the LM head of every row too; with `prof`
        [threads, len(OPS)] (float64), each thread's seconds per op added to it; with `best` [T]
        (int64, and logits), each row's argmax."""
        if tokens.device.type != "cpu":
            raise UserError("The q4_1 forward runs on the CPU; use --dtype float32 or bfloat16 on a GPU.")
        start, T, D = cache.length, tokens.numel(), self.args.dim
        a = self.args
        check_cache(cache, a.n_layers, a.n_kv_heads, a.head_dim, "the q4_1 forward")
        if positions.numel() != T or (tree_mask is not None and tuple(tree_mask.shape) != (T, T)):
            raise ValueError(f"the q4_1 forward: {T} tokens need {T} positions and a [{T}, {T}] tree mask "
                             f"(got {positions.numel()} and {None if tree_mask is None else list(tree_mask.shape)})")
        if logits is not None and (logits.dtype != torch.float32 or tuple(logits.shape) != (T, a.vocab_size)
                                   or not logits.is_contiguous()):
            raise ValueError(f"the q4_1 forward: logits must be fp32 [{T}, {a.vocab_size}], contiguous")
        if start + T > cache.max_len:
            raise RuntimeError("KV cache full")
        toks = tokens.reshape(T).to(torch.int64)
        pos = positions.reshape(T).to(torch.int64)
        visible = None if tree_mask is None or T == 1 else tree_mask.reshape(T, T).to(torch.uint8).contiguous()
        if best is not None and (logits is None or best.dtype != torch.int64 or best.numel() != T
                                 or not best.is_contiguous()):
            raise ValueError(f"best must be a contiguous int64 tensor of {T} entries beside the logits")
        x = torch.empty(T, D)
        taps = torch.empty(T, len(self.aux_layers) * D) if with_taps else None
        cos, sin = self._rope   # held for the call: another session may grow the tables meanwhile
        rc = self.lib.qf_forward(ctypes.byref(self._c_model), toks.data_ptr(), x.data_ptr(), T, cos.data_ptr(),
                                 sin.data_ptr(), min(cos.shape[0], sin.shape[0]), cache.k.data_ptr(),
                                 cache.v.data_ptr(), cache.max_len, start, pos.data_ptr(), _ptr(visible), self._taps,
                                 len(self.aux_layers) if with_taps else 0, _ptr(taps), _ptr(logits), _ptr(best),
                                 torch.get_num_threads(), _ptr(prof))
        if rc == -2:
            raise UserError("A token id or a position outside the model's vocabulary or its RoPE tables.")
        if rc == -3:
            raise ValueError(f"the q4_1 forward: taps {list(self._taps)} must be distinct layers in 0..{a.n_layers}")
        if rc == -4:
            raise ValueError(head_size_problem(self._c_model.hd))
        if rc != 0:
            raise RuntimeError("q4_1 forward: more visible keys than the cache holds")
        return x, taps


class Q8Weight:
    """A frozen fp32 weight's Q8_0 copy that llama.linear multiplies through the kernels (an
    EAGLE-1/2 draft head under q4_1: a quarter of fp32's bytes a call; drafts need no exactness,
    only the target's verification does). llama.PackedWeight's contract: `valid_for` checks that
    the weight is still the one copied, `apply` multiplies."""

    def __init__(self, weight: torch.Tensor, lib: ctypes.CDLL):
        w = weight.detach()
        self.lib = lib
        self._keep: list = []
        self.cmat = _cmat(quantise_q8_0(w), self._keep)
        self.key = (w.data_ptr(), w._version, tuple(w.shape))

    def valid_for(self, weight: torch.Tensor) -> bool:
        return self.key == (weight.data_ptr(), weight._version, tuple(weight.shape))

    def apply(self, x2: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
        y = matmul(self.lib, self.cmat, x2)
        return y if bias is None else y + bias

    @staticmethod
    def build(weight: torch.Tensor, lib: ctypes.CDLL) -> "Q8Weight | None":
        """The copy, or None (the fp32 matmul) for a matrix the kernels cannot take."""
        if weight.device.type != "cpu" or weight.dim() != 2 or weight.shape[1] % QK:
            return None
        return Q8Weight(weight, lib)


class KernelDraft:
    """forward.DraftForward for an EAGLE-3 head in qforward.cpp (`qf_draft`), its matrices in
    Q8_0: one call (fc, the layer, the final norm, the draft LM head, log-softmax and each row's
    top k) instead of some sixty small torch operations. Built from the head module, which it does
    not keep; the token embedding is the target's blocks (a head with its own embedding: that,
    in Q8_0). Its cache is fp16, like the target's. It drafts a whole EAGLE-2 tree in one call
    too (`draft_tree`)."""

    drafts_trees = True

    def __init__(self, head, target: KernelTarget):
        m, a = head.midlayer, head.args
        self.args, self.lib, self._keep = a, target.lib, []
        att, mlp = m.self_attn, m.mlp
        mats = [_cmat(quantise_q8_0(lin.weight), self._keep) for lin in
                (att.q_proj, att.k_proj, att.v_proj, att.o_proj, mlp.gate_proj, mlp.up_proj, mlp.down_proj)]
        norms = [m.input_layernorm.weight, m.hidden_norm.weight, m.post_attention_layernorm.weight]
        layer = _CHead3(a.dim, a.n_heads, a.n_kv_heads, a.head_dim, a.intermediate, int(m.norm_before_residual),
                        a.norm_eps, 0, *[_owned(w, self._keep) for w in norms], *mats)
        fc = quantise_q8_0(head.fc.weight)
        fc.bias = head.fc.bias
        embed = _cmat(quantise_q8_0(head.embed_tokens.weight), self._keep) if head.has_embed else target.c_embed
        self._target = target  # whose embedding blocks it reads
        ids = None if head.draft_ids is None else head.draft_ids.to(torch.int64).clone().contiguous()
        self.draft_ids, self.vocab_size = ids, a.vocab_size
        self.vocab = head.lm_weight.shape[0]
        self.c = _CDraft(layer, _cmat(fc, self._keep), embed, _owned(head.norm.weight, self._keep),
                         _cmat(quantise_q8_0(head.lm_weight), self._keep), _ptr(ids), a.vocab_size, 0)
        self._rope = (None, None)
        self.description = "draft step in Q8_0 on the same kernels"

    @staticmethod
    def fits(head) -> bool:
        return (getattr(head, "midlayer", None) is not None and not head.args.qkv_bias
                and shape_problem(head.args) is None and head.fc.weight.shape[1] % QK == 0)

    def new_cache(self, max_len: int) -> KVCache:
        self._rope = rope_covering(self._rope, self.args, max_len + 1, torch.empty(0))
        a = self.args
        return KVCache(1, a.n_kv_heads, max_len, a.head_dim, torch.float16, torch.device("cpu"))

    def to_target_ids(self, idx: torch.Tensor) -> torch.Tensor:
        return idx if self.draft_ids is None else self.draft_ids[idx]

    def _check(self, cache: KVCache) -> None:
        a = self.args
        check_cache(cache, 1, a.n_kv_heads, a.head_dim, "the draft head's step")

    @torch.no_grad()
    def step(self, cache: KVCache, features, tokens, positions, start: int, tree_mask=None, k: int = 0,
             last_only: bool = False):
        T = tokens.numel()
        self._check(cache)
        if features.dim() != 2 or features.shape[0] != T or positions.numel() != T:
            raise ValueError(f"the draft head's step: {T} tokens need features [{T}, width] and {T} positions "
                             f"(got {list(features.shape)} and {positions.numel()})")
        if tree_mask is not None and tuple(tree_mask.shape) != (T, start + T - cache.length):
            raise ValueError(f"the draft head's step: its tree mask must be [{T}, {start + T - cache.length}] "
                             f"(got {list(tree_mask.shape)})")
        if start + T > cache.max_len:
            raise RuntimeError("draft cache full")
        feats = features.float().contiguous()
        toks = tokens.to(torch.int64).contiguous()
        cos, sin = self._rope
        cos, sin = cos[positions].contiguous(), sin[positions].contiguous()
        tree = None if tree_mask is None else tree_mask.to(torch.uint8).contiguous()
        k = min(k, self.vocab)
        lm_from = T - 1 if last_only else 0   # the rows that get log-probabilities: lm_from..T-1
        g, logp = torch.empty(T, self.args.dim), torch.empty(T - lm_from, self.vocab)
        top = (torch.empty(T - lm_from, k), torch.empty(T - lm_from, k, dtype=torch.int64)) if k else None
        rc = self.lib.qf_draft(ctypes.byref(self.c), toks.data_ptr(), feats.data_ptr(), feats.shape[-1], T,
                               cos.data_ptr(), sin.data_ptr(), cache.k.data_ptr(), cache.v.data_ptr(), cache.max_len,
                               cache.length, start, _ptr(tree), g.data_ptr(), logp.data_ptr(), k,
                               _ptr(top[0]) if top else None, _ptr(top[1]) if top else None, lm_from,
                               torch.get_num_threads())
        if rc == -1:
            raise RuntimeError("draft cache full")
        if rc == -3:
            raise ValueError(f"the draft head's step ranks at most {TOPK_MAX} candidates a row (asked {k})")
        if rc == -4:
            raise ValueError(head_size_problem(self.c.layer.hd))
        if rc != 0:
            raise UserError("The draft head was given a token outside its vocabulary or features of a width it "
                            "does not read.")
        return g, logp, top


    # the pool's columns and the verification's layout as qf_draft_tree fills them (QTreeOut)
    TREE_COLUMNS = {"tokens": np.int64, "parents": np.int32, "depths": np.int32, "ranks": np.int32,
                    "logp": np.float32, "values": np.float32, "levels": np.int32, "kept": np.uint8,
                    "beam": np.int32}
    VERIFY_COLUMNS = {"order": np.int32, "parent_pos": np.int32}

    @classmethod
    def tree_arrays(cls, top_k: int, depth: int, total_tokens: int) -> dict[str, np.ndarray]:
        """Empty arrays for one qf_draft_tree call of this shape (the caller keeps them: the tree)."""
        nodes = 1 + top_k + depth * top_k * top_k
        verify = min(total_tokens, nodes)
        out = {k: np.empty(nodes, dt) for k, dt in cls.TREE_COLUMNS.items()}
        out.update({k: np.empty(verify, dt) for k, dt in cls.VERIFY_COLUMNS.items()})
        out["beam_len"] = np.empty(depth + 1, np.int32)
        out["rank_sum"], out["rank_count"] = np.empty(top_k), np.empty(top_k, np.int32)
        out["mask"] = np.empty(verify * verify, np.uint8)
        return out

    @torch.no_grad()
    def draft_tree(self, cache: KVCache, root: int, root_g: torch.Tensor, root_top: tuple, base_pos: int,
                   top_k: int, depth: int, total_tokens: int, out: dict[str, np.ndarray],
                   budget: dict | None = None) -> dict:
        """A whole cycle's draft tree in one call (qf_draft_tree: EAGLE-2's levels, the budget's
        choices, the rerank and the verification's layout) into `out` (tree_arrays). The root's
        reading: its feature `root_g` [D] and its best children `root_top` (log-probs, target ids),
        best first. `budget` None: EAGLE-2 at this shape; else the auto budget's data: mode (a
        TreeBudget), tn [total_tokens] and rank_prob [top_k] (float64), prices [w + 1] (float64,
        NaN unseen: updated in place), spent0, call_guess, decay, explore_depth, explore (an Explore).
        Returns the counts (n, n_beams, draft_calls, n_verify, best_n, expected) and head_s, the
        seconds its draft-head steps took."""
        cos, sin = self._rope
        self._check(cache)
        if root_g.numel() != self.args.dim or root_top[0].numel() != root_top[1].numel():
            raise ValueError(f"draft_tree: the root's feature must have {self.args.dim} values and its children "
                             f"as many ids as log-probs")
        if base_pos + depth >= min(cos.shape[0], sin.shape[0]) or cache.length + depth * top_k > cache.max_len:
            raise RuntimeError("draft cache full")
        g = root_g.float().contiguous()
        vals = root_top[0].float().contiguous()
        ids = root_top[1].to(torch.int64).contiguous()
        b = budget or {}
        f64 = lambda name, n: np.ascontiguousarray(b[name], dtype=np.float64) if budget else np.zeros(n)  # noqa: E731
        tn, ranks = f64("tn", total_tokens), f64("rank_prob", top_k)
        prices = b["prices"] if budget else np.full(2, np.nan)
        if len(tn) < total_tokens or len(ranks) < top_k or prices.dtype != np.float64 or not prices.flags.c_contiguous:
            raise ValueError("the budget's tables are shorter than the tree's shape or not float64")
        cin = _CTreeIn(root, g.data_ptr(), vals.data_ptr(), ids.data_ptr(), vals.numel(), top_k, depth, total_tokens,
                       cache.length, base_pos, cache.max_len, min(cos.shape[0], sin.shape[0]),
                       cache.k.data_ptr(), cache.v.data_ptr(), cos.data_ptr(), sin.data_ptr(),
                       int(b.get("mode", TreeBudget.EAGLE2)), int(b.get("explore_depth", 0)),
                       int(b.get("explore", Explore.BEST)),
                       len(prices) - 1, float(b.get("spent0", 0.0)), float(b.get("call_guess", 0.0)),
                       float(b.get("decay", 0.0)), tn.ctypes.data, ranks.ctypes.data, prices.ctypes.data,
                       torch.get_num_threads(), 0)
        cout = _CTreeOut(len(out["tokens"]), len(out["order"]), *(out[k].ctypes.data for k in (
            "tokens", "parents", "depths", "ranks", "logp", "values", "levels", "kept", "beam", "rank_sum", "rank_count",
            "beam_len", "order", "parent_pos", "mask")), 0, 0, 0, 0, 0, 0, 0.0, 0.0)
        rc = self.lib.qf_draft_tree(ctypes.byref(self.c), ctypes.byref(cin), ctypes.byref(cout))
        if rc == -1:
            raise RuntimeError("draft cache full")
        if rc == -3:
            raise ValueError(f"qf_draft_tree: a tree of top_k {top_k}, depth {depth}, {total_tokens} tokens does "
                             f"not fit its arrays (top_k at most 16)")
        if rc == -4:
            raise ValueError(head_size_problem(self.c.layer.hd))
        if rc != 0:
            raise UserError("The draft head was given a token outside its vocabulary.")
        return {k: getattr(cout, k) for k in ("n", "n_beams", "draft_calls", "n_verify", "best_n", "expected", "head_s")}


# ------------------------------------------------------------------ building one


def _gguf_tensors(gguf: Path) -> dict:
    from gguf import GGUFReader
    return {t.name: t for t in GGUFReader(str(gguf)).tensors}


def _gguf_norms(gguf: Path, args, tensors: dict | None = None) -> tuple[list, torch.Tensor]:
    """The embedded model's norm weights, as shipped (F32): per layer (attention norm, MLP norm),
    and the final norm."""
    tensors = tensors or _gguf_tensors(gguf)

    def read(name: str) -> torch.Tensor:
        t = tensors[name]
        if t.tensor_type.name != "F32":
            raise UserError(f"{gguf.name}: {name} is {t.tensor_type.name}, not F32; use --dtype float32.")
        return torch.from_numpy(t.data.copy()).float().reshape(-1)
    norms = [(read(f"blk.{i}.attn_norm.weight"), read(f"blk.{i}.ffn_norm.weight")) for i in range(args.n_layers)]
    return norms, read("output_norm.weight")


def _gguf_blocks(gguf: Path, args, tensors: dict | None = None) -> tuple[list[dict], QMatrix, QMatrix | None]:
    """The embedded model's blocks, as shipped, rows in Hugging Face's order: (layers, LM head,
    token embedding or None where the LM head is the embedding)."""
    kinds = {"Q4_1": Q4_1, "Q8_0": Q8_0}
    tensors = tensors or _gguf_tensors(gguf)

    def read(name: str) -> QMatrix:
        t = tensors[name]
        kind = kinds.get(t.tensor_type.name)
        if kind is None:
            raise UserError(f"{gguf.name}: tensor {name} is {t.tensor_type.name}, which the q4_1 kernels do "
                            f"not read (they read Q4_1 and Q8_0); use --dtype float32.")
        return from_gguf(torch.from_numpy(t.data.copy()), kind)

    def unpermute(m: QMatrix, heads: int) -> QMatrix:
        # llama.cpp's convert interleaves each head's rotary halves; undo it on whole rows
        N = m.shape[0]
        order = torch.arange(N).view(heads, N // heads // 2, 2).transpose(1, 2).reshape(N)
        return m.rows(order)

    names = {"q": "attn_q", "k": "attn_k", "v": "attn_v", "o": "attn_output", "gate": "ffn_gate",
             "up": "ffn_up", "down": "ffn_down"}
    layers = []
    for i in range(args.n_layers):
        blk = {k: read(f"blk.{i}.{n}.weight") for k, n in names.items()}
        blk["q"], blk["k"] = unpermute(blk["q"], args.n_heads), unpermute(blk["k"], args.n_kv_heads)
        layers.append(blk)
    if "output.weight" in tensors:
        return layers, read("output.weight"), read("token_embd.weight")
    return layers, read("token_embd.weight"), None


def _quantised_blocks(model: LlamaModel) -> tuple[list[dict], QMatrix, QMatrix | None]:
    """`model`'s weights quantised as ggml does (_gguf_blocks' result)."""
    layers = []
    for layer in model.layers:
        att, mlp = layer.self_attn, layer.mlp
        mats = {"q": att.q_proj, "k": att.k_proj, "v": att.v_proj, "o": att.o_proj,
                "gate": mlp.gate_proj, "up": mlp.up_proj, "down": mlp.down_proj}
        layers.append({k: quantise_q4_1(m.weight) for k, m in mats.items()})
    embed = None if model.args.tie_embeddings else quantise_q8_0(model.embed_tokens.weight)
    return layers, quantise_q8_0(model.lm_head.weight), embed


def _kernels_here(args, log):
    """The kernels' library, or None (the reason logged) where they cannot run here (no AVX2, no
    compiler); a UserError for a model shape they do not take."""
    problem = shape_problem(args)
    if problem:
        raise UserError(f"{problem}; use --dtype float32.")
    return library(log)


def _draft_for(target: KernelTarget, head):
    """The head's DraftForward beside the kernels' target: an EAGLE-3 head runs its whole step in
    the kernels (KernelDraft); another keeps its eager forward, its matmuls through Q8_0 copies (a
    matrix whose input is no multiple of 32 keeps its fp32 matmul)."""
    from .forward import EagerDraft
    if KernelDraft.fits(head):
        return KernelDraft(head, target)
    head.pack(lambda w: Q8Weight.build(w, target.lib))
    return EagerDraft(head, "Q8_0 matmuls on the q4_1 kernels")


def gguf_backends(args, gguf: Path, head, own_lm: torch.Tensor | None, log=None):
    """(KernelTarget, the head's DraftForward) for the embedded model, from its GGUF alone: the
    blocks and norms as shipped, no fp32 model first. `head` (fp32, on the CPU) is attached here:
    to the LM head's fp32 values (the blocks dequantised: what the converted model holds, exactly)
    unless it has its own, and, where it runs eagerly without an embedding of its own, to the
    token embedding's. None where the kernels cannot run here."""
    lib = _kernels_here(args, log)
    if lib is None:
        return None
    tensors = _gguf_tensors(gguf)
    layers, lm, embed = _gguf_blocks(gguf, args, tensors)
    norms, final = _gguf_norms(gguf, args, tensors)
    del tensors   # the file's mapping goes before the blocks are packed: its pages count as resident
    target = KernelTarget(args, layers, lm, embed, norms, final, lib, head.aux_layers)
    if not getattr(head, "has_embed", False) and not KernelDraft.fits(head):
        table = (embed if embed is not None else lm).dequantised()
        head.embed_tokens.weight = torch.nn.Parameter(table, requires_grad=False)
    head.attach(lm.dequantised() if own_lm is None else None, own_lm)
    return target, _draft_for(target, head)


def kernel_backends(model: LlamaModel, head, log=None):
    """(KernelTarget, the head's DraftForward) for `model` (fp32, on the CPU; its `aux_layers` set)
    quantised as ggml does, and its attached `head`; None where the kernels cannot run here."""
    a = model.args
    lib = _kernels_here(a, log)
    if lib is None:
        return None
    layers, lm, embed = _quantised_blocks(model)
    for blk, layer in zip(layers, model.layers):
        att = layer.self_attn
        for name, lin in (("q", att.q_proj), ("k", att.k_proj), ("v", att.v_proj)):
            blk[name].bias = lin.bias   # _cmat keeps its own fp32 copy
    norms = [(ly.input_layernorm.weight, ly.post_attention_layernorm.weight) for ly in model.layers]
    target = KernelTarget(a, layers, lm, embed, norms, model.norm.weight, lib, model.aux_layers)
    return target, _draft_for(target, head)
