"""The GGUF's block formats on the Python side: a matrix in blocks of 32 values along its rows
(Q4_1 for the layers' matrices, Q8_0 for an LM head or embedding), read from a GGUF or quantised
here the way ggml does, and packed as the kernels read them (qblocks.h holds the C side and the
integer matmul's scalar reference)."""
from __future__ import annotations

from dataclasses import dataclass

import torch

QK = 32            # values per block
Q4_1, Q8_0 = 0, 1  # qforward.cpp's QMat.type


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
