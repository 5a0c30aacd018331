"""The machine's memory copy bandwidth, and the busbw it allows a shared-memory collective.

A collective that moves data between processes through shared staging buffers (commflow's
shared-memory transport and its ``shm`` fast path) makes every rank copy its input into
shared memory and its output out of it. With a copy bandwidth of ``B`` bytes/s (bytes copied
per second by one process, each read once and written once), the busiest rank needs at least
``(in + out) / B`` seconds, where ``in`` and ``out`` are its input and output buffers in bytes.
For allreduce of ``S`` bytes ``in = out = S``, so ``algbw <= B/2`` and, with nccl-tests' factor
``2(n-1)/n``, ``busbw <= B (n-1)/n`` (``B/2`` for 2 ranks). The reduction itself (reading the
peers' staged blocks) only adds to this, and concurrent ranks share the memory system, so the
bound is optimistic, an upper bound. It holds for buffers larger than the last-level cache:
the probe copies 256 MiB, and smaller buffers are copied at cache bandwidth. Single-copy
kernel-assisted transports (Linux CMA, XPMEM, as Open MPI may use) copy once per byte and are
not bounded by it.
"""

from __future__ import annotations

import time

import numpy as np

from commflow.collectives import Collective, buffer_shape, busbw_factor, size_buffer
from commflow.errors import CommflowError

PROBE_BYTES = 256 << 20
"""Bytes copied per probe: far larger than the last-level caches."""

PROBE_REPEATS = 5
"""Probes per measurement; the fastest counts."""


def copy_bandwidth(nbytes: int = PROBE_BYTES, repeats: int = PROBE_REPEATS) -> float:
    """Best of ``repeats`` single-process ``numpy.copyto`` runs of ``nbytes`` bytes between
    two already touched arrays, in bytes copied per second. Raises ``CommflowError`` for
    ``nbytes < 1`` or ``repeats < 1``."""
    if nbytes < 1 or repeats < 1:
        raise CommflowError(
            f"copy probe needs nbytes >= 1 and repeats >= 1, got {nbytes}, {repeats}"
        )
    src = np.ones(nbytes, np.uint8)
    dst = np.zeros(nbytes, np.uint8)
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        np.copyto(dst, src)
        best = min(best, time.perf_counter() - start)
    return nbytes / best


def staged_busbw_bound(collective: Collective, nranks: int, bandwidth: float) -> float:
    """Upper bound on busbw (bytes/s) of ``collective`` on ``nranks`` ranks that copy their
    whole input into shared memory and their whole output out of it, with copy bandwidth
    ``bandwidth`` (bytes/s): ``busbw_factor * size / ((in + out) / bandwidth)``."""
    shape = buffer_shape(collective, nranks, 1)
    size_chunks = shape.output if size_buffer(collective) == "output" else shape.input
    copied_per_size_byte = (shape.input + shape.output) / size_chunks
    return busbw_factor(collective, nranks) * bandwidth / copied_per_size_byte
