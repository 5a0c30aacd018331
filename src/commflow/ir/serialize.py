"""JSON form of a program: the ``commflow.program`` schema, version 1.

A document is one JSON object::

    {"format": "commflow.program", "version": 1,
     "name": str, "collective": str, "nranks": int, "chunk_factor": int,
     "root": int | null, "params": {str: value},
     "participants": [
       {"kind": "rank" | "switch", "scratch_chunks": int,
        "channels": [
          {"id": int,
           "steps": [{"op": "send" | "recv" | "recv_reduce" | "copy" | "reduce",
                      "peer": int | null,
                      "src": [buffer, index, count] | null,
                      "dst": [buffer, index, count] | null,
                      "deps": [[channel, position], ...]}]}]}]}

``buffer`` is ``"input"``, ``"output"`` or ``"scratch"``; ``index`` and ``count`` are in chunks.
Participants ``0 .. nranks-1`` are the ranks, switches follow. A step's ``deps`` name steps of
the same participant by channel id and position in that channel. :func:`from_json` checks every
field and names the JSON path of the first malformed one (for example
``participants[2].channels[0].steps[5].op: unknown op 'sned'``), then rebuilds the program with
:func:`~commflow.ir.make_program`, so every structural check of the IR applies too.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path

import numpy as np

from commflow.collectives import parse_collective
from commflow.errors import CommflowError, ProgramError
from commflow.ir.build import make_program
from commflow.ir.msccl_import import from_msccl_xml
from commflow.ir.program import Program
from commflow.ir.step import Buffer, Op, ParticipantKind

FORMAT = "commflow.program"
"""Value of the ``format`` field of every program document."""

VERSION = 1
"""Schema version written by :func:`to_json` and the only one :func:`from_json` reads."""

_OP_NAMES = {op: op.name.lower() for op in Op}
_OPS = {name: op for op, name in _OP_NAMES.items()}
_OP_SPECS = {
    name: (int(op), op.communicates, op.reads_src, op.writes_dst) for name, op in _OPS.items()
}
_BUFFER_IDS = {b.label: int(b) for b in Buffer}
_KINDS = {k.name.lower(): k for k in ParticipantKind}
_TOP_FIELDS = ("format", "version", "name", "collective", "nranks", "chunk_factor", "root",
               "params", "participants")  # fmt: skip
_STEP_FIELDS = ("op", "peer", "src", "dst", "deps")
_STEP_KEYS = dict.fromkeys(_STEP_FIELDS).keys()
_INT_MAX = 2**31 - 1


def to_json(program: Program, *, indent: int | None = None) -> str:
    """The program as a ``commflow.program`` JSON document (compact unless ``indent``).

    Raises ``ProgramError`` when a parameter value in ``program.params`` has no JSON form.
    """
    t = program.table
    ops, peers, counts = t.op.tolist(), t.peer.tolist(), t.count.tolist()
    refs = [
        _refs(buf.tolist(), off.tolist(), counts)
        for buf, off in ((t.src_buf, t.src_off), (t.dst_buf, t.dst_off))
    ]
    names = list(_OP_NAMES.values())
    dep_ptr = t.dep_ptr.tolist()
    dep_pairs = [
        list(d)
        for d in zip(t.chan[t.dep_idx].tolist(), t.position[t.dep_idx].tolist(), strict=True)
    ]
    participants = [
        {"kind": p.kind.name.lower(), "scratch_chunks": p.scratch_chunks, "channels": []}
        for p in program.participants
    ]
    starts = t.channel_starts.tolist()
    for a, b in zip(starts[:-1], starts[1:], strict=True):
        steps = [
            {
                "op": names[ops[i]],
                "peer": peers[i] if peers[i] >= 0 else None,
                "src": refs[0][i],
                "dst": refs[1][i],
                "deps": dep_pairs[dep_ptr[i] : dep_ptr[i + 1]],
            }
            for i in range(a, b)
        ]
        participants[int(t.part[a])]["channels"].append({"id": int(t.chan[a]), "steps": steps})
    doc = {
        "format": FORMAT,
        "version": VERSION,
        "name": program.name,
        "collective": program.collective.value,
        "nranks": program.nranks,
        "chunk_factor": program.chunk_factor,
        "root": program.root,
        "params": dict(program.params),
        "participants": participants,
    }
    try:
        return json.dumps(doc, indent=indent, allow_nan=False)
    except (TypeError, ValueError) as err:
        raise ProgramError(
            f"{program.name}: a parameter has no JSON form ({err}); keep params to finite "
            "numbers, strings, booleans, null and lists of them"
        ) from None


def _refs(bufs: list[int], offs: list[int], counts: list[int]) -> list[list | None]:
    labels = [b.label for b in Buffer]
    return [
        None if b < 0 else [labels[b], o, c] for b, o, c in zip(bufs, offs, counts, strict=True)
    ]


def from_json(text: str) -> Program:
    """Rebuild a program from a ``commflow.program`` JSON document.

    Raises ``ProgramError`` naming the JSON path of the first malformed field, or the step that
    breaks a structural rule of the IR.
    """
    try:
        doc = json.loads(text)
    except json.JSONDecodeError as err:
        raise ProgramError(f"not a JSON document: {err}") from None
    except RecursionError:
        raise ProgramError("not a program: the JSON is nested too deeply") from None
    return _decode(doc)


def save_program(program: Program, path: str | Path) -> None:
    """Write ``program`` as JSON to ``path``; ``ProgramError`` when the file cannot be written."""
    text = to_json(program)
    try:
        Path(path).write_text(text)
    except OSError as err:
        raise ProgramError(f"cannot write program file {path}: {err.strerror}") from None


def load_program(path: str | Path) -> Program:
    """Read a program saved by :func:`save_program`, or MSCCL XML (a file ending in ``.xml``,
    :func:`~commflow.ir.msccl_import.from_msccl_xml`).

    Raises ``ProgramError`` prefixed with the file name when it cannot be read or is malformed.
    """
    try:
        text = Path(path).read_text()
    except OSError as err:
        raise ProgramError(f"cannot read program file {path}: {err.strerror}") from None
    except UnicodeDecodeError:
        raise ProgramError(f"{path} is not a text file; give a JSON program file") from None
    try:
        if Path(path).suffix.lower() == ".xml":
            return from_msccl_xml(text)
        return from_json(text)
    except ProgramError as err:
        raise ProgramError(f"{path}: {err}") from None


def _fail(path: str, message: str) -> ProgramError:
    return ProgramError(f"{path}: {message}")


def _object(value: object, path: str, fields: tuple[str, ...]) -> Mapping:
    if not isinstance(value, dict):
        raise _fail(path, f"expected an object, got {_kind(value)}")
    missing = [f for f in fields if f not in value]
    if missing:
        raise _fail(path, f"missing field(s) {', '.join(missing)}")
    unknown = sorted(set(value) - set(fields))
    if unknown:
        raise _fail(path, f"unknown field(s) {', '.join(unknown)}")
    return value


def _list(value: object, path: str) -> list:
    if not isinstance(value, list):
        raise _fail(path, f"expected a list, got {_kind(value)}")
    return value


def _int(value: object, path: str, minimum: int = 0) -> int:
    if type(value) is not int:
        raise _fail(path, f"expected an integer, got {_kind(value)}")
    if not minimum <= value <= _INT_MAX:
        raise _fail(path, f"must be between {minimum} and {_INT_MAX}, got {value}")
    return value


def _kind(value: object) -> str:
    if value is None:
        return "null"
    names = {bool: "a boolean", int: "an integer", float: "a number", str: "a string",
             list: "a list", dict: "an object"}  # fmt: skip
    return f"{names.get(type(value), type(value).__name__)} {json.dumps(value)[:40]}"


def _decode(doc: object) -> Program:
    doc = _object(doc, "document", _TOP_FIELDS)
    if doc["format"] != FORMAT:
        raise _fail("format", f"expected {FORMAT!r}, got {doc['format']!r}: not a program file")
    if doc["version"] != VERSION:
        raise _fail(
            "version",
            f"this commflow reads version {VERSION}, the file is version "
            f"{doc['version']!r}; use a matching commflow",
        )
    if not isinstance(doc["name"], str):
        raise _fail("name", f"expected a string, got {_kind(doc['name'])}")
    if not isinstance(doc["collective"], str):
        raise _fail("collective", f"expected a string, got {_kind(doc['collective'])}")
    try:
        collective = parse_collective(doc["collective"])
    except CommflowError as err:
        raise _fail("collective", str(err)) from None
    nranks = _int(doc["nranks"], "nranks", 1)
    chunk_factor = _int(doc["chunk_factor"], "chunk_factor", 1)
    root = doc["root"]
    if collective.rooted:
        root = _int(root, "root")
        if root >= nranks:
            raise _fail("root", f"rank {root} is outside ranks 0..{nranks - 1}")
    elif root is not None:
        raise _fail("root", f"{collective.value} has no root; write null")
    if not isinstance(doc["params"], dict):
        raise _fail("params", f"expected an object, got {_kind(doc['params'])}")
    params = {k: _frozen(v) for k, v in doc["params"].items()}
    decoder = _StepDecoder(_list(doc["participants"], "participants"), nranks)
    program = make_program(
        doc["name"],
        collective,
        nranks,
        chunk_factor=chunk_factor,
        columns=decoder.columns(),
        root=root,
        dep_ptr=decoder.dep_ptr,
        dep_idx=decoder.dep_idx,
        switches=decoder.switches,
        params=params,
    )
    for p, (part, declared) in enumerate(zip(program.participants, decoder.scratch, strict=True)):
        if part.scratch_chunks != declared:
            raise _fail(
                f"participants[{p}].scratch_chunks",
                f"declares {declared} but the steps use {part.scratch_chunks}; "
                "set it to the highest scratch chunk referenced plus one",
            )
    return program


def _frozen(value: object) -> object:
    """JSON lists back to tuples, so params stay immutable and compare equal after a round trip."""
    if isinstance(value, list):
        return tuple(_frozen(v) for v in value)
    return value


def _ref(value: object, path: str, wanted: bool, op: str) -> tuple[int, int, int] | None:
    """A ``[buffer, index, count]`` reference as ``(Buffer, index, count)``, or ``None``."""
    if not wanted:
        if value is not None:
            raise _fail(path, f"a {op} step has no {path.rsplit('.', 1)[1]}: write null")
        return None
    if type(value) is list and len(value) == 3 and isinstance(value[0], str):
        buf, index, count = _BUFFER_IDS.get(value[0], -1), value[1], value[2]
        if (
            buf >= 0
            and type(index) is int
            and type(count) is int
            and 0 <= index <= _INT_MAX
            and 1 <= count <= _INT_MAX
        ):
            return buf, index, count
    ref = _list(value, path)
    if len(ref) != 3:
        raise _fail(path, f"expected [buffer, index, count], got {json.dumps(ref)}")
    if not isinstance(ref[0], str) or ref[0] not in _BUFFER_IDS:
        raise _fail(
            f"{path}[0]", f"unknown buffer {ref[0]!r}; expected one of {', '.join(_BUFFER_IDS)}"
        )
    return _BUFFER_IDS[ref[0]], _int(ref[1], f"{path}[1]"), _int(ref[2], f"{path}[2]", 1)


def _dep(value: object, path: str) -> tuple[int, int]:
    """A ``[channel, position]`` dependency."""
    dep = _list(value, path)
    if len(dep) != 2:
        raise _fail(path, f"expected [channel, position], got {json.dumps(dep)}")
    return _int(dep[0], f"{path}[0]"), _int(dep[1], f"{path}[1]")


class _StepDecoder:
    """Reads the participants list into step columns and CSR dependencies."""

    def __init__(self, participants: list, nranks: int) -> None:
        if len(participants) < nranks:
            raise _fail(
                "participants",
                f"lists {len(participants)} participant(s), need at least nranks = {nranks}",
            )
        self.rows: list[tuple[int, ...]] = []
        self.deps: list[list[tuple[int, int]]] = []
        self.paths: list[str] = []
        self.scratch: list[int] = []
        self.starts: dict[tuple[int, int], tuple[int, int]] = {}
        for p, entry in enumerate(participants):
            path = f"participants[{p}]"
            entry = _object(entry, path, ("kind", "scratch_chunks", "channels"))
            kind = _KINDS.get(entry["kind"]) if isinstance(entry["kind"], str) else None
            want = ParticipantKind.RANK if p < nranks else ParticipantKind.SWITCH
            if kind is not want:
                raise _fail(
                    f"{path}.kind",
                    f"expected {want.name.lower()!r} (ranks come first, "
                    f"then switches), got {entry['kind']!r}",
                )
            self.scratch.append(_int(entry["scratch_chunks"], f"{path}.scratch_chunks"))
            self._channels(p, _list(entry["channels"], f"{path}.channels"), f"{path}.channels")
        self.switches = len(participants) - nranks
        self._resolve_deps()

    def _channels(self, p: int, channels: list, path: str) -> None:
        entries = []
        for c, channel in enumerate(channels):
            channel = _object(channel, f"{path}[{c}]", ("id", "steps"))
            cid = _int(channel["id"], f"{path}[{c}].id")
            steps = _list(channel["steps"], f"{path}[{c}].steps")
            if not steps:
                raise _fail(f"{path}[{c}].steps", "a channel needs at least one step")
            entries.append((cid, c, steps))
        entries.sort(key=lambda e: e[0])
        for (cid, _, _), (next_id, c, _) in zip(entries, entries[1:], strict=False):
            if cid == next_id:
                raise _fail(f"{path}[{c}].id", f"channel id {cid} appears twice")
        for cid, c, steps in entries:
            self.starts[(p, cid)] = (len(self.rows), len(steps))
            for s, step in enumerate(steps):
                self._step(p, cid, step, f"{path}[{c}].steps[{s}]")

    def _step(self, p: int, cid: int, step: object, path: str) -> None:
        if type(step) is not dict or step.keys() != _STEP_KEYS:
            _object(step, path, _STEP_FIELDS)
        name = step["op"]
        spec = _OP_SPECS.get(name) if isinstance(name, str) else None
        if spec is None:
            raise _fail(f"{path}.op", f"unknown op {name!r}; expected one of {', '.join(_OPS)}")
        op, communicates, reads_src, writes_dst = spec
        peer = step["peer"]
        if communicates:
            peer = _int(peer, f"{path}.peer")
        elif peer is not None:
            raise _fail(f"{path}.peer", f"a {name} step is local: write null")
        src = _ref(step["src"], f"{path}.src", reads_src, name)
        dst = _ref(step["dst"], f"{path}.dst", writes_dst, name)
        if src and dst and src[2] != dst[2]:
            raise _fail(f"{path}.dst", f"moves {dst[2]} chunk(s) but src has {src[2]}")
        src_buf, src_off, count = src or (-1, -1, 0)
        dst_buf, dst_off, count = dst or (-1, -1, count)
        self.rows.append(
            (p, cid, op, -1 if peer is None else peer, src_buf, src_off, dst_buf, dst_off, count)
        )
        deps = step["deps"]
        if type(deps) is not list or deps:
            deps = [
                _dep(dep, f"{path}.deps[{d}]") for d, dep in enumerate(_list(deps, f"{path}.deps"))
            ]
        self.deps.append(deps)
        self.paths.append(path)

    def _resolve_deps(self) -> None:
        flat: list[int] = []
        ptr = [0]
        for i, deps in enumerate(self.deps):
            p = self.rows[i][0]
            for d, (chan, pos) in enumerate(deps):
                start, length = self.starts.get((p, chan), (0, 0))
                if pos >= length:
                    raise _fail(
                        f"{self.paths[i]}.deps[{d}]",
                        f"participant {p} has no step {pos} on channel {chan}",
                    )
                flat.append(start + pos)
            ptr.append(len(flat))
        self.dep_ptr = np.array(ptr, dtype=np.int64)
        self.dep_idx = np.array(flat, dtype=np.int64)

    def columns(self) -> dict[str, np.ndarray]:
        """Step columns in program order."""
        names = ("part", "chan", "op", "peer", "src_buf", "src_off", "dst_buf", "dst_off", "count")
        rows = np.array(self.rows, dtype=np.int64).reshape(-1, len(names))
        return {k: rows[:, j] for j, k in enumerate(names)}
