"""Export of a program as MSCCL XML (``<algo>`` / ``<gpu>`` / ``<tb>`` / ``<step>``).

MSCCL runs each threadblock (``tb``) as a sequence of steps with at most one send peer and one
receive peer, on one channel, and each connection ``(peer, channel)`` belongs to one
threadblock per direction. A commflow channel may talk to several peers, so each channel ``c``
of a rank is split into threadblocks: one per send peer and receive peer, except
that a send peer and a receive peer whose steps follow each other share one (``send=q
recv=q'``), so a ring's channel stays one threadblock. A local step (copy, reduce) joins the
threadblock of the step before it in its channel; local steps that open a channel join the
threadblock of its first send or receive, and a channel without any gets a local threadblock
(``send=-1 recv=-1``). Threadblock ids follow MSCCL's order: by send peer, receive peer,
channel. Channels are numbered per connection (the ``k``-th commflow channel from one rank to
another is channel ``k`` at both ends), so a program with thousands of commflow channels
(one per tree share, or one per edge) fits MSCCL's 32 when no pair of ranks uses more; a
threadblock that sends and receives on channels numbered apart keeps the commflow numbers.

Order is kept with MSCCL dependencies: a step depends on the previous step of its commflow
channel when that step lives in another threadblock, and on each explicit dependency; a
dependency already implied by the threadblock's earlier waits is dropped. MSCCL lets a step name
one dependency (``depid`` = threadblock, ``deps`` = step index); extra ones go into ``nop``
steps placed just before it, as msccl-tools does, and every step waited on gets ``hasdep=1``.

Step types: send ``s``, receive ``r``, receive-reduce ``rrc`` (``dst = received (op) src``, with
``src`` the local operand), copy ``cpy``, local reduce ``re`` (``dst = dst (op) src``). As in
msccl-tools, a send names the receiver's destination as ``dstbuf``/``dstoff`` and a receive the
sender's source as ``srcbuf``/``srcoff``.

Two runtimes read this format and differ in collective names: ``runtime="msccl"`` (MSCCL on
NCCL 2.12, ``MSCCL_XML_FILES``) calls reduce-scatter ``reduce_scatter`` and has no gather or
scatter; ``runtime="rccl"`` (RCCL and msccl-executor-nccl, ``MSCCL_ALGO_DIR``) calls it
``reducescatter`` and accepts ``gather`` and ``scatter``. Both get ``minBytes``/``maxBytes``
(any size) and ``inplace="0" outofplace="1"``: commflow programs are out of place.
``nchunksperloop`` counts the chunks in the elements the runtime divides among them
(``count`` times its size multiplier): the larger of a rank's input and output, or one block
(``chunk_factor`` chunks) for gather and scatter, whose ``count`` is one rank's block.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal
from xml.sax.saxutils import quoteattr

from commflow.collectives import Collective
from commflow.errors import ProgramError
from commflow.ir.matching import match_transfers
from commflow.ir.program import Program
from commflow.ir.step import Buffer, Op, ParticipantKind

Runtime = Literal["msccl", "rccl"]

PROTOCOLS = ("Simple", "LL", "LL128")
"""NCCL protocols an MSCCL algorithm may name."""

_COLL = {
    "msccl": {
        Collective.ALLREDUCE: "allreduce",
        Collective.ALLGATHER: "allgather",
        Collective.REDUCESCATTER: "reduce_scatter",
        Collective.ALLTOALL: "alltoall",
        Collective.BROADCAST: "broadcast",
        Collective.REDUCE: "reduce",
    },
    "rccl": {
        Collective.ALLREDUCE: "allreduce",
        Collective.ALLGATHER: "allgather",
        Collective.REDUCESCATTER: "reducescatter",
        Collective.ALLTOALL: "alltoall",
        Collective.BROADCAST: "broadcast",
        Collective.REDUCE: "reduce",
        Collective.GATHER: "gather",
        Collective.SCATTER: "scatter",
    },
}
_TYPE = {Op.SEND: "s", Op.RECV: "r", Op.RECV_REDUCE: "rrc", Op.COPY: "cpy", Op.REDUCE: "re"}
_BUF = {Buffer.INPUT: "i", Buffer.OUTPUT: "o", Buffer.SCRATCH: "s"}
_MAX_BYTES = str(2**63 - 1)


@dataclass
class _Threadblock:
    """One MSCCL threadblock under construction: its steps and, per step, what it waits on."""

    chan: int
    send: int
    recv: int
    steps: list[int] = field(default_factory=list)
    waits: list[list[tuple[int, int]]] = field(default_factory=list)
    index: list[int] = field(default_factory=list)


def to_msccl_xml(program: Program, *, runtime: Runtime = "msccl", proto: str = "Simple") -> str:
    """The program as MSCCL XML text for ``runtime`` (see the module docstring).

    ``proto`` is the NCCL protocol (``Simple``, ``LL``, ``LL128``). Raises ``ProgramError`` for
    programs with switch participants (MSCCL has no in-network participants), collectives the
    runtime does not know, or sends and receives that do not pair up.
    """
    if runtime not in _COLL:
        raise ProgramError(f"unknown MSCCL runtime {runtime!r}; use 'msccl' or 'rccl'")
    if proto not in PROTOCOLS:
        raise ProgramError(f"unknown protocol {proto!r}; use one of {', '.join(PROTOCOLS)}")
    if any(p.kind is not ParticipantKind.RANK for p in program.participants):
        raise ProgramError(
            f"{program.name}: MSCCL has no in-network participants; export a "
            "program whose participants are all ranks"
        )
    coll = _COLL[runtime].get(program.collective)
    if coll is None:
        other = "rccl" if runtime == "msccl" else "msccl"
        raise ProgramError(
            f"{program.name}: the {runtime} runtime has no "
            f"{program.collective.value} collective; try runtime={other!r}"
        )
    writer = _Writer(program)
    gpus = writer.gpus()
    lines = [
        f'<algo name={quoteattr(program.name)} proto="{proto}" '
        f'nchannels="{writer.nchannels}" '
        f'nchunksperloop="{_chunks_per_loop(program)}" ngpus="{program.nranks}" '
        f'coll="{coll}" inplace="0" outofplace="1" minBytes="0" maxBytes="{_MAX_BYTES}">',
        *gpus,
        "</algo>\n",
    ]
    return "\n".join(lines)


def _chunks_per_loop(program: Program) -> int:
    """Chunks in the ``count x sizeMultiplier`` elements the runtime splits: a rank's whole
    input or output, except for gather and scatter, whose count is one rank's block."""
    if program.collective in (Collective.GATHER, Collective.SCATTER):
        return program.chunk_factor
    return max(program.expected_buffers())


