"""The q4_1 kernels' library: building it once (qforward.cpp and its headers, AVX2 the baseline,
the wider dot products chosen at run time), the instruction sets it may run, and its ABI: the
ctypes mirror of its structs, every export's signature and the numbers both sides share, checked
against the library's own layout when it loads (a library that disagrees is refused with one line).
"""
from __future__ import annotations

import ctypes
import logging
from pathlib import Path

import torch

from ..errors import UserError
from . import native
from .llama import KVCache
from .qblocks import Q4_1, Q8_0, QK, QMatrix
from .tree_modes import TREE_TOPK, CycleStage, Explore, TreeBudget

TOPK_MAX = 1024    # the most candidates the kernels rank a row (qrows.h's TOPK_MAX)
# the numbers qf_layout lists beside the structs, by its names: checked when the library loads
SHARED_CONSTANTS = {"TOPK_MAX": TOPK_MAX, "QT_TOPK": TREE_TOPK,
                    **{f"BUDGET_{m.name}": int(m) for m in TreeBudget}, **{f"EXPLORE_{e.name}": int(e) for e in Explore},
                    **{f"STAGE_{c.name}": int(c) for c in CycleStage}}
SOURCE = Path(__file__).with_name("qforward.cpp")
HEADERS = tuple(Path(__file__).with_name(n) for n in ("qabi.h", "qblocks.h", "qmatmul.h", "qrows.h", "qattention.h", "qprobe.h",
                                                    "qteam.h", "qtree.h", "qlayout.h", "qdraft.h", "qdraft_tree.h", "qcycle.h",
                                                    "qtest_exports.h"))
NAME = "eagle2_qforward"


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


# ------------------------------------------------------------------ the ctypes mirror of qforward.cpp

_i32, _ptr_t = ctypes.c_int32, ctypes.c_void_p


class CMat(ctypes.Structure):
    _fields_ = [("data", _ptr_t), ("bias", _ptr_t), ("N", _i32), ("K", _i32), ("type", _i32), ("pad_", _i32)]


class CLayer(ctypes.Structure):
    _fields_ = [("attn_norm", _ptr_t), ("q", CMat), ("k", CMat), ("v", CMat), ("o", CMat),
                ("ffn_norm", _ptr_t), ("gate", CMat), ("up", CMat), ("down", CMat)]


class CModel(ctypes.Structure):
    _fields_ = [("D", _i32), ("H", _i32), ("KV", _i32), ("hd", _i32), ("F", _i32), ("L", _i32),
                ("eps", ctypes.c_float), ("vocab", _i32), ("layers", ctypes.POINTER(CLayer)), ("norm", _ptr_t),
                ("lm_head", CMat), ("embed", CMat)]


class CHead3(ctypes.Structure):
    _fields_ = [("D", _i32), ("H", _i32), ("KV", _i32), ("hd", _i32), ("F", _i32), ("norm_before_residual", _i32),
                ("eps", ctypes.c_float), ("pad_", _i32),
                ("input_norm", _ptr_t), ("hidden_norm", _ptr_t), ("post_norm", _ptr_t),
                ("q", CMat), ("k", CMat), ("v", CMat), ("o", CMat), ("gate", CMat), ("up", CMat), ("down", CMat)]


class CDraft(ctypes.Structure):
    _fields_ = [("layer", CHead3), ("fc", CMat), ("embed", CMat), ("norm", _ptr_t), ("lm", CMat), ("ids", _ptr_t),
                ("vocab", _i32), ("pad_", _i32)]


_dbl = ctypes.c_double


