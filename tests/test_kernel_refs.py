"""The float kernels of the q4_1 forward (qrows.h, qattention.h) against their scalar references, the plain
C++ `<kernel>_ref` written beside each (as ggml keeps a `_generic` beside every SIMD kernel).

1. Bit for bit: each kernel (ref 0 of its qf_ export) gives the bits its reference (ref 1) gives,
   over sizes that reach every lane, tail and path: RMSNorm, exp (past both of its clamps, and
   where its rounding to nearest even matters), SiLU * up, log-softmax, top-k (ties), and
   attention over an fp16 cache on both of its paths (one or two queries reading the shared keys
   in place; three or more converting them once), shared keys across chunks and partial blocks,
   own keys in any slot order.
2. Right: each reference against torch in float64 within a loose tolerance (top-k exactly), so a
   reference that is wrong the same way as its kernel cannot pass 1.
3. Refusals: a head size attention does not take, a top k outside 0..TOPK_MAX, a SiLU length the
   kernel does not step, slots outside the cache.
"""
from __future__ import annotations

import numpy as np
import pytest
import torch

from eagle2.model import qlib

pytestmark = pytest.mark.skipif(qlib.cpu_problem() is not None, reason="the q4_1 kernels need AVX2")

EPS = 1e-5


@pytest.fixture(scope="module")
def lib():
    """The kernels' library alone (no model): built once into the session's cache."""
    built = qlib.library()
    assert built is not None, "the q4_1 kernels did not build"
    return built


