"""Import of MSCCL XML (msccl-tools' output, RCCL's shipped algorithms) as a program.

Every ``<tb>`` of a ``<gpu>`` becomes one commflow channel of that rank, its steps in order:
``s`` a send, ``r`` a receive, ``rrc`` a receive-reduce, ``cpy`` a copy, ``re`` a local
reduce; the fused types become a receive and the send of what it wrote: ``rcs`` (receive,
send), ``rrcs`` and ``rrs`` (receive-reduce, send; ``rrs`` keeps no local copy in MSCCL, here
the reduced chunks are written to the step's ``dst`` on the way). As msccl-tools writes them, a
send names the receiver's destination and a receive the sender's source: only the local side
is read. ``nop`` steps carry dependencies only: they pass to the next step of their
threadblock (a dependency on a ``nop`` is one on the step before it and on what it waits for).

MSCCL pairs sends and receives per connection ``(peer, chan)``, which one threadblock owns per
direction; commflow pairs them per ``(src, dst, channel)`` with one channel id at both ends.
So each connection becomes a commflow channel of its own at both ends (the sends of a
threadblock on one channel, its receives on another, its local steps with the step before
them), and a threadblock's order is kept by a dependency of each step on the one before it
wherever the two landed on different channels. A connection used by two threadblocks of a
rank (MSCCL refuses that) is refused.

The chunk factor follows from the collective, ``ngpus`` and each rank's ``i_chunks`` and
``o_chunks``; rooted collectives are taken for root 0 (the XML has no root). A program that
runs only in place (``outofplace="0"``) becomes the out-of-place program that first copies the
input into the output buffer (allreduce, broadcast, reduce, alltoall: the whole buffer;
allgather: the rank's block) and then runs on the output buffer; in-place reduce-scatter,
gather and scatter are refused.
"""

from __future__ import annotations

import re
import xml.etree.ElementTree as ET

import numpy as np

from commflow.collectives import Collective, buffer_shape
from commflow.errors import ProgramError
from commflow.ir.build import make_program
from commflow.ir.program import Program
from commflow.ir.step import Buffer, Op

_COLLECTIVES = {"allreduce": Collective.ALLREDUCE, "allgather": Collective.ALLGATHER,
                "reduce_scatter": Collective.REDUCESCATTER,
                "reducescatter": Collective.REDUCESCATTER, "alltoall": Collective.ALLTOALL,
                "broadcast": Collective.BROADCAST, "reduce": Collective.REDUCE,
                "gather": Collective.GATHER, "scatter": Collective.SCATTER}
_BUFFERS = {"i": Buffer.INPUT, "o": Buffer.OUTPUT, "s": Buffer.SCRATCH}
_KINDS = ("s", "r", "rcs", "rrc", "rrs", "rrcs", "cpy", "re", "nop")
_MAX_BYTES = 64 << 20
"""Largest XML document read (bytes)."""
_SAME_SHAPE = (Collective.ALLREDUCE, Collective.BROADCAST, Collective.REDUCE,
               Collective.ALLTOALL)
"""Collectives whose input and output have one shape: an in-place program of theirs is the
out-of-place one on the output buffer after copying the input there."""


