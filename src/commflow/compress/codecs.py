"""Block codecs: float32 arrays to bytes and back (fp16, bf16, int8 and int4 with per-block scales).

int8 and int4 cut the array into blocks of ``block`` elements; each block carries its float32
absmax scale ``s = absmax / qmax`` (qmax 127 for int8, 7 for int4) and integers ``rint(x / s)``,
so every element decodes within ``s / 2`` of its value (ZeRO++, Wang et al. 2023). int4 packs two
values per byte. fp16 and bf16 are plain casts (no scale).
"""

from __future__ import annotations

from dataclasses import dataclass

import ml_dtypes
import numpy as np

from commflow.compress import kernels
from commflow.errors import CommflowError

CODECS = ("fp16", "bf16", "int8", "int4")
_QMAX = {"int8": 127, "int4": 7}


@dataclass(frozen=True, kw_only=True)
class Codec:
    """How a float32 array is encoded."""

    name: str = "int8"
    """One of ``CODECS``."""
    block: int = 256
    """Elements per scale block (int8, int4); even, at least 2."""

    def __post_init__(self) -> None:
        if self.name not in CODECS:
            raise CommflowError(f"codec {self.name!r}: unknown; use one of {', '.join(CODECS)}")
        if self.block < 2 or self.block % 2:
            raise CommflowError(f"codec {self.name}: block {self.block} must be even and >= 2")

    def encoded_bytes(self, n: int) -> int:
        """Bytes encoding ``n`` elements (``n`` a multiple of ``block`` for int codecs)."""
        if self.name in ("fp16", "bf16"):
            return 2 * n
        nblocks = -(-n // self.block)
        per = self.block if self.name == "int8" else self.block // 2
        return nblocks * (4 + per)


def wire_fraction(codec: str, element_bytes: float = 4.0) -> float:
    """Bytes ``codec`` puts on the wire per byte of ``element_bytes``-byte elements, for
    large arrays (the scale of every block included); ``none``: 1.

    Raises ``CommflowError`` for an unknown codec."""
    if codec == "none":
        return 1.0
    spec = Codec(name=codec)
    return spec.encoded_bytes(spec.block) / (spec.block * element_bytes)


def _blocks(x: np.ndarray, codec: Codec) -> np.ndarray:
    if x.size % codec.block:
        raise CommflowError(f"encode {codec.name}: {x.size} elements is not a multiple of "
                            f"block {codec.block}; pad the array")
    return x.reshape(-1, codec.block)


def scales(x: np.ndarray, codec: Codec) -> np.ndarray:
    """Per-block scales (float32) that ``encode`` uses for the int codecs: absmax / qmax."""
    return (np.abs(_blocks(x, codec)).max(axis=1) / np.float32(_QMAX[codec.name])).astype(
        np.float32)


def encode(x: np.ndarray, codec: Codec) -> np.ndarray:
    """Encode a 1-D float32 array into ``codec.encoded_bytes(x.size)`` bytes (uint8)."""
    x = np.ascontiguousarray(x, dtype=np.float32).reshape(-1)
    if codec.name == "fp16":
        return x.astype(np.float16).view(np.uint8)
    if codec.name == "bf16":
        return x.astype(ml_dtypes.bfloat16).view(np.uint8)
    _blocks(x, codec)
    out = np.empty(codec.encoded_bytes(x.size), np.uint8)
    kernels.encode_blocks(x, codec.block, _QMAX[codec.name], out)
    return out


def decode(buf: np.ndarray, n: int, codec: Codec, *, add_to: np.ndarray | None = None
           ) -> np.ndarray:
    """Decode ``n`` float32 elements from bytes made by :func:`encode`; with ``add_to`` (a
    float32 array of ``n``), add them to it in place and return it."""
    if buf.size != codec.encoded_bytes(n):
        raise CommflowError(f"decode {codec.name}: {buf.size} bytes, expected "
                            f"{codec.encoded_bytes(n)} for {n} elements")
    if codec.name in ("fp16", "bf16"):
        values = buf.view(np.float16 if codec.name == "fp16" else ml_dtypes.bfloat16)
        if add_to is None:
            return values.astype(np.float32)
        add_to += values
        return add_to
    out = np.empty(n, np.float32) if add_to is None else add_to
    kernels.decode_blocks(np.ascontiguousarray(buf), codec.block, _QMAX[codec.name], out,
                          add_to is not None)
    return out


class ErrorFeedback:
    """Per-tensor residuals (Seide et al. 2014; Karimireddy et al. 2019): what was not sent at
    one step is added to the next, so the sum of sent values tracks the sum of true values
    within one residual."""

    def __init__(self) -> None:
        self._residual: dict[str, np.ndarray] = {}

    def compensate(self, key: str, x: np.ndarray) -> np.ndarray:
        """``x`` plus the residual kept for ``key`` (``x`` itself the first time)."""
        r = self._residual.get(key)
        return x if r is None or r.shape != x.shape else x + r

    def update(self, key: str, compensated: np.ndarray, sent: np.ndarray) -> None:
        """Keep ``compensated - sent`` as ``key``'s residual."""
        self._residual[key] = (compensated - sent).astype(np.float32)

    def residual(self, key: str) -> np.ndarray | None:
        """The residual kept for ``key`` (``None`` before the first update)."""
        return self._residual.get(key)
