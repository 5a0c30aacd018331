"""The flight recorder: every communicator's last N operations, dumped as JSON when one fails.

Modelled on PyTorch's NCCL flight recorder. A :class:`FlightRecorder` keeps a ring of
``capacity`` preallocated records (sequence number, operation, dtype, count and bytes,
algorithm, root or peer, state, timestamps) that each call overwrites in place, so recording
allocates nothing per call beyond the timestamps. When an operation fails (timeout, abort,
mismatch, protocol error) the communicator writes its record to
``<dump_dir>/flight-rank<R>.json`` (``flight-comm<ID>-rank<R>.json`` for a sub-communicator,
``R`` the global rank) and asks the other ranks of its host to write theirs
(:mod:`commflow.runtime.flight_dumps`); operations recorded after that are marked ``late``.
``commflow doctor`` (:mod:`commflow.runtime.doctor`) reads the files and names the rank that
fell out of step.

The files are JSON (:data:`FORMAT`, version :data:`VERSION`); nothing is pickled.
"""

from __future__ import annotations

import json
import math
import os
import socket
import tempfile
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from commflow.errors import CommflowError
from commflow.runtime.straggler import StragglerBoard, StragglerConfig

FORMAT = "commflow-flight-record"
"""The ``format`` field of every dump."""
VERSION = 1
"""The ``version`` field of every dump."""
DEFAULT_CAPACITY = 256
"""Operations kept per communicator unless ``COMMFLOW_FLIGHT_RECORDER`` says otherwise."""
MAX_CAPACITY = 1 << 20
"""The most operations a recorder keeps (each slot costs a few hundred bytes)."""

SCHEDULED, STARTED, COMPLETED, FAILED = "scheduled", "started", "completed", "failed"
STATES = (SCHEDULED, STARTED, COMPLETED, FAILED)
"""An operation is scheduled (queued with ``async_op=True``), started, completed or failed."""

_monotonic = time.monotonic
LOG_HEAD = 8
"""Words before the first entry of :attr:`FlightRecorder.log`: entries logged, the sequence
number that closes the current straggler window, capacity, then unused."""
LOG_ENTRY = 3
"""Words per entry of :attr:`FlightRecorder.log`: sequence number, kind, end (ns)."""
_NEVER = np.iinfo(np.int64).max


@dataclass(frozen=True, kw_only=True)
class FlightConfig:
    """How a communicator records its operations."""

    capacity: int = DEFAULT_CAPACITY
    """Operations kept (the oldest are overwritten); 0 turns the recorder off."""
    dump_dir: Path
    """Where failures write their records."""
    stragglers: StragglerConfig = StragglerConfig()
    """Straggler detection (:mod:`commflow.runtime.straggler`); it runs on the recorder and
    needs a window shorter than ``capacity``."""

    def __post_init__(self) -> None:
        if not isinstance(self.capacity, int) or not 0 <= self.capacity <= MAX_CAPACITY:
            raise CommflowError(f"flight recorder capacity must be an integer from 0 (off) to "
                                f"{MAX_CAPACITY}, got {self.capacity!r}")

    @classmethod
    def from_env(cls, env: Mapping[str, str], job: str) -> FlightConfig:
        """``COMMFLOW_FLIGHT_RECORDER`` (records kept, default 256, 0: off) and
        ``COMMFLOW_DUMP_DIR`` (default ``<tmp>/commflow-<job>``, the same for every rank of
        the job). Raises ``CommflowError`` on a value that is not a count."""
        text = env.get("COMMFLOW_FLIGHT_RECORDER", str(DEFAULT_CAPACITY))
        try:
            capacity = int(text)
        except ValueError:
            capacity = -1
        if not 0 <= capacity <= MAX_CAPACITY:
            raise CommflowError(f"COMMFLOW_FLIGHT_RECORDER={text!r}: give the number of "
                                f"operations to keep, 0 (off) to {MAX_CAPACITY}, e.g. 256")
        where = env.get("COMMFLOW_DUMP_DIR") or Path(tempfile.gettempdir()) / f"commflow-{job}"
        return cls(capacity=capacity, dump_dir=Path(where),
                   stragglers=StragglerConfig.from_env(env))


class _Record:
    """One slot of the ring, overwritten in place."""

    __slots__ = ("seq", "op", "dtype", "nbytes", "reduce", "root", "peer", "algo", "state",
                 "t_scheduled", "t_start", "t_end")

    def __init__(self) -> None:
        self.seq = -1
        self.state = ""

    def as_json(self, wall: float, failed_at: float | None) -> dict:
        """The record as JSON fields; ``wall`` converts monotonic seconds to Unix time, and
        ``failed_at`` (monotonic) is when another rank's failure was heard, if it was."""
        def stamp(t: float) -> float | None:
            return None if t is None else round(t + wall, 6)

        return {
            "seq": self.seq,
            "kind": "p2p" if self.peer is not None else "collective",
            "op": self.op,
            "dtype": str(np.dtype(self.dtype)),
            "count": self.nbytes // np.dtype(self.dtype).itemsize,
            "bytes": self.nbytes,
            "reduce": self.reduce,
            "root": self.root,
            "peer": self.peer,
            "algorithm": self.algo if isinstance(self.algo, str) else "program",
            "state": self.state,
            "late": failed_at is not None and self.t_scheduled >= failed_at,
            "t_scheduled": stamp(self.t_scheduled),
            "t_start": stamp(self.t_start),
            "t_end": stamp(self.t_end),
        }