def from_msccl_xml(text: str, *, name: str | None = None) -> Program:
    """The program an MSCCL XML document describes (see the module docstring).

    Raises ``ProgramError`` naming the element and attribute of the first problem: not XML,
    a ``DOCTYPE`` (entities are refused), a missing or non-integer attribute, an unknown
    collective, buffer or step type, an offset beyond its buffer, a dependency on a step that
    does not exist, or connections commflow cannot pair.
    """
    if len(text) > _MAX_BYTES:
        raise ProgramError(f"MSCCL XML of {len(text)} bytes is larger than {_MAX_BYTES}")
    if re.search(r"<!(DOCTYPE|ENTITY)", text):
        raise ProgramError("MSCCL XML with a DOCTYPE or entities is refused")
    try:
        algo = ET.fromstring(text)
    except ET.ParseError as error:
        raise ProgramError(f"not MSCCL XML: {error}") from None
    if algo.tag != "algo":
        raise ProgramError(f"MSCCL XML: the root element is <{algo.tag}>, expected <algo>")
    coll_name = _attr(algo, "coll", "<algo>", str)
    if coll_name not in _COLLECTIVES:
        raise ProgramError(f"<algo> coll={coll_name!r}: unknown collective; known: "
                           f"{', '.join(_COLLECTIVES)}")
    collective = _COLLECTIVES[coll_name]
    in_place = algo.get("outofplace", "1") == "0"
    if in_place and collective not in (*_SAME_SHAPE, Collective.ALLGATHER):
        raise ProgramError(f"<algo> outofplace=\"0\": an in-place-only {collective.value}; "
                           "commflow imports in-place programs of allreduce, allgather, "
                           "broadcast, reduce and alltoall only")
    gpus = algo.findall("gpu")
    nranks = _attr(algo, "ngpus", "<algo>", int)
    if nranks < 1 or len(gpus) != nranks or sorted(_attr(g, "id", "<gpu>", int) for g in gpus) \
            != list(range(nranks)):
        raise ProgramError(f"<algo> ngpus={nranks}: needs <gpu> elements with ids 0..{nranks - 1}")
    gpus.sort(key=lambda g: int(g.get("id")))
    chunk_factor = _chunk_factor(collective, nranks, gpus, in_place)
    shape = buffer_shape(collective, nranks, chunk_factor)
    reader = _Reader(nranks, in_place and shape.input,
                     chunk_factor if collective is Collective.ALLGATHER else 0)
    for rank, gpu in enumerate(gpus):
        reader.read_gpu(rank, gpu)
    return reader.program(name or algo.get("name") or "imported", collective, chunk_factor)


def _attr(element: ET.Element, key: str, where: str, kind: type) -> object:
    value = element.get(key)
    if value is None:
        raise ProgramError(f"{where}: missing attribute {key!r}")
    if kind is int:
        try:
            number = int(value)
        except ValueError:
            raise ProgramError(f"{where}: {key}={value!r} is not an integer") from None
        if abs(number) >= 2**31:
            raise ProgramError(f"{where}: {key}={value} is out of range")
        return number
    return value


