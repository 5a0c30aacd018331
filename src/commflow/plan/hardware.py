"""Accelerator presets: peak dense FLOP/s per precision, HBM size and bandwidth (vendor data
sheets, SXM parts; MI250 per GCD, the rank of a commflow ``mi250`` topology)."""

from __future__ import annotations

from dataclasses import dataclass

from commflow.errors import CommflowError

PRECISION_BYTES = {"bf16": 2, "fp16": 2, "fp8": 1}
"""Bytes per element of activations and weights in each training precision."""


@dataclass(frozen=True, kw_only=True)
class Accelerator:
    """One GPU. FLOP/s are dense tensor-core peaks; bytes and bytes/s for memory."""

    name: str
    """Preset name."""
    peak_flops: dict[str, float]
    """Peak dense FLOP/s per precision (``bf16``, ``fp16``, ``fp8``)."""
    hbm_bytes: float
    """Memory capacity, bytes."""
    hbm_bandwidth: float
    """Memory bandwidth, bytes/s."""

    def peak(self, precision: str) -> float:
        """Peak FLOP/s in ``precision``; raises ``CommflowError`` when unsupported."""
        if precision not in self.peak_flops:
            raise CommflowError(
                f"{self.name} has no {precision} tensor cores; use one of "
                f"{', '.join(self.peak_flops)}"
            )
        return self.peak_flops[precision]


GIB = 2**30

ACCELERATORS: dict[str, Accelerator] = {
    a.name: a
    for a in (
        Accelerator(name="v100", peak_flops={"fp16": 125e12}, hbm_bytes=32 * GIB,
                    hbm_bandwidth=900e9),
        Accelerator(name="a100-40gb", peak_flops={"bf16": 312e12, "fp16": 312e12},
                    hbm_bytes=40 * GIB, hbm_bandwidth=1555e9),
        Accelerator(name="a100-80gb", peak_flops={"bf16": 312e12, "fp16": 312e12},
                    hbm_bytes=80 * GIB, hbm_bandwidth=2039e9),
        Accelerator(name="h100-sxm", peak_flops={"bf16": 989e12, "fp16": 989e12, "fp8": 1979e12},
                    hbm_bytes=80 * GIB, hbm_bandwidth=3350e9),
        Accelerator(name="h200", peak_flops={"bf16": 989e12, "fp16": 989e12, "fp8": 1979e12},
                    hbm_bytes=141 * GIB, hbm_bandwidth=4800e9),
        Accelerator(name="mi250", peak_flops={"bf16": 181e12, "fp16": 181e12},
                    hbm_bytes=64 * GIB, hbm_bandwidth=1638e9),
        Accelerator(name="mi300x", peak_flops={"bf16": 1307e12, "fp16": 1307e12,
                                               "fp8": 2615e12},
                    hbm_bytes=192 * GIB, hbm_bandwidth=5300e9),
    )
}  # fmt: skip
"""Accelerator presets by name."""


_IMPLIED = (("dgx-h100", "h100-sxm"), ("dgx-a100", "a100-80gb"), ("dgx1", "v100"),
            ("dgx2", "v100"), ("ndv2", "v100"), ("mi250", "mi250"))
"""Cluster preset prefixes and the accelerator their boxes hold."""


def implied_accelerator(cluster: str) -> str:
    """The accelerator a cluster preset's boxes hold (``dgx-h100x4`` -> ``h100-sxm``);
    ``a100-80gb`` for other clusters and topology files."""
    name = cluster.lower().rsplit("/", 1)[-1]
    return next((gpu for prefix, gpu in _IMPLIED if name.startswith(prefix)), "a100-80gb")


def get_accelerator(name: str) -> Accelerator:
    """A preset by name (case-insensitive); raises ``CommflowError`` for an unknown one."""
    key = name.lower().replace("_", "-")
    if key not in ACCELERATORS:
        raise CommflowError(f"unknown accelerator {name!r}; use one of {', '.join(ACCELERATORS)}")
    return ACCELERATORS[key]