class CTreeIn(ctypes.Structure):
    _fields_ = [("root", ctypes.c_int64), ("root_g", _ptr_t), ("root_vals", _ptr_t), ("root_ids", _ptr_t),
                ("n_root", _i32), ("top_k", _i32), ("depth", _i32), ("total_tokens", _i32),
                ("committed", _i32), ("base_pos", _i32), ("cap", _i32), ("rope_rows", _i32),
                ("kc", _ptr_t), ("vc", _ptr_t), ("cos", _ptr_t), ("sin", _ptr_t),
                ("budget", _i32), ("explore_depth", _i32), ("explore", _i32), ("max_width", _i32),
                ("call_guess", _dbl), ("odds", _dbl), ("tn", _ptr_t), ("rank_prob", _ptr_t), ("prices", _ptr_t),
                ("threads", _i32), ("pad_", _i32)]


class CTreeOut(ctypes.Structure):
    _fields_ = [("cap_nodes", _i32), ("cap_verify", _i32), ("tokens", _ptr_t), ("parents", _ptr_t),
                ("depths", _ptr_t), ("ranks", _ptr_t), ("logp", _ptr_t), ("values", _ptr_t), ("levels", _ptr_t),
                ("kept", _ptr_t), ("beam", _ptr_t), ("rank_sum", _ptr_t), ("rank_count", _ptr_t), ("beam_len", _ptr_t),
                ("level_s", _ptr_t), ("order", _ptr_t), ("parent_pos", _ptr_t),
                ("mask", _ptr_t), ("n", _i32), ("n_beams", _i32), ("draft_calls", _i32), ("n_verify", _i32),
                ("best_n", _i32), ("pad_", _i32), ("expected", _dbl), ("head_s", _dbl)]


class CCycleIn(ctypes.Structure):
    _fields_ = [("kc", _ptr_t), ("vc", _ptr_t), ("cap", _i32), ("committed", _i32), ("cos", _ptr_t), ("sin", _ptr_t),
                ("taps", _ptr_t), ("rope_rows", _i32), ("ntaps", _i32), ("cap_rows", _i32), ("threads", _i32)]


class CCycleOut(ctypes.Structure):
    _fields_ = [("x", _ptr_t), ("aux", _ptr_t), ("logits", _ptr_t), ("best", _ptr_t), ("path", _ptr_t), ("g", _ptr_t),
                ("logp", _ptr_t), ("top_vals", _ptr_t), ("top_ids", _ptr_t), ("bonus", ctypes.c_int64),
                ("n_path", _i32), ("stage", _i32), ("tree_s", _dbl), ("forward_s", _dbl), ("accept_s", _dbl),
                ("commit_s", _dbl), ("absorb_s", _dbl)]