class FlightRecorder:
    """The last ``capacity`` operations of one communicator (see the module docstring).

    ``meta`` holds the fields written at the top of every dump (job, comm_id, rank,
    global_rank, nranks, ranks).
    """

    def __init__(self, capacity: int, *, dump_dir: Path, meta: dict) -> None:
        if capacity < 1:
            raise CommflowError(f"a flight recorder keeps at least 1 operation, got {capacity}")
        self.capacity = capacity
        self.dump_dir = dump_dir
        self.meta = meta
        self._ring = [_Record() for _ in range(capacity)]
        self._recorded = 0
        self.log = np.zeros(LOG_HEAD + LOG_ENTRY * capacity, np.int64)
        """Calls completed in one step by compiled code (:mod:`commflow.runtime.lean`), which
        writes them here itself: :data:`LOG_HEAD` words (entries logged so far, the sequence
        number that closes the straggler window, capacity), then a ring of :data:`LOG_ENTRY`
        words per call (sequence number, kind from :meth:`kind`, ``CLOCK_MONOTONIC`` time
        in ns). Read with the ring of recorded calls, in time order."""
        self.log[1:3] = _NEVER, capacity
        self._kinds: list[tuple] = []
        self._active: _Record | None = None
        self._lock = threading.Lock()
        self._dumped: Path | None = None
        self.failed_peer: int | None = None
        """The global rank that asked for dumps after it failed."""
        self.failed_at: float | None = None
        """When (monotonic) that request was heard: operations recorded from then on are
        marked ``late`` in dumps (they began after that rank gave up)."""
        self.next_seq = 0
        """One past the last collective's sequence number recorded (written in dumps)."""
        self.board: StragglerBoard | None = None
        """Where this rank posts its straggler windows (``None``: no detection)."""
        self.window = 0
        self.window_end: float = math.inf
        """Sequence number of the collective that closes the current straggler window."""
        self.stragglers: list[dict] = []
        """Stragglers found on this host while running (written in dumps)."""

    def record(self, seq: int, op: str, dtype, nbytes: int, *, reduce: str | None,
               root: int | None, peer: int | None, algo, started: bool) -> _Record:
        """Fill the next slot for operation ``seq`` and return it, started or scheduled."""
        n = self._recorded
        r = self._ring[n % self.capacity]
        self._recorded = n + 1
        if peer is None:
            self.next_seq = seq + 1
        r.seq = seq
        r.op = op
        r.dtype = dtype
        r.nbytes = nbytes
        r.reduce = reduce
        r.root = root
        r.peer = peer
        r.algo = algo
        r.t_end = None
        r.t_scheduled = now = _monotonic()
        if started:
            r.state = STARTED
            r.t_start = now
            self._active = r
        else:
            r.state = SCHEDULED
            r.t_start = None
        return r

    def kind(self, op: str, dtype, nbytes: int, reduce: str | None, algo: str) -> int:
        """The code that :attr:`log` entries use for collectives of these fields."""
        key = (op, dtype, nbytes, reduce, algo)
        if key not in self._kinds:
            self._kinds.append(key)
        return self._kinds.index(key)

    def _logged(self) -> list[_Record]:
        """The entries of :attr:`log` still in its ring, oldest first, as records."""
        count = int(self.log[0])
        entries = []
        for i in range(max(0, count - self.capacity), count):
            at = LOG_HEAD + LOG_ENTRY * (i % self.capacity)
            seq, kind, ns = (int(v) for v in self.log[at:at + LOG_ENTRY])
            r = _Record()
            r.op, r.dtype, r.nbytes, r.reduce, r.algo = self._kinds[kind]
            r.seq, r.root, r.peer, r.state = seq, None, None, COMPLETED
            r.t_scheduled = r.t_start = r.t_end = ns / 1e9
            entries.append(r)
        return entries

    def _records(self) -> list[_Record]:
        """The last ``capacity`` operations recorded or logged, oldest first."""
        cut = self._recorded % self.capacity
        ring = [r for r in self._ring[cut:] + self._ring[:cut] if r.state]
        logged = self._logged()
        if logged:
            ring = sorted(ring + logged, key=lambda r: r.t_scheduled)[-self.capacity:]
        return ring

    def start(self, r: _Record, algo) -> None:
        """Mark a scheduled operation started with the algorithm chosen for it."""
        r.state = STARTED
        r.t_start = _monotonic()
        r.algo = algo
        self._active = r

    def complete(self, r: _Record) -> None:
        """Mark an operation completed."""
        r.state = COMPLETED
        r.t_end = _monotonic()
        self._active = None
        if r.seq >= self.window_end and r.peer is None:
            self.close_window()

    def close_window(self) -> None:
        """The end of a straggler window: post this rank's time outside its collectives."""
        size = self.board.config.window
        first = self.window * size
        self.board.close_window(self.window, self._completed(first - 1, first + size),
                                self.stragglers)
        self.window += 1
        self.set_window_end((self.window + 1) * size - 1)

    def _completed(self, lo: int, hi: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Sequence numbers, start and end times of the completed collectives ``lo <= seq <
        hi`` still kept, sorted by sequence number (the ring from its newest record back to the
        first collective before ``lo``, and the log)."""
        ring = []
        n = self._recorded
        for i in range(n - 1, max(n - self.capacity, 0) - 1, -1):
            r = self._ring[i % self.capacity]
            if r.peer is None:
                if r.seq < lo:
                    break
                if r.state == COMPLETED and r.seq < hi:
                    ring.append((r.seq, r.t_scheduled, r.t_end))
        entries = self.log[LOG_HEAD:].reshape(self.capacity, LOG_ENTRY)[:int(self.log[0])]
        logged = entries[(entries[:, 0] >= lo) & (entries[:, 0] < hi)]
        seqs = logged[:, 0]
        starts = ends = logged[:, 2] / 1e9
        if ring:
            extra = np.array(ring, float)
            seqs = np.concatenate([seqs, extra[:, 0].astype(np.int64)])
            starts = np.concatenate([starts, extra[:, 1]])
            ends = np.concatenate([ends, extra[:, 2]])
        order = np.argsort(seqs, kind="stable")
        return seqs[order], starts[order], ends[order]

    def set_window_end(self, seq: int) -> None:
        """Close the next straggler window after collective ``seq``."""
        self.window_end = self.log[1] = seq

    def fail(self, r: _Record | None = None) -> None:
        """Mark operation ``r`` failed (default: the one started last, if still running;
        with several operations in flight on lanes the caller names the one that failed)."""
        if r is None:
            r, self._active = self._active, None
        elif r is self._active:
            self._active = None
        if r is not None and r.state in (SCHEDULED, STARTED):
            r.state, r.t_end = FAILED, time.monotonic()

    def snapshot(self, trigger: str) -> dict:
        """The dump as a JSON-ready dict: metadata, then the records oldest first."""
        wall = time.time() - time.monotonic()
        logged = int(self.log[0])
        records = self._records()
        return {
            "format": FORMAT,
            "version": VERSION,
            **self.meta,
            "pid": os.getpid(),
            "host": socket.gethostname(),
            "capacity": self.capacity,
            "recorded": self._recorded + logged,
            "next_seq": max([self.next_seq] + [r.seq + 1 for r in records if r.peer is None]),
            "trigger": trigger,
            "failed_peer": self.failed_peer,
            "stragglers": list(self.stragglers),
            "dumped_at": round(time.time(), 6),
            "entries": [r.as_json(wall, self.failed_at) for r in records],
        }

    def dump(self, path: str | os.PathLike, trigger: str = "requested") -> Path:
        """Write the record to ``path`` as JSON, one operation per line (atomically: a
        temporary file, then a rename); returns the path. Raises ``CommflowError`` when it
        cannot be written."""
        path = Path(path)
        record = self.snapshot(trigger)
        entries = ",\n  ".join(json.dumps(e) for e in record.pop("entries"))
        head = "".join(f" {json.dumps(k)}: {json.dumps(v)},\n" for k, v in record.items())
        text = f'{{\n{head} "entries": [\n  {entries}\n ]\n}}\n'
        tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            tmp.write_text(text)
            os.replace(tmp, path)
        except OSError as err:
            tmp.unlink(missing_ok=True)
            raise CommflowError(f"cannot write flight record {path}: {err.strerror}; set "
                                f"COMMFLOW_DUMP_DIR to a writable directory") from None
        return path

    def default_path(self) -> Path:
        """``<dump_dir>/flight-rank<R>.json`` (``flight-comm<ID>-rank<R>.json`` off the world
        communicator), ``R`` the global rank."""
        comm = self.meta["comm_id"]
        name = f"flight-rank{self.meta['global_rank']}.json" if comm == 0 \
            else f"flight-comm{comm}-rank{self.meta['global_rank']}.json"
        return self.dump_dir / name

    def dump_after(self, trigger: str, *, failed: bool) -> Path | None:
        """Write the record to :meth:`default_path` after this rank's failure (``failed``:
        always, the latest failure tells the most) or on another rank's request (only when
        nothing was written yet). Returns the path, ``None`` when it could not be written."""
        with self._lock:
            if failed or self._dumped is None:
                try:
                    self._dumped = self.dump(self.default_path(), trigger)
                except CommflowError:
                    return None
            return self._dumped