def same_bits(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Equal as bit patterns (a -0 is not a +0, a NaN equals the same NaN)."""
    return a.shape == b.shape and torch.equal(a.contiguous().view(torch.int32), b.contiguous().view(torch.int32))


def _kernel_and_reference(run) -> tuple[torch.Tensor, torch.Tensor]:
    return run(0), run(1)


# ------------------------------------------------------------------ RMSNorm
def rmsnorm(lib, x: torch.Tensor, w: torch.Tensor, ref: int) -> torch.Tensor:
    y = torch.full_like(x, float("nan"))
    lib.qf_rmsnorm(x.data_ptr(), w.data_ptr(), y.data_ptr(), x.numel(), EPS, ref)
    return y


@pytest.mark.parametrize("D", [1, 3, 7, 8, 9, 15, 16, 17, 63, 100, 576, 1001])
def test_rmsnorm_equals_its_reference_and_float64(lib, D):
    """dot's 8 fma chains and hsum's order, then the tail one by one (D not a multiple of 8): many
    rows, as a last-bit difference in the sum of squares mostly vanishes in the rsqrt."""
    g = torch.Generator().manual_seed(D)
    for scale in (1e-3, 1.0, 40.0):
        for _ in range(40):
            x = torch.randn(D, generator=g) * scale
            w = 1 + 0.3 * torch.randn(D, generator=g)
            kern, ref = _kernel_and_reference(lambda r: rmsnorm(lib, x, w, r))
            assert same_bits(kern, ref), f"D={D}, scale {scale}"
            x64, w64 = x.double(), w.double()
            want = w64 * x64 * torch.rsqrt(x64.pow(2).mean() + EPS)
            torch.testing.assert_close(ref.double(), want, rtol=1e-5, atol=1e-6)


# ------------------------------------------------------------------ exp
def halfway_arguments() -> list[float]:
    """The floats x inside exp's clamps whose float product x * log2(e) lies exactly halfway
    between two integers: there k's rounding to nearest even (_mm256_round_ps, nearbyint) and
    rounding half away from zero part, and the two give other bits for some (x = -84.91...)."""
    c = np.float32(1.44269504088896341)
    half = np.arange(-126, 128).astype(np.float32) + np.float32(0.5)
    near = ((half / c).view(np.int32)[:, None] + np.arange(-30, 31, dtype=np.int32)).view(np.float32)
    hit = (near * c == half[:, None]) & (near >= np.float32(-87.3)) & (near <= np.float32(88.3))
    return sorted(near[hit].tolist())


HALFWAY = halfway_arguments()
# the clamps (-87.3, 88.3) and what lies past them, zeros of both signs, a NaN, the halfway cases
EDGES = [0.0, -0.0, 87.3, -87.3, 88.3, -88.3, 87.4, -88.4, 89.0, -90.0, 100.0, -100.0, 1e-30, -1e-30,
         float("nan"), *HALFWAY]


def exp(lib, x: torch.Tensor, ref: int) -> torch.Tensor:
    y = torch.full_like(x, float("nan"))
    assert lib.qf_exp(x.data_ptr(), y.data_ptr(), x.numel(), ref) == 0
    return y


def test_exp_equals_its_reference_and_float64(lib):
    """exp8 (Cephes' expf, 8 lanes) against exp_ref over its whole range, past its clamps and at
    the halfway cases of k's rounding; within a few ulp of exp inside the clamps, the clamps' own
    values outside them (a NaN takes the lower one, as _mm256_max_ps gives it)."""
    assert len(HALFWAY) > 200  # most of the 254 half-integers in range are some float's product
    g = torch.Generator().manual_seed(0)
    x = torch.cat([torch.linspace(-87.3, 88.3, 100_000), torch.rand(40_000, generator=g) * 240 - 120,
                   torch.tensor(EDGES)])
    x = torch.cat([x, torch.zeros(-x.numel() % 8)])
    kern, ref = _kernel_and_reference(lambda r: exp(lib, x, r))
    assert same_bits(kern, ref), x[kern.view(torch.int32) != ref.view(torch.int32)][:4].tolist()
    inside = (x >= -87.3) & (x <= 88.3)
    torch.testing.assert_close(ref[inside].double(), x[inside].double().exp(), rtol=1e-6, atol=0)
    low, high = exp(lib, torch.tensor([-87.3] * 8), 1)[0], exp(lib, torch.tensor([88.3] * 8), 1)[0]
    assert bool((ref[(x < -87.3) | x.isnan()] == low).all()) and bool((ref[x > 88.3] == high).all())
    assert lib.qf_exp(x.data_ptr(), kern.data_ptr(), 13, 0) == -1  # the kernel steps by 8


# ------------------------------------------------------------------ SiLU
def silu_mul(lib, x: torch.Tensor, u: torch.Tensor, ref: int) -> torch.Tensor:
    g = x.clone()
    assert lib.qf_silu_mul(g.data_ptr(), u.data_ptr(), x.numel(), ref) == 0
    return g


@pytest.mark.parametrize("n", [8, 16, 24, 64, 136, 1536])
def test_silu_mul_equals_its_reference_and_float64(lib, n):
    """g / (1 + exp(0 - g)) * u in the kernel's order, over normal values, -100..100 and the edges."""
    g = torch.Generator().manual_seed(n)
    rows = [torch.randn(n, generator=g) * 4, torch.rand(n, generator=g) * 200 - 100,  # -100..100: the clamps
            torch.tensor(EDGES + [1.0] * (-len(EDGES) % 8))]
    for x in rows:
        u = torch.randn(x.numel(), generator=g)
        kern, ref = _kernel_and_reference(lambda r: silu_mul(lib, x, u, r))
        assert same_bits(kern, ref), f"n={x.numel()}: {x[(kern != ref) & ~kern.isnan()][:4].tolist()}"
        finite = ~x.isnan()
        want = (x.double() * torch.sigmoid(x.double()) * u.double())[finite]
        torch.testing.assert_close(ref.double()[finite], want, rtol=1e-5, atol=1e-6)
        assert bool(ref[~finite].isnan().all())


def test_silu_mul_reference_takes_any_length_and_the_kernel_its_steps(lib):
    x = torch.randn(13)
    u = torch.randn(13)
    assert lib.qf_silu_mul(x.clone().data_ptr(), u.data_ptr(), 13, 0) == -1  # the kernel steps by 8: refused
    torch.testing.assert_close(silu_mul(lib, x, u, 1).double(), x.double() * torch.sigmoid(x.double()) * u.double(),
                               rtol=1e-5, atol=1e-6)


# ------------------------------------------------------------------ log-softmax
def log_softmax(lib, x: torch.Tensor, ref: int) -> torch.Tensor:
    y = x.clone()
    lib.qf_log_softmax(y.data_ptr(), y.numel(), ref)
    return y


@pytest.mark.parametrize("n", [1, 2, 7, 8, 9, 31, 64, 97, 1000, 4099])
def test_log_softmax_equals_its_reference_and_float64(lib, n):
    """The exponentials summed in 8 lanes over whole blocks, hsum's order, then the tail."""
    g = torch.Generator().manual_seed(n)
    rows = [torch.randn(n, generator=g) * 3, torch.rand(n, generator=g) * 200 - 100, torch.full((n,), 2.5),
            torch.tensor([0.0] + [a for a in HALFWAY if a < 0] * n)[:n]]  # exp(x - max) at the halfway cases
    for x in rows:
        kern, ref = _kernel_and_reference(lambda r: log_softmax(lib, x, r))
        assert same_bits(kern, ref), f"n={n}"
        torch.testing.assert_close(ref.double(), torch.log_softmax(x.double(), -1), rtol=1e-6, atol=1e-4)


# ------------------------------------------------------------------ top-k
def top_k(lib, x: torch.Tensor, k: int, ids: torch.Tensor | None, ref: int) -> tuple[torch.Tensor, torch.Tensor]:
    m = min(k, x.numel())
    vals, out = torch.full((m,), float("nan")), torch.full((m,), -7, dtype=torch.int64)
    rc = lib.qf_top_k(x.data_ptr(), x.numel(), k, None if ids is None else ids.data_ptr(), vals.data_ptr(),
                      out.data_ptr(), ref)
    assert rc == 0
    return vals, out


@pytest.mark.parametrize("n", [1, 5, 8, 50, 1000, 3000])
def test_top_k_equals_its_reference_and_torch_topk(lib, n):
    """Distinct values: the kernel's insertion ranking, the reference's sort and torch.topk agree
    exactly, indices mapped through ids when given."""
    g = torch.Generator().manual_seed(n)
    x = torch.randperm(4 * n, generator=g)[:n].float() / 7 - 50  # distinct
    ids = torch.randperm(10 * n, generator=g)[:n]
    for k in sorted(k for k in {1, 3, 16, n, n + 2} if k <= qlib.TOPK_MAX):
        for mapping in (None, ids):
            kern, ref = _kernel_and_reference(lambda r: top_k(lib, x, k, mapping, r))
            assert same_bits(kern[0], ref[0]) and torch.equal(kern[1], ref[1]), f"n={n}, k={k}"
            v, i = torch.topk(x, min(k, n))
            assert torch.equal(ref[0], v) and torch.equal(ref[1], i if mapping is None else mapping[i])


def test_top_k_ties_go_to_the_lower_index(lib):
    g = torch.Generator().manual_seed(0)
    rows = [torch.randint(0, 5, (300,), generator=g).float(), torch.tensor([0.0, -0.0, 1.0, 0.0, -0.0, 1.0]),
            torch.full((40,), 3.0)]
    for x in rows:
        n = x.numel()
        for k in (1, 4, n):
            kern, ref = _kernel_and_reference(lambda r: top_k(lib, x, k, None, r))
            assert same_bits(kern[0], ref[0]) and torch.equal(kern[1], ref[1])
            want = sorted(range(n), key=lambda i: (-x[i].item(), i))[:k]
            assert ref[1].tolist() == want and same_bits(ref[0], x[want])


def test_top_k_refuses_a_k_outside_its_buffer(lib):
    x = torch.randn(2000)
    vals, out = torch.empty(qlib.TOPK_MAX + 1), torch.empty(qlib.TOPK_MAX + 1, dtype=torch.int64)
    for ref in (0, 1):
        for k in (-1, qlib.TOPK_MAX + 1):
            assert lib.qf_top_k(x.data_ptr(), 2000, k, None, vals.data_ptr(), out.data_ptr(), ref) == -3
        assert lib.qf_top_k(x.data_ptr(), 2000, 0, None, vals.data_ptr(), out.data_ptr(), ref) == 0
    kern, ref = _kernel_and_reference(lambda r: top_k(lib, x, qlib.TOPK_MAX, None, r))
    assert torch.equal(kern[1], ref[1]) and torch.equal(ref[1], torch.topk(x, qlib.TOPK_MAX).indices)


# ------------------------------------------------------------------ attention
def attend(lib, q: torch.Tensor, kc: torch.Tensor, vc: torch.Tensor, lists: list[list[int]], shared: int,
           scale: float, ref: int) -> tuple[int, torch.Tensor]:
    """qf_attend: q [nq, hd], the fp16 cache kc, vc [cap, hd], each query's slots; (rc, out)."""
    nq, hd = q.shape
    slots = torch.tensor([s for lst in lists for s in lst], dtype=torch.int32)
    counts = torch.tensor([len(lst) for lst in lists], dtype=torch.int32)
    out = torch.full((nq, hd), float("nan"))
    rc = lib.qf_attend(q.data_ptr(), nq, hd, kc.data_ptr(), vc.data_ptr(), kc.shape[0], slots.data_ptr(),
                       counts.data_ptr(), shared, scale, out.data_ptr(), ref)
    return rc, out


def attention_float64(q: torch.Tensor, kc: torch.Tensor, vc: torch.Tensor, lists: list[list[int]], scale: float):
    rows = []
    for qi, lst in zip(q.double(), lists):
        k, v = kc[lst].double(), vc[lst].double()
        rows.append(torch.softmax(k @ qi * scale, -1) @ v)
    return torch.stack(rows)


def key_lists(g: torch.Generator, nq: int, shared: int, cap: int) -> list[list[int]]:
    """Each query's keys: the shared slots 0..shared-1, then 0-20 own slots past them in any order
    (at least one key in all)."""
    lists = []
    for _ in range(nq):
        own = int(torch.randint(0 if shared else 1, 21, (1,), generator=g))
        mine = (shared + torch.randperm(cap - shared, generator=g)[:own]).tolist()
        lists.append(list(range(shared)) + mine)
    return lists


@pytest.mark.parametrize("hd", [8, 16, 24, 64, 128])
@pytest.mark.parametrize("shared", [0, 5, 24, 64, 130])
def test_attention_equals_its_reference_on_both_paths_and_float64(lib, hd, shared):
    """One or two queries read the shared keys in place (whole blocks of 8, the rest gathered);
    three or more convert them once, KEY_CHUNK at a time, 8 lanes wide or (the AVX512 kernels,
    an even number of 8-lane chunks a head) 16: every query's output is its reference's bits on
    every path the CPU has, alone or beside others, and softmax attention in float64 within a
    tolerance. `sharp` queries make scores far apart (the exp's lower clamp)."""
    g = torch.Generator().manual_seed(hd * 1000 + shared)
    cap = shared + 48
    kc, vc = torch.randn(cap, hd, generator=g).half(), torch.randn(cap, hd, generator=g).half()
    scale = hd ** -0.5
    best, isas = lib.qf_isa(), [i for i in qlib.ISAS if lib.qf_supports(i)]
    try:
        for sharp in (1.0, 30.0):
            for nq in (1, 2, 3, 4, 9):
                q = torch.randn(nq, hd, generator=g) * sharp
                lists = key_lists(g, nq, shared, cap)
                ref = attend(lib, q, kc, vc, lists, shared, scale, 1)
                assert ref[0] == 0
                ref = ref[1]
                torch.testing.assert_close(ref.double(), attention_float64(q, kc, vc, lists, scale),
                                           rtol=1e-4, atol=1e-4)
                for isa in isas:
                    lib.qf_set_isa(isa)
                    rc, kern = attend(lib, q, kc, vc, lists, shared, scale, 0)
                    assert rc == 0 and same_bits(kern, ref), f"{qlib.ISAS[isa]} hd={hd} shared={shared} nq={nq} sharp={sharp}"
                    if nq > 1:  # the first query alone takes the other path, or the same one without company
                        _, alone = attend(lib, q[:1].contiguous(), kc, vc, lists[:1], shared, scale, 0)
                        assert same_bits(alone[0], ref[0])
    finally:
        lib.qf_set_isa(best)


def test_attention_refuses_a_head_size_or_slots_it_would_misread(lib):
    """attend_queries' lanes are fixed per head size: another (not a multiple of 8, over 128) was
    read as a smaller one or left unwritten. Both the kernel's entry and the reference's refuse it,
    and slots outside the cache or not starting with the shared ones."""
    g = torch.Generator().manual_seed(1)
    for hd in (0, 4, 12, 100, 136, 256):
        q, kc = torch.randn(2, hd, generator=g), torch.randn(8, hd, generator=g).half()
        for ref in (0, 1):
            assert attend(lib, q, kc, kc, [[0, 1], [2]], 0, 0.5, ref)[0] == -4, f"hd={hd}"
    q, kc = torch.randn(2, 16, generator=g), torch.randn(8, 16, generator=g).half()
    for lists, shared in (([[0, 8], [1]], 0), ([[0, -1], [1]], 0), ([[1, 0], [0, 1]], 2), ([[0], [0, 1]], 2),
                          ([[], [1]], 0)):
        for ref in (0, 1):
            assert attend(lib, q, kc, kc, lists, shared, 0.5, ref)[0] == -1, (lists, shared)
