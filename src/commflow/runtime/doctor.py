"""Reading flight records (:mod:`commflow.runtime.flight`) of every rank and naming the rank
that fell out of step: the library behind ``commflow doctor``.

Records are grouped by communicator (job and ``comm_id``); within one, the collectives are
compared by sequence number, as PyTorch's flight-recorder analyser does, in this order:

1. the earliest sequence number that every rank recorded where the ranks called different
   collectives (operation, dtype, bytes, reduction, root, algorithm): ``mismatch``;
2. ranks of the communicator that left no record (with what follows, if it applies):
   ``missing_record``;
3. the ranks whose last collective is older than the others' (one entered only after another
   rank failed and asked for dumps counts as not entered): ``not_entered``;
4. a last collective that every rank entered alike but not every rank completed:
   ``incomplete`` (no rank out of step: a stalled or dead process, or the transport);
5. otherwise ``consistent``.

Independently of that, the ranks' times outside collectives are compared window by window:
stragglers (:mod:`commflow.runtime.straggler`) are listed with any finding.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path

from commflow.runtime.errors import FlightRecordError
from commflow.runtime.flight import FORMAT, SCHEDULED, STATES, VERSION
from commflow.runtime.straggler import Straggler, StragglerConfig, calls_of, find_in_records

_FIELDS = ("op", "dtype", "nbytes", "reduce", "root")


@dataclass(frozen=True, kw_only=True)
class FlightEntry:
    """One recorded operation."""

    seq: int
    """Sequence number (collectives and each peer's sends or receives count separately)."""
    kind: str
    """``"collective"`` or ``"p2p"``."""
    op: str
    """Collective (``"allreduce"`` ...) or ``"send"``/``"recv"``."""
    dtype: str
    """Element type."""
    count: int
    """Elements per rank, as the wire signature counts them."""
    nbytes: int
    """``count`` times the element size."""
    reduce: str | None
    """Reduction of a reducing collective."""
    root: int | None
    """Root of a rooted collective."""
    peer: int | None
    """Peer of a send or receive."""
    algorithm: str
    """Algorithm run (the one asked for while only scheduled)."""
    state: str
    """``scheduled``, ``started``, ``completed`` or ``failed``."""
    late: bool
    """Recorded after another rank failed and asked for dumps."""
    t_start: float | None
    """Unix time it started."""
    t_end: float | None
    """Unix time it completed or failed."""

    def describe(self, fields: Iterable[str] = ("nbytes",), *, op: bool = True) -> str:
        """``"allreduce, 4 MiB"``: the operation (unless ``op=False``) and ``fields``."""
        parts = [self.op] if op else []
        for field in fields:
            value = getattr(self, field)
            if field == "nbytes":
                parts.append(human_bytes(value))
            elif field == "root":
                parts.append(f"root {value}")
            elif field != "op":
                parts.append(str(value))
        return ", ".join(parts)


@dataclass(frozen=True, kw_only=True)
class FlightRecord:
    """One rank's dump."""

    path: Path
    """The file it was read from."""
    job: str
    """Job id."""
    comm_id: int
    """Communicator id (0: the world)."""
    rank: int
    """Rank in the communicator."""
    global_rank: int
    """Rank in the job."""
    nranks: int
    """Size of the communicator."""
    next_seq: int
    """One past the last collective's sequence number."""
    trigger: str
    """Why it was written."""
    failed_peer: int | None
    """The global rank whose failure asked for dumps, if one did before this was written."""
    entries: tuple[FlightEntry, ...]
    """The operations kept, oldest first."""

    @property
    def collectives(self) -> dict[int, FlightEntry]:
        """The collectives kept, by sequence number."""
        return {e.seq: e for e in self.entries if e.kind == "collective"}


@dataclass(frozen=True, kw_only=True)
class Diagnosis:
    """What ``commflow doctor`` found for one communicator."""

    job: str
    comm_id: int
    nranks: int
    kind: str
    """``consistent``, ``mismatch``, ``not_entered``, ``missing_record`` or ``incomplete``."""
    seq: int | None
    """The collective concerned (``None``: nothing recorded)."""
    culprits: tuple[int, ...]
    """Ranks (of the communicator) out of step."""
    message: str
    """One sentence naming them, the collective and what the others did."""
    records: tuple[FlightRecord, ...]
    """The records read, by rank."""
    stragglers: tuple[Straggler, ...] = ()
    """Ranks (of the communicator) slower than the others over a window of collectives."""

    @property
    def ok(self) -> bool:
        """Whether every rank completed the same collectives."""
        return self.kind == "consistent"


def human_bytes(nbytes: int) -> str:
    """``4194304`` as ``"4 MiB"``, ``1536`` as ``"1.5 KiB"``, ``12`` as ``"12 B"``."""
    value, unit = float(nbytes), "B"
    for bigger in ("KiB", "MiB", "GiB", "TiB"):
        if value < 1024:
            break
        value, unit = value / 1024, bigger
    return f"{nbytes} B" if unit == "B" else f"{value:.3g} {unit}"


def ranks_text(ranks: Sequence[int]) -> str:
    """``"rank 2"`` or ``"ranks 0,1,3"``."""
    return f"rank {ranks[0]}" if len(ranks) == 1 else f"ranks {','.join(map(str, ranks))}"


# -- reading ------------------------------------------------------------------------------
def _field(data: dict, key: str, kinds: tuple[type, ...], where: str, *, optional=False):
    value = data.get(key)
    if value is None and optional:
        return None
    if not isinstance(value, kinds) or (isinstance(value, bool) and bool not in kinds):
        expected = " or ".join(k.__name__ for k in kinds)
        raise FlightRecordError(f"{where}.{key}: expected {expected}, got {value!r}")
    return value


def _entry(data, where: str) -> FlightEntry:
    if not isinstance(data, dict):
        raise FlightRecordError(f"{where}: expected an object, got {data!r}")
    num = (int, float)
    entry = FlightEntry(
        seq=_field(data, "seq", (int,), where), kind=_field(data, "kind", (str,), where),
        op=_field(data, "op", (str,), where), dtype=_field(data, "dtype", (str,), where),
        count=_field(data, "count", (int,), where), nbytes=_field(data, "bytes", (int,), where),
        reduce=_field(data, "reduce", (str,), where, optional=True),
        root=_field(data, "root", (int,), where, optional=True),
        peer=_field(data, "peer", (int,), where, optional=True),
        algorithm=_field(data, "algorithm", (str,), where),
        state=_field(data, "state", (str,), where), late=_field(data, "late", (bool,), where),
        t_start=_field(data, "t_start", num, where, optional=True),
        t_end=_field(data, "t_end", num, where, optional=True))
    if entry.kind not in ("collective", "p2p") or entry.state not in STATES or entry.seq < 0:
        raise FlightRecordError(f"{where}: kind must be collective or p2p, state one of "
                                f"{', '.join(STATES)} and seq >= 0; got {entry.kind!r}, "
                                f"{entry.state!r}, {entry.seq}")
    return entry


def load_record(path: str | Path) -> FlightRecord:
    """Read one dump. Raises ``FlightRecordError`` naming the file and the bad field."""
    path = Path(path)
    try:
        data = json.loads(path.read_text())
    except OSError as err:
        raise FlightRecordError(f"{path}: cannot read: {err.strerror}") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as err:
        raise FlightRecordError(f"{path}: not JSON ({err}); give the flight-rank<N>.json "
                                f"files a failed job wrote") from None
    if not isinstance(data, dict) or data.get("format") != FORMAT:
        raise FlightRecordError(f"{path}: not a commflow flight record (no \"format\": "
                                f"\"{FORMAT}\")")
    if data.get("version") != VERSION:
        raise FlightRecordError(f"{path}: flight record version {data.get('version')!r}; this "
                                f"commflow reads version {VERSION}")
    where = str(path)
    entries = _field(data, "entries", (list,), where)
    record = FlightRecord(
        path=path, job=_field(data, "job", (str,), where),
        comm_id=_field(data, "comm_id", (int,), where), rank=_field(data, "rank", (int,), where),
        global_rank=_field(data, "global_rank", (int,), where),
        nranks=_field(data, "nranks", (int,), where),
        next_seq=_field(data, "next_seq", (int,), where),
        trigger=_field(data, "trigger", (str,), where),
        failed_peer=_field(data, "failed_peer", (int,), where, optional=True),
        entries=tuple(_entry(e, f"{where}: entries[{i}]") for i, e in enumerate(entries)))
    if not 0 <= record.rank < record.nranks:
        raise FlightRecordError(f"{path}: rank {record.rank} outside 0..{record.nranks - 1}")
    return record


def load_records(paths: Iterable[str | Path]) -> list[FlightRecord]:
    """Read the dumps at ``paths``; a directory stands for its ``flight-*.json`` files. Raises
    ``FlightRecordError`` when a path does not exist or a directory holds no record."""
    files: list[Path] = []
    for item in map(Path, paths):
        if item.is_dir():
            found = sorted(item.glob("flight-*.json"))
            if not found:
                raise FlightRecordError(f"{item}: no flight records (flight-*.json) in this "
                                        f"directory")
            files += found
        elif item.exists():
            files.append(item)
        else:
            raise FlightRecordError(f"{item}: no such file or directory")
    return [load_record(f) for f in files]


# -- analysis -----------------------------------------------------------------------------
def diagnose(records: Sequence[FlightRecord], *,
             stragglers: StragglerConfig = StragglerConfig()) -> list[Diagnosis]:
    """One :class:`Diagnosis` per communicator among ``records`` (see the module docstring),
    with the stragglers that ``stragglers`` defines. Raises ``FlightRecordError`` when two
    records claim the same rank or disagree on the communicator's size."""
    groups: dict[tuple[str, int], dict[int, FlightRecord]] = {}
    for record in records:
        group = groups.setdefault((record.job, record.comm_id), {})
        other = group.get(record.rank)
        if other is not None:
            raise FlightRecordError(f"{other.path} and {record.path} are both rank "
                                    f"{record.rank} of communicator {record.comm_id} of job "
                                    f"{record.job}; give each rank's record once")
        if group and next(iter(group.values())).nranks != record.nranks:
            raise FlightRecordError(f"{record.path}: communicator {record.comm_id} has "
                                    f"{record.nranks} ranks here but "
                                    f"{next(iter(group.values())).nranks} in another record")
        group[record.rank] = record
    found = []
    for _, group in sorted(groups.items()):
        by_rank = dict(sorted(group.items()))
        slow = find_in_records({r: calls_of(rec.entries) for r, rec in by_rank.items()},
                               stragglers)
        found.append(replace(_diagnose(by_rank), stragglers=tuple(slow)))
    return found


def _diagnose(by_rank: dict[int, FlightRecord]) -> Diagnosis:
    first = next(iter(by_rank.values()))
    colls = {r: rec.collectives for r, rec in by_rank.items()}
    last = {r: rec.next_seq - 1 for r, rec in by_rank.items()}
    missing = [r for r in range(first.nranks) if r not in by_rank]
    gone = (f"no record from {ranks_text(missing)} (a process that died before writing one, "
            f"or a file not given)")

    def found(kind: str, seq: int | None, culprits: Sequence[int], message: str) -> Diagnosis:
        prefix = "" if first.comm_id == 0 else f"communicator {first.comm_id}: "
        return Diagnosis(job=first.job, comm_id=first.comm_id, nranks=first.nranks, kind=kind,
                         seq=seq, culprits=tuple(sorted(culprits)), message=prefix + message,
                         records=tuple(by_rank.values()))

    low = max((min(c) if c else last[r] + 1) for r, c in colls.items())
    for seq in range(low, min(last.values()) + 1):
        verdict = _compare(seq, {r: colls[r][seq] for r in colls if seq in colls[r]})
        if verdict is not None:
            culprits, message = verdict
            return found("mismatch", seq, culprits, f"{message}; {gone}" if missing else message)
    lag = _not_entered(by_rank, colls)
    behind = min(last.values())
    entry = colls[first.rank].get(behind)
    what = f" ({entry.describe()})" if entry else ""
    if missing:
        if lag is not None:
            return found("missing_record", lag[0], [*missing, *lag[1]], f"{gone}; {lag[2]}")
        agree = (f"{ranks_text(list(by_rank))} agree up to collective seq {behind}{what}"
                 if behind >= 0 else "the others recorded no collective")
        return found("missing_record", None if behind < 0 else behind, missing,
                     f"{gone}; {agree}")
    if lag is not None:
        return found("not_entered", *lag)
    if behind < 0:
        return found("consistent", None, (), "no collective recorded; nothing to compare")
    unfinished = {r: colls[r][behind].state for r in colls
                  if behind in colls[r] and colls[r][behind].state != "completed"}
    if unfinished:
        states = "; ".join(
            f"{state} on {ranks_text([r for r, s in unfinished.items() if s == state])}"
            for state in sorted(set(unfinished.values())))
        return found("incomplete", behind, (), f"every rank entered collective seq {behind}"
                     f"{what} with the same arguments, but it is {states}: no rank fell out of "
                     f"step; look for a stalled, slow or dead process or a transport fault")
    return found("consistent", behind, (), f"all ranks completed seq {behind}; no mismatch")


def _not_entered(by_rank: dict[int, FlightRecord], colls: dict[int, dict[int, FlightEntry]]
                 ) -> tuple[int, list[int], str] | None:
    """``(seq, ranks, message)`` for the ranks furthest behind, if the ranks are not level. A
    collective a rank entered only after another rank failed counts as not entered."""
    in_time = {r: min((e.seq for e in colls[r].values() if e.late), default=rec.next_seq) - 1
               for r, rec in by_rank.items()}
    behind = min(in_time.values())
    if behind == max(in_time.values()):
        return None
    seq = behind + 1
    late = [r for r in by_rank if in_time[r] == behind]
    ahead = [r for r in by_rank if in_time[r] > behind]
    shown = [colls[r][seq] for r in ahead if seq in colls[r]]
    what = f" ({shown[0].describe()})" if shown else ""
    verb = "started" if any(e.state != SCHEDULED for e in shown) else "scheduled"
    message = f"{ranks_text(late)} never entered collective seq {seq}{what} that " \
              f"{ranks_text(ahead)} {verb}"
    tardy = [r for r in late if seq in colls[r]]
    if tardy:
        message += (f" in time ({ranks_text(tardy)} entered it only after rank "
                    f"{by_rank[tardy[0]].failed_peer} had failed)")
    return seq, late, message


def _compare(seq: int, entries: dict[int, FlightEntry]) -> tuple[list[int], str] | None:
    """``(culprits, message)`` when the ranks' calls for ``seq`` differ, else ``None``."""
    fields = _FIELDS
    keys = {r: tuple(getattr(e, f) for f in fields) for r, e in entries.items()}
    if len(set(keys.values())) == 1:
        fields = ("algorithm",)  # compared only once chosen: a scheduled call shows the request
        keys = {r: (e.algorithm,) for r, e in entries.items() if e.state != SCHEDULED}
        if len(set(keys.values())) <= 1:
            return None
    groups: dict[tuple, list[int]] = {}
    for r, key in keys.items():
        groups.setdefault(key, []).append(r)
    ordered = sorted(groups.values(), key=lambda ranks: (-len(ranks), ranks[0]))
    majority = len(ordered[0]) > len(ordered[1])
    differing = [f for i, f in enumerate(fields) if len({k[i] for k in groups}) > 1]
    shown = ("op",) if "op" in differing else differing

    def call(ranks: list[int]) -> str:
        entry = entries[ranks[0]]
        extra = [f for f in shown if f != "op"]
        return entry.op if not extra else f"{entry.op} ({entry.describe(extra, op=False)})"

    odd = ordered[1:] if majority else ordered
    said = [f"{ranks_text(g)} {'called ' if i == 0 else ''}{call(g)}" for i, g in enumerate(odd)]
    if majority:
        return ([r for g in odd for r in g],
                f"ranks disagree on collective seq {seq}: {', '.join(said)}, the others "
                f"{call(ordered[0])}")
    return (sorted(r for g in odd for r in g),
            f"ranks disagree on collective seq {seq}: {', '.join(said)} (no majority: any of "
            f"them may be the one out of step)")
