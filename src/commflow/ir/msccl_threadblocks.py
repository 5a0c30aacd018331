"""The ``<gpu>``, ``<tb>`` and ``<step>`` elements of an MSCCL export
(:func:`commflow.ir.msccl.to_msccl_xml`): each rank's channels split into threadblocks, what
their steps wait on, fused steps, and the target's limits on them.

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
another is channel ``k`` at both ends; a channel that connects several pairs of ranks takes
the least number free on all of them), so a program with thousands of commflow channels (one
per tree share, or one per edge) fits MSCCL's 32 when no pair of ranks uses more.

Order is kept with MSCCL dependencies: a step depends on the previous step of its commflow
channel when that step lives in another threadblock, and on each explicit dependency; a
dependency already implied by the threadblock's earlier waits is dropped. MSCCL lets a step name
one dependency (``depid`` = threadblock, ``deps`` = step index); extra ones go into ``nop``
steps placed just before it, as msccl-tools does, and every step waited on gets ``hasdep=1``.

Step types: send ``s``, receive ``r``, receive-reduce ``rrc`` (``dst = received (op) src``, with
``src`` the local operand), copy ``cpy``, local reduce ``re`` (``dst = dst (op) src``). A send
that forwards exactly what the receive before it in its threadblock wrote, waits on nothing
else and follows a receive no other threadblock waits on, is fused with it into one
receive-copy-send ``rcs`` or receive-reduce-copy-send ``rrcs`` step, as msccl-tools emits (an
8-rank ring allreduce: 15 steps per threadblock instead of 28). As in msccl-tools, a send names
the receiver's destination as ``dstbuf``/``dstoff`` and a receive the sender's source as
``srcbuf``/``srcoff``; a fused step names the local chunks its kernel primitive reads and writes.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from commflow.errors import ProgramError
from commflow.ir.matching import match_transfers
from commflow.ir.program import Program
from commflow.ir.step import Buffer, Op
from commflow.ir.target import Target

_TYPE = {Op.SEND: "s", Op.RECV: "r", Op.RECV_REDUCE: "rrc", Op.COPY: "cpy", Op.REDUCE: "re"}
_FUSED = {Op.RECV: "rcs", Op.RECV_REDUCE: "rrcs"}
"""A receive followed by the send of what it wrote: receive-copy-send, receive-reduce-copy-send."""
_BUF = {Buffer.INPUT: "i", Buffer.OUTPUT: "o", Buffer.SCRATCH: "s"}
_ADVICE = ("lower the pipelining (fewer --chunks, --channels or synthesis --pieces) or split "
           "the program")


@dataclass
class _Threadblock:
    """One MSCCL threadblock under construction: its steps and, per step, what it waits on."""

    chan: int
    send: int
    recv: int
    steps: list[int] = field(default_factory=list)
    waits: list[list[tuple[int, int]]] = field(default_factory=list)
    index: list[int] = field(default_factory=list)
    fused: list[bool] = field(default_factory=list)


def forwards(program: Program) -> np.ndarray:
    """Per step: whether it is a send of exactly the chunks the receive just before it in its
    channel wrote, the pairs an export may fuse (``rcs``/``rrcs``) where nothing else waits
    between them (:class:`ThreadblockWriter`)."""
    t = program.table
    found = np.zeros(len(t), dtype=bool)
    i = np.arange(1, len(t))
    found[1:] = ((t.op[i] == Op.SEND) & (t.position[i] > 0)
                 & np.isin(t.op[i - 1], tuple(_FUSED))
                 & (t.src_buf[i] == t.dst_buf[i - 1]) & (t.src_off[i] == t.dst_off[i - 1])
                 & (t.count[i] == t.count[i - 1]))
    return found


class ThreadblockWriter:
    """Splits every rank's channels into threadblocks and writes their steps."""

    def __init__(self, program: Program, target: Target, *, fuse: bool) -> None:
        self.program = program
        self.target = target
        self.fuse = fuse
        self.fused_sends: list[int] = []
        """Global indices of the sends written fused with the receive before them."""
        t = program.table
        self.part, self.chan = t.part.tolist(), t.chan.tolist()
        self.op, self.peer = t.op.tolist(), t.peer.tolist()
        self.src_buf, self.src_off = t.src_buf.tolist(), t.src_off.tolist()
        self.dst_buf, self.dst_off = t.dst_buf.tolist(), t.dst_off.tolist()
        self.count, self.position = t.count.tolist(), t.position.tolist()
        self.talks = np.isin(t.op, (Op.SEND, Op.RECV, Op.RECV_REDUCE)).tolist()
        """Per step: whether it has a peer (sends and receives; local steps do not)."""
        self.forwards = forwards(program).tolist()
        self.dep_ptr, self.dep_idx = t.dep_ptr.tolist(), t.dep_idx.tolist()
        self.sender = match_transfers(program).tolist()
        self.receiver = [-1] * len(t)
        for r, s in enumerate(self.sender):
            if s >= 0:
                self.receiver[s] = r
        self.nodes = 1 + len(program.participants)
        """XML elements written so far (the ``<algo>`` and its ``<gpu>`` elements at first)."""
        self.rank_nodes = 0
        """Most ``<tb>`` and ``<step>`` elements of one rank."""
        self.tb_of = [0] * len(t)
        self.slot = [0] * len(t)
        self.nchannels = 1

    def gpus(self, *, text: bool = True) -> list[str]:
        """The ``<gpu>`` elements, one line per element (none without ``text``: the layout,
        :attr:`fused_sends` and the limits only); sets :attr:`nchannels`."""
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
            waited = self._lay_out(tbs)
            if text:
                lines.append(
                    f'  <gpu id="{rank}" i_chunks="{part.input_chunks}" '
                    f'o_chunks="{part.output_chunks}" s_chunks="{part.scratch_chunks}">'
                )
                self._emit(lines, tbs, waited)
                lines.append("  </gpu>")
        target = self.target
        if target.max_children is not None and len(self.program.participants) > \
                target.max_children:
            raise ProgramError(
                f"{self.program.name}: {len(self.program.participants)} ranks where "
                f"{target.name}'s parser takes {target.max_children} <gpu> elements")
        if target.max_channels is not None and self.nchannels > target.max_channels:
            raise ProgramError(
                f"{self.program.name}: needs {self.nchannels} channels where {target.name} "
                f"has {target.max_channels}; use fewer channels per pair of ranks")
        nodes = self.nodes
        if target.nodes_per_rank:
            nodes = 1 + len(self.program.participants) + self.rank_nodes
        if target.max_nodes is not None and nodes > target.max_nodes:
            scope = "for one rank" if target.nodes_per_rank else "per file"
            raise ProgramError(
                f"{self.program.name}: the XML would hold {nodes} elements {scope} where "
                f"{target.name}'s parser keeps {target.max_nodes}; lower the "
                "pipelining (fewer --chunks, --channels or synthesis --pieces)")
        return lines

    def _number_channels(self, ranks: list[list[_Threadblock]]) -> None:
        """Number the threadblocks' channels connection by connection: each commflow channel
        that carries messages gets the least number that no channel before it (in commflow
        order) sharing a pair of ranks with it took, so the ``k``-th channel a rank sends to
        a peer on is channel ``k`` at both ends when each connects one pair (MSCCL has 32),
        and a channel joined along a chain of ranks (:mod:`commflow.ir.pack`) keeps one
        number; local threadblocks get channel 0. Sets :attr:`nchannels`."""
        pairs: dict[int, set[tuple[int, int]]] = {}
        for i, op in enumerate(self.op):
            if op == Op.SEND:
                pairs.setdefault(self.chan[i], set()).add((self.part[i], self.peer[i]))
        taken: dict[tuple[int, int], set[int]] = {}
        number: dict[int, int] = {}
        for chan in sorted(pairs):
            used = set().union(*(taken.get(pair, set()) for pair in pairs[chan]))
            number[chan] = next(k for k in range(len(used) + 1) if k not in used)
            for pair in pairs[chan]:
                taken.setdefault(pair, set()).add(number[chan])
        for tbs in ranks:
            for tb in tbs:
                tb.chan = number[tb.chan] if tb.send >= 0 or tb.recv >= 0 else 0
        self.nchannels = max((tb.chan for tbs in ranks for tb in tbs), default=0) + 1

    def _threadblocks(self, groups: list[range]) -> list[_Threadblock]:
        """Assign each step of one rank to a threadblock, then number them MSCCL's way."""
        by_key: dict[tuple[int, int, int], _Threadblock] = {}
        op, peer, talks, slot = self.op, self.peer, self.talks, self.slot
        for steps in groups:
            owner = self._pair_peers(steps)
            chan = self.chan[steps[0]]
            first = next((i for i in steps if talks[i]), None)
            key = (-1, -1) if first is None else owner[(op[first] == Op.SEND, peer[first])]
            tb = by_key.setdefault((*key, chan), _Threadblock(chan, *key))
            for i in steps:
                if talks[i]:
                    key = owner[(op[i] == Op.SEND, peer[i])]
                    if (tb.send, tb.recv) != key:
                        tb = by_key.setdefault((*key, chan), _Threadblock(chan, *key))
                slot[i] = len(tb.steps)
                tb.steps.append(i)
        tbs = [by_key[k] for k in sorted(by_key)]
        self._check_count(tbs)
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
        op, peer, talks = self.op, self.peer, self.talks
        roles = [(op[i] == Op.SEND, peer[i]) for i in steps if talks[i]]
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
                if other == n:  # earlier in the threadblock: verify rules out later ones
                    continue
                if self.slot[d] > max(need.get(other, -1), waited.get(other, -1)):
                    need[other] = self.slot[d]
            waited.update(need)
            tb.waits.append(sorted(need.items()))

    def _fuse(self, tbs: list[_Threadblock], waited: set[tuple[int, int]]) -> None:
        """Mark each send that forwards what the receive just before it in its threadblock
        wrote (same chunks), waits on nothing else, and follows a receive nobody waits on:
        the pair becomes one ``rcs``/``rrcs`` step, as msccl-tools emits."""
        for n, tb in enumerate(tbs):
            tb.fused = [False] * len(tb.steps)
            for slot in range(1, len(tb.steps) if self.fuse else 0):
                i, prev = tb.steps[slot], tb.steps[slot - 1]
                tb.fused[slot] = (
                    self.forwards[i] and prev == i - 1
                    and not tb.fused[slot - 1] and not tb.waits[slot]
                    and (n, slot - 1) not in waited
                )
                if tb.fused[slot]:
                    self.fused_sends.append(i)

    def _lay_out(self, tbs: list[_Threadblock]) -> set[tuple[int, int]]:
        """Fuse receive-send pairs, number each step (after the ``nop`` steps that carry its
        extra waits) and check the target's limits, for one rank; the steps waited on."""
        waited = {wait for tb in tbs for waits in tb.waits for wait in waits}
        self._fuse(tbs, waited)
        for tb in tbs:
            s = 0
            for waits, fused in zip(tb.waits, tb.fused, strict=True):
                if fused:
                    tb.index.append(s - 1)
                    continue
                s += max(len(waits) - 1, 0)
                tb.index.append(s)
                s += 1
        self._check_limits(tbs)
        rank_nodes = len(tbs) + sum(tb.index[-1] + 1 for tb in tbs if tb.index)
        self.nodes += rank_nodes
        self.rank_nodes = max(self.rank_nodes, rank_nodes)
        return waited

    def _emit(self, lines: list[str], tbs: list[_Threadblock],
              waited: set[tuple[int, int]]) -> None:
        """Write the ``<tb>`` elements of one rank laid out by :meth:`_lay_out`."""
        for n, tb in enumerate(tbs):
            lines.append(f'    <tb id="{n}" send="{tb.send}" recv="{tb.recv}" chan="{tb.chan}">')
            for slot, (i, waits) in enumerate(zip(tb.steps, tb.waits, strict=True)):
                if tb.fused[slot]:
                    continue
                s = tb.index[slot]
                deps = [(o, tbs[o].index[k]) for o, k in waits] or [(-1, -1)]
                for nop, (depid, dep_s) in enumerate(deps[1:], start=s - len(deps) + 1):
                    lines.append(
                        f'      <step s="{nop}" type="nop" srcbuf="i" srcoff="-1" '
                        f'dstbuf="o" dstoff="-1" cnt="0" depid="{depid}" '
                        f'deps="{dep_s}" hasdep="0"/>'
                    )
                op = self.op[i]
                fused = slot + 1 < len(tb.steps) and tb.fused[slot + 1]
                kind = _FUSED[op] if fused else _TYPE[op]
                src = self.sender[i] if op == Op.RECV else i
                dst = self.receiver[i] if op == Op.SEND else i
                flagged = (n, slot) in waited or (fused and (n, slot + 1) in waited)
                lines.append(
                    f'      <step s="{s}" type="{kind}" '
                    f"{self._ref('src', self.src_buf[src], self.src_off[src], 'i')} "
                    f"{self._ref('dst', self.dst_buf[dst], self.dst_off[dst], 'o')} "
                    f'cnt="{self.count[i]}" depid="{deps[0][0]}" deps="{deps[0][1]}" '
                    f'hasdep="{int(flagged)}"/>'
                )
            lines.append("    </tb>")

    def _check_count(self, tbs: list[_Threadblock]) -> None:
        """Raise ``ProgramError`` when one rank has more threadblocks than the target runs
        (checked as soon as a rank's are known: the cheapest refusal)."""
        target = self.target
        cap = min(x for x in (target.max_threadblocks, target.max_children) if x is not None)
        if len(tbs) > cap:
            raise ProgramError(
                f"{self.program.name}: rank {self.part[tbs[0].steps[0]]} needs {len(tbs)} "
                f"threadblocks where {target.name} allows {cap}; {_ADVICE}")

    def _check_limits(self, tbs: list[_Threadblock]) -> None:
        """Raise ``ProgramError`` when one rank's threadblocks exceed the target's limits
        other than their number (:meth:`_check_count`)."""
        target, name = self.target, self.program.name
        rank = self.part[tbs[0].steps[0]] if tbs and tbs[0].steps else 0
        far = max((max(self.src_off[i], self.dst_off[i]) for tb in tbs for i in tb.steps),
                  default=0)
        if target.max_offset is not None and far > target.max_offset:
            raise ProgramError(
                f"{name}: rank {rank} addresses chunk {far} where {target.name} stores "
                f"offsets in 16 bits (at most {target.max_offset}); {_ADVICE}")
        cap = min(x for x in (target.max_steps_per_threadblock, target.max_children)
                  if x is not None)
        for n, tb in enumerate(tbs):
            steps = tb.index[-1] + 1 if tb.index else 0
            if steps > cap:
                raise ProgramError(
                    f"{name}: rank {rank}, threadblock {n} has {steps} steps where "
                    f"{target.name} allows {cap} per threadblock; {_ADVICE}")
            deepest = max((o for waits in tb.waits for o, _ in waits), default=-1)
            if target.max_depid is not None and deepest > target.max_depid:
                raise ProgramError(
                    f"{name}: rank {rank}, threadblock {n} depends on threadblock {deepest}, "
                    f"beyond {target.name}'s 8-bit depid (at most {target.max_depid}); "
                    f"{_ADVICE}")
            big = max((self.count[i] for i in tb.steps), default=0)
            if target.max_count is not None and big > target.max_count:
                raise ProgramError(
                    f"{name}: rank {rank}, threadblock {n} moves {big} chunks in one step "
                    f"where {target.name} allows {target.max_count}; split the step")

    @staticmethod
    def _ref(side: str, buf: int, off: int, absent: str) -> str:
        """``srcbuf``/``srcoff`` (or ``dst...``) attributes; MSCCL's placeholder when unused.

        As msccl-tools writes them, a send names the receiver's destination and a receive the
        sender's source.
        """
        if buf < 0:
            return f'{side}buf="{absent}" {side}off="-1"'
        return f'{side}buf="{_BUF[buf]}" {side}off="{off}"'