_int = ctypes.c_int
_MAT, _MODEL, _DRAFT = ctypes.POINTER(CMat), ctypes.POINTER(CModel), ctypes.POINTER(CDraft)
# Every exported function's arguments and result (pointers to tensors' data as c_void_p).
SIGNATURES = {
    "qf_layout": ([], ctypes.c_char_p),
    "qf_block_bytes": ([_int], _int),
    "qf_rows": ([_MAT, _ptr_t, _int, _ptr_t], _int),
    "qf_ops": ([], _int),
    "qf_isa": ([], _int),
    "qf_supports": ([_int], _int),
    "qf_set_isa": ([_int], _int),
    "qf_set_prefetch": ([_int], _int),
    "qf_prefetch": ([], _int),
    "qf_set_kv_prefetch": ([_int], _int),
    "qf_kv_prefetch": ([], _int),
    "qf_matmul": ([_MAT, _ptr_t, _int, _ptr_t, _int], None),
    "qf_matmul_ref": ([_MAT, _ptr_t, _int, _ptr_t], None),
    "qf_int8_peak": ([_int, _int], _dbl),
    "qf_fma_peak": ([_int], _dbl),
    "qf_read_gbs": ([ctypes.c_int64, _int, _int], _dbl),
    "qf_forward": ([_MODEL, _ptr_t, _ptr_t, _int, _ptr_t, _ptr_t, _int, _ptr_t, _ptr_t, _int, _int, _ptr_t, _ptr_t,
                    _ptr_t, _int, _ptr_t, _ptr_t, _ptr_t, _int, _ptr_t], _int),
    "qf_draft": ([_DRAFT, _ptr_t, _ptr_t, _int, _int, _ptr_t, _ptr_t, _ptr_t, _ptr_t, _int, _int, _int, _ptr_t,
                  _ptr_t, _ptr_t, _int, _ptr_t, _ptr_t, _int, _int], _int),
    "qf_draft_tree": ([_DRAFT, ctypes.POINTER(CTreeIn), ctypes.POINTER(CTreeOut)], _int),
    "qf_cycle": ([_MODEL, _DRAFT, ctypes.POINTER(CTreeIn), ctypes.POINTER(CTreeOut), ctypes.POINTER(CCycleIn),
                  ctypes.POINTER(CCycleOut)], _int),
    "qf_commit": ([_ptr_t, _ptr_t, ctypes.c_int64, _int, _int, _int, _ptr_t, _int], _int),
    "qf_argmax": ([_ptr_t, _int, _int], ctypes.c_int64),
    "qf_rmsnorm": ([_ptr_t, _ptr_t, _ptr_t, _int, ctypes.c_float, _int], None),
    "qf_exp": ([_ptr_t, _ptr_t, _int, _int], _int),
    "qf_silu_mul": ([_ptr_t, _ptr_t, _int, _int], _int),
    "qf_log_softmax": ([_ptr_t, _int, _int], None),
    "qf_top_k": ([_ptr_t, _int, _int, _ptr_t, _ptr_t, _ptr_t, _int], _int),
    "qf_attend": ([_ptr_t, _int, _int, _ptr_t, _ptr_t, _int, _ptr_t, _ptr_t, _int, ctypes.c_float, _ptr_t, _int], _int),
    "qf_best_width": ([_ptr_t, _int, _ptr_t, _int, _ptr_t, _int, _dbl, _dbl, _ptr_t, _int, _dbl, _ptr_t, _int], _int),
}
MIRRORED = {"QMat": CMat, "QLayer": CLayer, "QModel": CModel, "QHead3": CHead3, "QDraft": CDraft,
             "QTreeIn": CTreeIn, "QTreeOut": CTreeOut, "QCycleIn": CCycleIn, "QCycleOut": CCycleOut}


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
        mirror = MIRRORED[struct]
        mine = ctypes.sizeof(mirror) if not field else getattr(mirror, field).offset
        if mine != int(value):
            return f"{name} is {value} in the library and {mine} in qlib.py"
    for kind, size in ((Q4_1, 320), (Q8_0, 544)):
        if lib.qf_block_bytes(kind) != size:
            return f"a block of type {kind} is {lib.qf_block_bytes(kind)} bytes in the library, {size} here"
    return None


# What each export's nonzero return codes mean (qforward.cpp's comment above each): the exception a
# caller raises and its line, formatted with what the caller knows (check_code). A code not listed
# is a bug in the caller or the library: a RuntimeError naming it.
FORWARD_CODES = {
    -1: (RuntimeError, "q4_1 forward: more visible keys than the cache holds"),
    -2: (UserError, "A token id or a position outside the model's vocabulary or its RoPE tables."),
    -3: (ValueError, "the q4_1 forward: taps {taps} must be distinct layers in 0..{layers}"),
    -4: (ValueError, "{head_size}"),
}
DRAFT_CODES = {
    -1: (RuntimeError, "draft cache full"),
    -2: (UserError, "The draft head was given a token outside its vocabulary or features of a width it does not "
                    "read."),
    -3: (ValueError, "the draft head's step ranks at most {topk_max} candidates a row (asked {k})"),
    -4: (ValueError, "{head_size}"),
}
TREE_CODES = {
    -1: (RuntimeError, "draft cache full"),
    -2: (UserError, "The draft head was given a token outside its vocabulary."),
    -3: (ValueError, "qf_draft_tree: a tree of top_k {top_k}, depth {depth}, {total_tokens} tokens does not fit "
                     "its arrays (top_k at most {tree_topk})"),
    -4: (ValueError, "{head_size}"),
}

