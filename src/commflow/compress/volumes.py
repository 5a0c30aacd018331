"""What compression does to a collective's time in the simulator: the bytes on the wire
shrink by :func:`~commflow.compress.codecs.wire_fraction`, the data the user reduces does
not."""

from __future__ import annotations

import dataclasses
import math

from commflow.compress.codecs import wire_fraction
from commflow.ir import Program
from commflow.sim import SimResult, simulate
from commflow.topology.graph import Topology


def simulate_compressed(program: Program, topology: Topology, size: float, codec: str, *,
                        element_bytes: float = 4.0, **options: object) -> SimResult:
    """:func:`commflow.sim.simulate` of ``program`` moving ``size`` bytes of
    ``element_bytes``-byte elements encoded with ``codec`` (``none``, ``fp16``, ``bf16``,
    ``int8``, ``int4``): the time of the program at the encoded size, and ``algbw`` /
    ``busbw`` against the uncompressed ``size``. Encoding and decoding are not timed.

    Raises ``CommflowError`` for an unknown codec and whatever ``simulate`` raises.
    """
    result = simulate(program, topology, size * wire_fraction(codec, element_bytes),
                      **options)  # type: ignore[arg-type]
    if codec == "none":
        return result
    algbw = size / result.time if result.time > 0 else math.inf
    factor = result.busbw / result.algbw if result.algbw and math.isfinite(result.algbw) \
        else 0.0
    return dataclasses.replace(result, size=size, algbw=algbw, busbw=algbw * factor)
