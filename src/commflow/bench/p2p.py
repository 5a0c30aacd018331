"""Point-to-point benchmarks between two ranks of commflow's shared-memory runtime, as the OSU
micro-benchmarks measure them (``osu_latency``, ``osu_bw``, ``osu_bibw``).

* ``latency``: ping-pong; the time is half a round trip.
* ``bw``: rank 0 sends a window of messages, rank 1 receives them and answers with one byte;
  bandwidth = window x size / time of one window.
* ``bibw``: both ranks send a window to each other at once; bandwidth counts both directions.

:func:`run_p2p` starts the two ranks with the launcher (``python -m commflow.bench.p2p
SPEC.json``); rank 0 writes the results as JSON next to the spec. Messages larger than
:data:`LARGE` run a tenth of the iterations and warm-up, as OSU's defaults do. Nothing is
pickled.
"""

from __future__ import annotations

import json
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

from commflow.errors import CommflowError
from commflow.runtime import DEFAULT_TIMEOUT, Communicator, init
from commflow.runtime.launcher import launch

KINDS = ("latency", "bw", "bibw")
"""The benchmarks: ping-pong latency, bandwidth, bidirectional bandwidth."""

LARGE = 8192
"""Messages above this many bytes run ``iters // 10`` iterations (at least 1)."""


@dataclass(frozen=True, kw_only=True)
class P2PSpec:
    """One point-to-point benchmark; validated on construction (``CommflowError``)."""

    kind: str = "latency"
    """``latency``, ``bw`` or ``bibw``."""
    sizes: tuple[int, ...] = (1,)
    """Message sizes in bytes."""
    iters: int = 1000
    """Timed iterations per size (a tenth above :data:`LARGE` bytes)."""
    warmup: int = 100
    """Untimed iterations per size (a tenth above :data:`LARGE` bytes)."""
    window: int = 64
    """Messages in flight per iteration of ``bw`` and ``bibw``."""
    timeout: float = DEFAULT_TIMEOUT
    """Seconds any wait may take."""

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise CommflowError(f"unknown p2p benchmark {self.kind!r}; use one of {KINDS}")
        if not self.sizes or min(self.sizes) < 1:
            raise CommflowError(f"message sizes must be positive byte counts, got {self.sizes}")
        if self.iters < 1 or self.warmup < 0 or self.window < 1:
            raise CommflowError(
                f"need iterations >= 1, warm-up >= 0 and window >= 1, got {self.iters}, "
                f"{self.warmup}, {self.window}"
            )
        object.__setattr__(self, "sizes", tuple(self.sizes))

    def rounds(self, size: int) -> tuple[int, int]:
        """(warm-up, timed) iterations for messages of ``size`` bytes."""
        if size <= LARGE:
            return self.warmup, self.iters
        return self.warmup // 10, max(1, self.iters // 10)


@dataclass(frozen=True)
class P2PResult:
    """One size's result: ``value`` is seconds for ``latency``, bytes/s for ``bw``/``bibw``."""

    size: int
    value: float


def run_p2p(spec: P2PSpec) -> list[P2PResult]:
    """Run ``spec`` on two ranks of this machine and return one result per size.

    Raises ``CommflowError`` when the ranks fail or time out (their output is on standard
    error, prefixed with the rank).
    """
    with tempfile.TemporaryDirectory(prefix="commflow-p2p-") as tmp:
        path = Path(tmp) / "spec.json"
        path.write_text(json.dumps(asdict(spec)))
        status = launch([sys.executable, "-m", "commflow.bench.p2p", str(path)], 2,
                        timeout=spec.timeout * (len(spec.sizes) + 1))
        if status != 0:
            why = "timed out" if status == 124 else f"exited with status {status}"
            raise CommflowError(f"p2p {spec.kind} benchmark ranks {why}; their output is above")
        rows = json.loads((Path(tmp) / "result.json").read_text())
    return [P2PResult(size, value) for size, value in rows]


def _window(comm: Communicator, peer: int, bufs: list[np.ndarray], sending: bool) -> None:
    handles = [
        comm.send(b, peer, async_op=True) if sending else comm.recv(b, peer, async_op=True)
        for b in bufs
    ]
    for handle in handles:
        handle.wait()


def _exchange(comm: Communicator, peer: int, out: list[np.ndarray], into: list[np.ndarray]):
    """Both directions at once: each send followed by the matching receive, so that the
    ranks' in-order workers never both wait on a full connection."""
    handles = []
    for send, recv in zip(out, into, strict=True):
        handles.append(comm.send(send, peer, async_op=True))
        handles.append(comm.recv(recv, peer, async_op=True))
    for handle in handles:
        handle.wait()


def _iteration(comm: Communicator, kind: str, bufs: list[np.ndarray], into: list[np.ndarray],
               ack: np.ndarray) -> None:
    rank, peer = comm.rank, 1 - comm.rank
    if kind == "latency":
        first, second = (comm.send, comm.recv) if rank == 0 else (comm.recv, comm.send)
        first(bufs[0], peer)
        second(bufs[0], peer)
    elif kind == "bw":
        _window(comm, peer, bufs, sending=rank == 0)
        (comm.recv if rank == 0 else comm.send)(ack, peer)
    else:
        _exchange(comm, peer, bufs, into)
        (comm.recv if rank == 0 else comm.send)(ack, peer)


def measure(comm: Communicator, spec: P2PSpec) -> list[tuple[int, float]]:
    """This rank's side of ``spec``; on rank 0, ``(size, value)`` per size."""
    if comm.size != 2:
        raise CommflowError(f"p2p benchmarks run on 2 ranks, not {comm.size}")
    rows = []
    ack = np.zeros(1, np.uint8)
    for size in spec.sizes:
        count = 1 if spec.kind == "latency" else spec.window
        bufs = [np.full(size, comm.rank, np.uint8) for _ in range(count)]
        into = [np.empty(size, np.uint8) for _ in range(count)] if spec.kind == "bibw" else []
        warmup, iters = spec.rounds(size)
        for _ in range(warmup):
            _iteration(comm, spec.kind, bufs, into, ack)
        comm.barrier()
        start = time.perf_counter()
        for _ in range(iters):
            _iteration(comm, spec.kind, bufs, into, ack)
        elapsed = time.perf_counter() - start
        if spec.kind == "latency":
            rows.append((size, elapsed / (2 * iters)))
        else:
            directions = 2 if spec.kind == "bibw" else 1
            rows.append((size, directions * size * count * iters / elapsed))
    return rows


def main(argv: list[str]) -> int:
    """Rank entry point: ``argv`` is ``[SPEC.json]``; returns the exit status."""
    if len(argv) != 1:
        print("usage: python -m commflow.bench.p2p SPEC.json", file=sys.stderr)
        return 2
    path = Path(argv[0])
    fields = json.loads(path.read_text())
    spec = P2PSpec(**fields)
    comm = init(timeout=spec.timeout)
    rows = measure(comm, spec)
    if comm.rank == 0:
        (path.parent / "result.json").write_text(json.dumps(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
