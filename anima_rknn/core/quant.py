"""GGML block quantization in torch: weights kept as their blocks and dequantized where they are used, and the
encoders `anima-rknn quantize` writes with.

Each dequantizer repeats the arithmetic of the gguf package's reference (gguf.quants) in the same order, in fp32,
so the values agree bit for bit (tests/model/test_gguf.py); torch runs it vectorised and multi-threaded, about an
order of magnitude faster than numpy, which matters since a quantized layer is dequantized on every pass.
Q8_0, Q4_0, Q4_1, Q5_0 and Q5_1 are encoded by the gguf package itself; Q4_K and Q6_K by the plain scheme here
(per-sub-block min/max, 6-bit or 8-bit scales), which any GGML reader decodes.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import numpy as np
import torch
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType
from gguf import quantize as gguf_quantize

QK_K = 256
_CHUNK_VALUES = 1 << 18  # values dequantized per slice (1 MiB of fp32)


@dataclasses.dataclass
class QuantizedTensor:
    """A GGML-quantized tensor: `raw` holds its blocks, one row of bytes per row of the logical `shape`."""

    raw: torch.Tensor  # uint8 [prod(shape[:-1]), bytes per row]
    dtype: str  # GGML type name: Q8_0, Q4_K, ...
    shape: tuple[int, ...]

    @property
    def nbytes(self) -> int:
        return self.raw.numel()

    def dequantize(self, dtype: torch.dtype = torch.float32, out: torch.Tensor | None = None) -> torch.Tensor:
        """The values in `dtype` (into `out` if given), computed in fp32 a slice of rows at a time: the fp32
        temporaries stay small and in cache, and only the result is the weight's size."""
        size = GGML_QUANT_SIZES[GGMLQuantizationType[self.dtype]][1]
        out = torch.empty(self.shape, dtype=dtype) if out is None else out
        rows = out.view(self.raw.shape[0], -1)
        if self.dtype == "Q8_0" and dtype in (torch.bfloat16, torch.float16):
            blocks = self.raw.view(-1, size)
            _q8_0_narrow(blocks, out.view(-1, 32))
            return out
        step = max(1, _CHUNK_VALUES // rows.shape[1])
        for start in range(0, len(rows), step):
            part = self.raw[start:start + step]
            rows[start:start + step] = DEQUANTIZE[self.dtype](part.reshape(-1, size)).view(len(part), -1)
        return out


def _f16(raw: torch.Tensor) -> torch.Tensor:
    """Two bytes per row -> [N, 1] fp32 (copied first: a view needs an aligned start)."""
    return raw.contiguous().view(torch.float16).float()


def _nibbles(qs: torch.Tensor, groups: int) -> torch.Tensor:
    """[N, groups*L] bytes -> [N, groups, 2, L]: per group of L bytes the low nibbles, then the high ones."""
    qs = qs.reshape(qs.shape[0], groups, 1, -1)
    return torch.cat([qs & 0x0F, qs >> 4], dim=2)


def _bits(qh: torch.Tensor) -> torch.Tensor:
    """[N, B] bytes -> [N, 8B] bits, least significant first."""
    shifts = torch.arange(8, dtype=torch.uint8)
    return ((qh.unsqueeze(-1) >> shifts) & 1).reshape(qh.shape[0], -1)


def _q8_0(b: torch.Tensor) -> torch.Tensor:
    return b[:, 2:].view(torch.int8) * _f16(b[:, :2])


def _q8_0_narrow(b: torch.Tensor, out: torch.Tensor) -> None:
    """Q8_0 straight into a bf16/fp16 `out`: the codes cast (exactly) and scaled in that dtype, three times faster
    than through fp32 on CPUs. fp16 matches the fp32 path exactly (a product of an fp16 and an 8-bit code is exact
    in fp32, so one rounding either way); bf16 rounds the fp16 scale first, a difference of at most 2 bf16 ulps."""
    out.copy_(b[:, 2:].view(torch.int8))
    out.mul_(_f16(b[:, :2]).to(out.dtype))


def _q4_0(b: torch.Tensor) -> torch.Tensor:
    q = _nibbles(b[:, 2:], 1).reshape(b.shape[0], -1).to(torch.int8) - 8
    return _f16(b[:, :2]) * q.float()


def _q4_1(b: torch.Tensor) -> torch.Tensor:
    q = _nibbles(b[:, 4:], 1).reshape(b.shape[0], -1).float()
    return _f16(b[:, :2]) * q + _f16(b[:, 2:4])


def _q5(b: torch.Tensor, start: int) -> torch.Tensor:
    low = _nibbles(b[:, start + 4:], 1).reshape(b.shape[0], -1)
    return low | (_bits(b[:, start:start + 4]) << 4)


def _q5_0(b: torch.Tensor) -> torch.Tensor:
    return _f16(b[:, :2]) * (_q5(b, 2).to(torch.int8) - 16).float()


def _q5_1(b: torch.Tensor) -> torch.Tensor:
    return _f16(b[:, :2]) * _q5(b, 4).float() + _f16(b[:, 2:4])


def _q2_k(b: torch.Tensor) -> torch.Tensor:
    n = b.shape[0]
    scales, qs = b[:, :16], b[:, 16:80]
    d, dmin = _f16(b[:, 80:82]), _f16(b[:, 82:84])
    dl = (d * (scales & 0xF).float()).reshape(n, 16, 1)
    ml = (dmin * (scales >> 4).float()).reshape(n, 16, 1)
    shifts = torch.tensor([0, 2, 4, 6], dtype=torch.uint8).reshape(1, 1, 4, 1)
    q = ((qs.reshape(n, -1, 1, 32) >> shifts) & 3).reshape(n, 16, 16).float()
    return (dl * q - ml).reshape(n, QK_K)


def _q3_k(b: torch.Tensor) -> torch.Tensor:
    n = b.shape[0]
    hmask, qs, scales, d = b[:, :32], b[:, 32:96], b[:, 96:108], _f16(b[:, 108:110])
    low = torch.cat([scales[:, :8] & 0x0F, scales[:, :8] >> 4], dim=1)
    high = (scales[:, 8:12].reshape(n, 1, 4) >> torch.tensor([0, 2, 4, 6], dtype=torch.uint8).reshape(1, 4, 1))
    sc = ((low | ((high.reshape(n, 16) & 3) << 4)).to(torch.int8) - 32).float()
    dl = (d * sc).reshape(n, 16, 1)
    shifts = torch.tensor([0, 2, 4, 6], dtype=torch.uint8).reshape(1, 1, 4, 1)
    ql = ((qs.reshape(n, -1, 1, 32) >> shifts) & 3).reshape(n, 16, 16)
    qh = (hmask.reshape(n, 1, 32) >> torch.arange(8, dtype=torch.uint8).reshape(1, 8, 1)) & 1
    qh = qh.reshape(n, 16, 16) ^ 1  # a set bit means no offset
    q = (ql.to(torch.int8) - (qh << 2).to(torch.int8)).float()
    return (dl * q).reshape(n, QK_K)


def _scale_min_k4(scales: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The eight 6-bit scales and mins of a Q4_K / Q5_K block from their 12 packed bytes."""
    s = scales.reshape(-1, 3, 4)
    d, m, m_d = s[:, 0], s[:, 1], s[:, 2]
    sc = torch.cat([d & 0x3F, (m_d & 0x0F) | ((d >> 2) & 0x30)], dim=1)
    mn = torch.cat([m & 0x3F, (m_d >> 4) | ((m >> 2) & 0x30)], dim=1)
    return sc, mn


def _k_scales(b: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    n = b.shape[0]
    sc, mn = _scale_min_k4(b[:, 4:16])
    return (_f16(b[:, :2]) * sc.float()).reshape(n, -1, 1), (_f16(b[:, 2:4]) * mn.float()).reshape(n, -1, 1)


def _q4_k(b: torch.Tensor) -> torch.Tensor:
    d, dm = _k_scales(b)
    q = _nibbles(b[:, 16:], 4).reshape(b.shape[0], -1, 32).float()
    return (d * q - dm).reshape(b.shape[0], QK_K)


def _q5_k(b: torch.Tensor) -> torch.Tensor:
    n = b.shape[0]
    d, dm = _k_scales(b)
    ql = _nibbles(b[:, 48:], 4).reshape(n, -1, 32)
    qh = (b[:, 16:48].reshape(n, 1, 32) >> torch.arange(8, dtype=torch.uint8).reshape(1, 8, 1)) & 1
    q = (ql | (qh << 4)).float()
    return (d * q - dm).reshape(n, QK_K)


def _q6_k(b: torch.Tensor) -> torch.Tensor:
    n = b.shape[0]
    ql, qh, scales, d = b[:, :128], b[:, 128:192], b[:, 192:208], _f16(b[:, 208:210])
    d = (d * scales.view(torch.int8).float()).reshape(n, 16, 1)
    low = _nibbles(ql, 2).reshape(n, -1, 32)
    high = (qh.reshape(n, 2, 1, 32) >> torch.tensor([0, 2, 4, 6], dtype=torch.uint8).reshape(1, 1, 4, 1)) & 3
    q = ((low | (high.reshape(n, -1, 32) << 4)).to(torch.int8) - 32).reshape(n, 16, -1).float()
    return (d * q).reshape(n, QK_K)


DEQUANTIZE: dict[str, Callable[[torch.Tensor], torch.Tensor]] = {
    "Q8_0": _q8_0, "Q4_0": _q4_0, "Q4_1": _q4_1, "Q5_0": _q5_0, "Q5_1": _q5_1,
    "Q2_K": _q2_k, "Q3_K": _q3_k, "Q4_K": _q4_k, "Q5_K": _q5_k, "Q6_K": _q6_k,
}  # fmt: skip


# ------------------------------------------------------------------------------------------------------ encoding

def _f16_bytes(values: np.ndarray) -> np.ndarray:
    return values.astype(np.float16).reshape(-1, 1).view(np.uint8)


def _pack_nibbles(q: np.ndarray, groups: int) -> np.ndarray:
    """Inverse of _nibbles: [N, groups*2L] values 0..15 -> [N, groups*L] bytes."""
    q = q.reshape(q.shape[0], groups, 2, -1)
    return (q[:, :, 0] | (q[:, :, 1] << 4)).reshape(q.shape[0], -1).astype(np.uint8)


def _encode_q4_k(x: np.ndarray) -> np.ndarray:
    """Per sub-block of 32: offset min(0, min) and step (max - min)/15; both scaled by 6-bit codes."""
    sub = x.reshape(-1, 8, 32)
    low = np.minimum(sub.min(axis=2), 0)
    step = (sub.max(axis=2) - low) / 15
    d = (step.max(axis=1) / 63).astype(np.float16).astype(np.float32)
    dmin = (-low.min(axis=1) / 63).astype(np.float16).astype(np.float32)
    with np.errstate(divide="ignore", invalid="ignore"):
        sc = np.clip(np.rint(np.nan_to_num(step / d[:, None])), 0, 63).astype(np.uint8)
        mn = np.clip(np.rint(np.nan_to_num(-low / dmin[:, None])), 0, 63).astype(np.uint8)
        scale = (d[:, None] * sc)[:, :, None]
        q = np.clip(np.rint(np.nan_to_num((sub + (dmin[:, None] * mn)[:, :, None]) / scale)), 0, 15)
    packed = np.concatenate([
        sc[:, :4] | ((sc[:, 4:] >> 4) << 6), mn[:, :4] | ((mn[:, 4:] >> 4) << 6),
        (sc[:, 4:] & 0x0F) | ((mn[:, 4:] & 0x0F) << 4)], axis=1).astype(np.uint8)
    return np.concatenate([_f16_bytes(d), _f16_bytes(dmin), packed,
                           _pack_nibbles(q.reshape(len(x), -1).astype(np.uint8), 4)], axis=1)


def _encode_q6_k(x: np.ndarray) -> np.ndarray:
    """Per sub-block of 16: symmetric step max|x|/31 as an 8-bit code of one fp16 scale."""
    sub = x.reshape(-1, 16, 16)
    step = np.abs(sub).max(axis=2) / 31
    d = (step.max(axis=1) / 127).astype(np.float16).astype(np.float32)
    with np.errstate(divide="ignore", invalid="ignore"):
        sc = np.clip(np.rint(np.nan_to_num(step / d[:, None])), 0, 127).astype(np.int8)
        scale = (d[:, None] * sc)[:, :, None]
        q = (np.clip(np.rint(np.nan_to_num(sub / scale)), -32, 31) + 32).astype(np.uint8).reshape(len(x), -1)
    ql = _pack_nibbles(q & 0x0F, 2)
    high = (q >> 4).reshape(len(x), 2, 4, 32)
    qh = sum(high[:, :, s] << (2 * s) for s in range(4)).reshape(len(x), -1).astype(np.uint8)
    return np.concatenate([ql, qh, sc.view(np.uint8), _f16_bytes(d)], axis=1)


_ENCODE_K = {"Q4_K": _encode_q4_k, "Q6_K": _encode_q6_k}
ENCODABLE = ("F32", "F16", "BF16", "Q8_0", "Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q4_K", "Q6_K")


def encode(tensor: torch.Tensor, dtype: str) -> np.ndarray:
    """`tensor` in GGML type `dtype` (one of ENCODABLE): the bytes of a GGUF tensor, as uint8 [rows, row bytes]."""
    if dtype in ("F32", "F16", "BF16"):
        torch_dtype = {"F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16}[dtype]
        return tensor.to(torch_dtype).contiguous().view(torch.uint8).numpy()
    x = tensor.float().numpy().reshape(-1, tensor.shape[-1])
    if dtype in _ENCODE_K:
        block, size = GGML_QUANT_SIZES[GGMLQuantizationType[dtype]]
        return _ENCODE_K[dtype](x.reshape(-1, block)).reshape(x.shape[0], -1)
    return gguf_quantize(x, GGMLQuantizationType[dtype])