class _Writer:
    """Splits every rank's channels into threadblocks and writes their steps."""

    def __init__(self, program: Program) -> None:
        self.program = program
        t = program.table
        self.part, self.chan = t.part.tolist(), t.chan.tolist()
        self.op, self.peer = t.op.tolist(), t.peer.tolist()
        self.src_buf, self.src_off = t.src_buf.tolist(), t.src_off.tolist()
        self.dst_buf, self.dst_off = t.dst_buf.tolist(), t.dst_off.tolist()
        self.count, self.position = t.count.tolist(), t.position.tolist()
        self.dep_ptr, self.dep_idx = t.dep_ptr.tolist(), t.dep_idx.tolist()
        self.sender = match_transfers(program).tolist()
        self.receiver = [-1] * len(t)
        for r, s in enumerate(self.sender):
            if s >= 0:
                self.receiver[s] = r
        self.tb_of = [0] * len(t)
        self.slot = [0] * len(t)
        self.nchannels = 1

    def gpus(self) -> list[str]:
        """The ``<gpu>`` elements, one line per element; sets :attr:`nchannels`."""
        starts = self.program.table.channel_starts.tolist()
        first_group = 0
        ranks = []
        for rank in range(len(self.program.participants)):
            groups = []
            while first_group < len(starts) - 1 and self.part[starts[first_group]] == rank:
                groups.append(range(starts[first_group], starts[first_group + 1]))
                first_group += 1
            ranks.append(self._threadblocks(groups))
        self._number_channels(ranks)
        lines: list[str] = []
        for rank, (part, tbs) in enumerate(zip(self.program.participants, ranks, strict=True)):
            lines.append(
                f'  <gpu id="{rank}" i_chunks="{part.input_chunks}" '
                f'o_chunks="{part.output_chunks}" s_chunks="{part.scratch_chunks}">'
            )
            self._emit(lines, tbs)
            lines.append("  </gpu>")
        return lines

    def _number_channels(self, ranks: list[list[_Threadblock]]) -> None:
        """Renumber the threadblocks' channels connection by connection: the ``k``-th commflow
        channel a rank sends to a peer on becomes channel ``k`` at both ends (MSCCL has 32),
        local threadblocks channel 0. Kept as they are when a threadblock that both sends and
        receives would get two numbers; sets :attr:`nchannels`."""
        used: dict[tuple[int, int], set[int]] = {}
        for i, op in enumerate(self.op):
            if op == Op.SEND:
                used.setdefault((self.part[i], self.peer[i]), set()).add(self.chan[i])
        index = {pair: {c: k for k, c in enumerate(sorted(cs))} for pair, cs in used.items()}
        numbers = []
        for rank, tbs in enumerate(ranks):
            for tb in tbs:
                ends = set()
                if tb.send >= 0:
                    ends.add(index[(rank, tb.send)][tb.chan])
                if tb.recv >= 0:
                    ends.add(index[(tb.recv, rank)][tb.chan])
                numbers.append(ends or {0})
        if all(len(ends) == 1 for ends in numbers):
            flat = iter(numbers)
            for tbs in ranks:
                for tb in tbs:
                    tb.chan = next(iter(next(flat)))
        self.nchannels = max((tb.chan for tbs in ranks for tb in tbs), default=0) + 1

    def _threadblocks(self, groups: list[range]) -> list[_Threadblock]:
        """Assign each step of one rank to a threadblock, then number them MSCCL's way."""
        by_key: dict[tuple[int, int, int], _Threadblock] = {}
        for steps in groups:
            owner = self._pair_peers(steps)
            chan = self.chan[steps[0]]
            first = next((i for i in steps if Op(self.op[i]).communicates), None)
            key = (
                (-1, -1) if first is None else owner[(self.op[first] == Op.SEND, self.peer[first])]
            )
            for i in steps:
                op = Op(self.op[i])
                if op.communicates:
                    key = owner[(op is Op.SEND, self.peer[i])]
                tb = by_key.setdefault((*key, chan), _Threadblock(chan, *key))
                self.slot[i] = len(tb.steps)
                tb.steps.append(i)
        tbs = [by_key[k] for k in sorted(by_key)]
        for n, tb in enumerate(tbs):
            for i in tb.steps:
                self.tb_of[i] = n
        for n, tb in enumerate(tbs):
            self._waits(n, tb)
        return tbs

    def _pair_peers(self, steps: range) -> dict[tuple[bool, int], tuple[int, int]]:
        """``(sends, peer) -> (send peer, recv peer)`` of its threadblock, for one channel.

        A send peer and a receive peer share a threadblock when their steps follow each other
        most often (greedy maximum-weight matching), which keeps a ring's channel in one
        threadblock; every other peer gets a threadblock of its own.
        """
        roles = [
            (Op(self.op[i]) is Op.SEND, self.peer[i]) for i in steps if Op(self.op[i]).communicates
        ]
        weight: dict[tuple[int, int], int] = {}
        for a, b in zip(roles, roles[1:], strict=False):
            if a[0] != b[0]:
                pair = (a[1], b[1]) if a[0] else (b[1], a[1])
                weight[pair] = weight.get(pair, 0) + 1
        owner: dict[tuple[bool, int], tuple[int, int]] = {}
        for (send, recv), _ in sorted(weight.items(), key=lambda e: (-e[1], e[0])):
            if (True, send) not in owner and (False, recv) not in owner:
                owner[(True, send)] = owner[(False, recv)] = (send, recv)
        for sends, peer in roles:
            owner.setdefault((sends, peer), (peer, -1) if sends else (-1, peer))
        return owner

    def _waits(self, n: int, tb: _Threadblock) -> None:
        """What each step of ``tb`` waits on, as ``(threadblock, slot)``, minus implied waits."""
        waited: dict[int, int] = {}
        for i in tb.steps:
            targets = list(self.dep_idx[self.dep_ptr[i] : self.dep_ptr[i + 1]])
            if self.position[i] > 0:
                targets.append(i - 1)
            need: dict[int, int] = {}
            for d in targets:
                other = self.tb_of[d]
                if other == n:
                    if self.slot[d] >= self.slot[i]:
                        part, chan, pos = self.program.where(i)
                        raise ProgramError(
                            f"{self.program.name}: participant {part}, channel {chan}, step "
                            f"{pos} depends on a later step of its own channel (a deadlock); "
                            "run verify on the program"
                        )
                    continue
                if self.slot[d] > max(need.get(other, -1), waited.get(other, -1)):
                    need[other] = self.slot[d]
            waited.update(need)
            tb.waits.append(sorted(need.items()))

    def _emit(self, lines: list[str], tbs: list[_Threadblock]) -> None:
        """Number each step (after the ``nop`` steps that carry its extra waits), then write
        the ``<tb>`` elements of one rank."""
        for tb in tbs:
            s = 0
            for waits in tb.waits:
                s += max(len(waits) - 1, 0)
                tb.index.append(s)
                s += 1
        hasdep = {wait for tb in tbs for waits in tb.waits for wait in waits}
        for n, tb in enumerate(tbs):
            lines.append(f'    <tb id="{n}" send="{tb.send}" recv="{tb.recv}" chan="{tb.chan}">')
            for slot, (i, waits) in enumerate(zip(tb.steps, tb.waits, strict=True)):
                s = tb.index[slot]
                deps = [(o, tbs[o].index[k]) for o, k in waits] or [(-1, -1)]
                for nop, (depid, dep_s) in enumerate(deps[1:], start=s - len(deps) + 1):
                    lines.append(
                        f'      <step s="{nop}" type="nop" srcbuf="i" srcoff="-1" '
                        f'dstbuf="o" dstoff="-1" cnt="0" depid="{depid}" '
                        f'deps="{dep_s}" hasdep="0"/>'
                    )
                op = self.op[i]
                src = self.sender[i] if op == Op.RECV else i
                dst = self.receiver[i] if op == Op.SEND else i
                lines.append(
                    f'      <step s="{s}" type="{_TYPE[op]}" '
                    f"{self._ref('src', self.src_buf[src], self.src_off[src], 'i')} "
                    f"{self._ref('dst', self.dst_buf[dst], self.dst_off[dst], 'o')} "
                    f'cnt="{self.count[i]}" depid="{deps[0][0]}" deps="{deps[0][1]}" '
                    f'hasdep="{int((n, slot) in hasdep)}"/>'
                )
            lines.append("    </tb>")

    @staticmethod
    def _ref(side: str, buf: int, off: int, absent: str) -> str:
        """``srcbuf``/``srcoff`` (or ``dst...``) attributes; MSCCL's placeholder when unused.

        As msccl-tools writes them, a send names the receiver's destination and a receive the
        sender's source.
        """
        if buf < 0:
            return f'{side}buf="{absent}" {side}off="-1"'
        return f'{side}buf="{_BUF[buf]}" {side}off="{off}"'