# qf_cycle's codes by the part that returned them (QCycleOut.stage): each part's own table
CYCLE_CODES = {
    CycleStage.TREE: TREE_CODES,
    CycleStage.FORWARD: FORWARD_CODES,
    CycleStage.ABSORB: DRAFT_CODES,
    CycleStage.CYCLE: {-1: (RuntimeError, "qf_cycle: its arrays or a cache cannot hold the tree's {rows} rows")},
}


def check_code(export: str, rc: int, codes: dict, **known) -> None:
    """Raise what `codes` says for a nonzero `rc` of `export` (its line formatted with `known`)."""
    if rc == 0:
        return
    kind, line = codes.get(rc, (RuntimeError, f"{export} returned {rc}, a code it does not define"))
    raise kind(line.format(**known))


def declare(lib: ctypes.CDLL) -> None:
    """Give every exported function its argument and result types, then check the structs'
    layout; a library that disagrees is refused with one line (RuntimeError)."""
    for name, (args, result) in SIGNATURES.items():
        fn = getattr(lib, name)
        fn.argtypes, fn.restype = args, result
    problem = layout_problem(lib)
    if problem:
        raise RuntimeError(f"the q4_1 kernels' library does not match qlib.py: {problem}")


def check_cache(cache: KVCache, layers: int, kv: int, hd: int, who: str) -> None:
    """What the kernels read a cache as: fp16 [layers, 1, kv, max_len, hd], contiguous, on the CPU
    (they take a pointer and these sizes, and would read anything else as that); else one line."""
    want = (layers, 1, kv, cache.max_len, hd)
    for t in (cache.k, cache.v):
        if t.dtype != torch.float16 or tuple(t.shape) != want or not t.is_contiguous() or t.device.type != "cpu":
            raise ValueError(f"{who}: its cache must be fp16 {list(want)}, contiguous, on the CPU "
                             f"(got {str(t.dtype).removeprefix('torch.')} {list(t.shape)} on {t.device.type}"
                             f"{'' if t.is_contiguous() else ', not contiguous'})")


def matmul(lib: ctypes.CDLL, cmat: "CMat", x: torch.Tensor) -> torch.Tensor:
    """x [rows, K] times a packed matrix: [rows, N] in fp32 (its bias added in the kernels)."""
    if x.dim() != 2 or x.shape[1] != cmat.K:
        raise ValueError(f"matmul: the input must be [rows, {cmat.K}] (got {list(x.shape)})")
    x = x.float().contiguous()
    y = torch.empty(x.shape[0], cmat.N)
    lib.qf_matmul(ctypes.byref(cmat), x.data_ptr(), x.shape[0], y.data_ptr(), torch.get_num_threads())
    return y


def rows_of(lib: ctypes.CDLL, cmat: "CMat", rows: torch.Tensor) -> torch.Tensor:
    """Rows of a packed matrix as the fp32 values its blocks hold [len(rows), K]."""
    rows = rows.to(torch.int64).contiguous()
    out = torch.empty(rows.numel(), cmat.K)
    if lib.qf_rows(ctypes.byref(cmat), rows.data_ptr(), rows.numel(), out.data_ptr()) != 0:
        raise IndexError("a row outside the matrix")
    return out


def ptr_of(t: torch.Tensor | None) -> int | None:
    return None if t is None else t.data_ptr()


def owned_copy(t: torch.Tensor, keep: list) -> int:
    """A float32 copy of `t` that the kernels read (kept in `keep`): never a pointer into a
    module's parameter, which a later `.to()` or load would leave dangling."""
    c = t.detach().float().clone().contiguous()
    keep.append(c)
    return c.data_ptr()


def cmat_of(m: QMatrix, keep: list) -> CMat:
    """The kernels' view of `m` (its packed copy appended to `keep`, which must outlive it)."""
    N, K = m.shape
    packed = m.packed()
    keep.append(packed)
    bias = None if m.bias is None else owned_copy(m.bias, keep)
    return CMat(packed.data_ptr(), bias, N, K, m.kind, 0)