def _chunk_factor(collective: Collective, nranks: int, gpus: list[ET.Element],
                  in_place: bool) -> int:
    sizes = {(_attr(g, "i_chunks", f"<gpu id={i}>", int), _attr(g, "o_chunks", f"<gpu id={i}>",
                                                               int)) for i, g in enumerate(gpus)}
    if len(sizes) != 1:
        raise ProgramError(f"<gpu> elements differ in i_chunks/o_chunks: {sorted(sizes)}")
    (inp, out), = sizes
    if in_place and collective is Collective.ALLGATHER:  # the input is the rank's block
        inp = out // nranks
    elif in_place:  # one buffer
        inp = out = max(inp, out)
    for cf in {inp, out, inp // nranks if nranks else 0, out // nranks if nranks else 0}:
        if cf >= 1:
            shape = buffer_shape(collective, nranks, cf)
            if (shape.input, shape.output) == (inp, out):
                return cf
    raise ProgramError(f"<gpu> i_chunks={inp} o_chunks={out} fit no chunk factor of "
                       f"{collective.value} on {nranks} ranks")


class _Reader:
    """Threadblocks into commflow steps, then channels from the connections."""

    def __init__(self, nranks: int, in_place: int, block: int) -> None:
        """``in_place``: chunks of a rank's input an in-place program finds in its output
        buffer (0 for an out-of-place program), at chunk ``rank * block`` of it."""
        self.nranks = nranks
        self.in_place = in_place > 0
        self.block = block
        self.rows: list[tuple] = []  # (rank, tb, op, peer, src_buf, src_off, dst_buf, dst_off, cnt)
        self.deps: list[list[tuple[int, int]]] = []  # per row: (tb, xml step) waited on
        self.last_row: dict[tuple[int, int, int], int] = {}  # (rank, tb, s) -> its last row
        self.before: dict[tuple[int, int, int], int] = {}  # (rank, tb, s) -> row before it
        self.nop_waits: dict[tuple[int, int, int], list[tuple[int, int]]] = {}
        self.tbs: dict[tuple[int, int], tuple[int, int, int]] = {}  # -> (send, recv, chan)
        if in_place:  # the input copied into the output buffer first, on a channel of its own
            for rank in range(nranks):
                self.tbs[(rank, -1)] = (-1, -1, 0)
                self.rows.append((rank, -1, Op.COPY, -1, int(Buffer.INPUT), 0,
                                  int(Buffer.OUTPUT), rank * block, in_place))
                self.deps.append([])

    def read_gpu(self, rank: int, gpu: ET.Element) -> None:
        for tb in gpu.findall("tb"):
            where = f"<gpu id={rank}> <tb id={tb.get('id')}>"
            tb_id = _attr(tb, "id", where, int)
            ends = tuple(_attr(tb, key, where, int) for key in ("send", "recv", "chan"))
            if (rank, tb_id) in self.tbs:
                raise ProgramError(f"{where}: threadblock id repeated")
            for peer in ends[:2]:
                if not -1 <= peer < self.nranks or peer == rank:
                    raise ProgramError(f"{where}: peer {peer} is not another rank")
            self.tbs[(rank, tb_id)] = ends
            pending: list[tuple[int, int]] = []
            previous = -1
            for position, step in enumerate(tb.findall("step")):
                if step.get("s") != str(position):
                    raise ProgramError(f"{where}: step {position} has s={step.get('s')!r}; "
                                       "steps must be numbered 0, 1, 2, ...")
                previous, pending = self._read_step(rank, tb_id, ends, step, where, previous,
                                                    pending)

    def _read_step(self, rank, tb_id, ends, step, where, previous, pending):
        s = _attr(step, "s", where + " <step>", int)
        here = f"{where} <step s={s}>"
        kind = _attr(step, "type", here, str)
        if kind not in _KINDS:
            raise ProgramError(f"{here}: unknown type {kind!r}; known: {', '.join(_KINDS)}")
        depid, dep_s = (_attr(step, k, here, int) for k in ("depid", "deps"))
        waits = pending + ([(depid, dep_s)] if depid >= 0 else [])
        self.before[(rank, tb_id, s)] = previous
        if kind == "nop":
            self.nop_waits[(rank, tb_id, s)] = waits
            return previous, waits
        cnt = _attr(step, "cnt", here, int)
        if cnt < 1:
            raise ProgramError(f"{here}: cnt={cnt} must be >= 1")
        src = self._ref(step, "src", here, rank) \
            if kind in ("s", "rrc", "rrs", "rrcs", "cpy", "re") else (-1, -1)
        dst = self._ref(step, "dst", here, rank) if kind != "s" else (-1, -1)
        send, recv = ends[0], ends[1]
        if kind in ("s", "rcs", "rrs", "rrcs") and send < 0:
            raise ProgramError(f"{here}: {kind} in a threadblock without a send peer")
        if kind in ("r", "rcs", "rrc", "rrs", "rrcs") and recv < 0:
            raise ProgramError(f"{here}: {kind} in a threadblock without a receive peer")
        ops = {"s": [(Op.SEND, send, src, (-1, -1))], "r": [(Op.RECV, recv, (-1, -1), dst)],
               "rcs": [(Op.RECV, recv, (-1, -1), dst), (Op.SEND, send, dst, (-1, -1))],
               "rrc": [(Op.RECV_REDUCE, recv, src, dst)],
               "rrs": [(Op.RECV_REDUCE, recv, src, dst), (Op.SEND, send, dst, (-1, -1))],
               "rrcs": [(Op.RECV_REDUCE, recv, src, dst), (Op.SEND, send, dst, (-1, -1))],
               "cpy": [(Op.COPY, -1, src, dst)], "re": [(Op.REDUCE, -1, src, dst)]}[kind]
        for k, (op, peer, a, b) in enumerate(ops):
            self.rows.append((rank, tb_id, op, peer, *a, *b, cnt))
            self.deps.append(waits if k == 0 else [])
        self.last_row[(rank, tb_id, s)] = len(self.rows) - 1
        return len(self.rows) - 1, []

    def _ref(self, step: ET.Element, side: str, where: str, rank: int) -> tuple[int, int]:
        buf = _attr(step, f"{side}buf", where, str)
        if buf not in _BUFFERS:
            raise ProgramError(f"{where}: {side}buf={buf!r}: use i, o or s")
        off = _attr(step, f"{side}off", where, int)
        if off < 0:
            raise ProgramError(f"{where}: {side}off={off} must be >= 0")
        if self.in_place and buf == "i":  # the input, where the output buffer holds it
            return int(Buffer.OUTPUT), off + rank * self.block
        return int(_BUFFERS[buf]), off

    def _resolve(self, rank: int, tb: int, s: int, seen: int = 0) -> list[int]:
        """Rows a wait on XML step ``s`` of threadblock ``tb`` stands for."""
        key = (rank, tb, s)
        if key in self.last_row:
            return [self.last_row[key]]
        if key not in self.nop_waits or seen > 10_000:
            raise ProgramError(f"<gpu id={rank}>: a dependency names step {s} of threadblock "
                               f"{tb}, which does not exist")
        rows = [self.before[key]] if self.before[key] >= 0 else []
        for depid, dep_s in self.nop_waits[key]:
            rows += self._resolve(rank, depid, dep_s, seen + 1)
        return rows

    def _channel_keys(self) -> list[tuple]:
        """Per row the commflow channel it goes to: the connection it sends or receives on
        (the same key at both ends), or for a local step the channel of the step before it in
        its threadblock (a channel of the threadblock's own when it comes first)."""
        keys: list[tuple] = []
        owner: dict[tuple, tuple[int, int]] = {}
        for i, (rank, tb, op, peer, *_rest) in enumerate(self.rows):
            chan = self.tbs[(rank, tb)][2]
            if op == Op.SEND:
                key = ("conn", rank, peer, chan)
            elif op.receives:
                key = ("conn", peer, rank, chan)
            elif i > 0 and self.rows[i - 1][:2] == (rank, tb):
                key = keys[-1]
            else:
                key = ("local", rank, tb)
            if op.communicates and owner.setdefault((rank, *key), (rank, tb)) != (rank, tb):
                raise ProgramError(
                    f"<gpu id={rank}>: threadblocks {owner[(rank, *key)][1]} and {tb} both "
                    f"{'send to' if op == Op.SEND else 'receive from'} rank {peer} on channel "
                    f"{chan}; MSCCL gives a connection to one threadblock")
            keys.append(key)
        return keys

    def program(self, name: str, collective: Collective, chunk_factor: int) -> Program:
        keys = self._channel_keys()
        ids: dict[tuple, int] = {}
        chans = [ids.setdefault(key, len(ids)) for key in keys]
        order = sorted(range(len(self.rows)), key=lambda i: (self.rows[i][0], chans[i], i))
        index = np.empty(len(order), dtype=np.int64)
        index[order] = np.arange(len(order))
        cols = list(zip(*self.rows, strict=True)) if self.rows else [()] * 9
        names = ("part", "tb", "op", "peer", "src_buf", "src_off", "dst_buf", "dst_off", "count")
        columns = {k: np.asarray(v, dtype=np.int64)[order]
                   for k, v in zip(names, cols, strict=True) if k != "tb"}
        columns["chan"] = np.asarray(chans, dtype=np.int64)[order]
        dep_ptr, dep_idx = [0], []
        for i in order:
            rank, tb = self.rows[i][:2]
            rows = {row for depid, s in self.deps[i] for row in self._resolve(rank, depid, s)}
            if i > 0 and self.rows[i - 1][:2] == (rank, tb) and chans[i - 1] != chans[i]:
                rows.add(i - 1)  # the threadblock's order, across channels
            elif self.in_place and tb >= 0 and self.rows[i - 1][:2] != (rank, tb):
                rows.add(rank)  # a threadblock's first step waits for the input's copy
            targets = sorted(int(index[row]) for row in rows)
            dep_idx += targets
            dep_ptr.append(len(dep_idx))
        return make_program(name, collective, self.nranks, chunk_factor=chunk_factor,
                            columns=columns, root=0 if collective.rooted else None,
                            dep_ptr=np.asarray(dep_ptr),
                            dep_idx=np.asarray(dep_idx, dtype=np.int64),
                            params={"imported": "msccl"})
