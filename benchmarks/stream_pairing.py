"""Would fused receive-sends pay off on MI250 x2? Pair each rank's in-streams with out-streams.

An MSCCL ``rcs``/``rrcs`` step receives a chunk and forwards it in one step, but only inside
one threadblock, which holds one receive peer and one send peer and runs its steps in order.
This pairs, on every rank of a stream program (:mod:`commflow.synth.streams`), in-edge
streams with out-edge streams (most forwards first; chains of paired streams never visit a
rank twice), runs each pair as one channel with its steps in the order a simulation of the
program on the target ran them (receives at completion, sends at start; receives first on
ties), and reports: the share of forwards the best pair of streams covers, how many forwards
end up right after their receive (fusable), and the paired program's loss at 1 GiB on
msccl-executor against the default synthesis (flow model).

    .venv/bin/python benchmarks/stream_pairing.py reducescatter 128 1,1,1,2,2 3
"""

from __future__ import annotations

import sys
from collections import Counter

import numpy as np

from commflow.ir import Op, verify
from commflow.ir.target import bounded, get_target
from commflow.ir.transform import reorder
from commflow.sim import simulate
from commflow.synth import synthesize
from commflow.topology import load

SIZE = 1 << 30


def main(collective: str, pieces: int, head: tuple[int, ...], group: int) -> None:
    topo, where = load("mi250x2"), get_target("msccl-executor")
    default = simulate(synthesize(collective, topo), topo, SIZE, model="flow").algbw
    program = synthesize(collective, topo, pieces=pieces, merge=(head, group))
    t, n = program.table, program.nranks
    run = bounded(program, where, chunk_bytes=program.chunk_bytes(SIZE))
    finish = simulate(run, topo, SIZE, model="flow").finish
    start = np.zeros(len(t))
    later = np.flatnonzero(run.table.position > 0)
    start[later] = finish[later - 1]
    np.maximum.at(start, np.repeat(np.arange(len(t)), np.diff(run.table.dep_ptr)),
                  finish[run.table.dep_idx])
    sends = t.op == Op.SEND
    recvs = (t.op == Op.RECV) | (t.op == Op.RECV_REDUCE)
    owner = np.repeat(np.arange(len(t)), np.diff(t.dep_ptr))
    forward = (sends[owner] & recvs[t.dep_idx] & (t.src_buf[owner] == t.dst_buf[t.dep_idx])
               & (t.src_off[owner] == t.dst_off[t.dep_idx]))
    fwd_send, fwd_recv = owner[forward], t.dep_idx[forward]
    chan = t.chan.astype(np.int64)
    weight = Counter(zip(chan[fwd_recv].tolist(), chan[fwd_send].tolist(), strict=True))
    length = Counter(chan.tolist())
    cover = max(w / max(length[a], length[b]) for (a, b), w in weight.items())
    label = {int(c): int(c) for c in np.unique(chan)}
    ranks = {c: {c // n, c % n} for c in label if c < n * n}

    def root(c: int) -> int:
        while label[c] != c:
            c = label[c]
        return c

    into, out_of, pairs = set(), set(), 0  # streams paired at their receiver, their sender
    for (a, b), _ in sorted(weight.items(), key=lambda e: (-e[1], e[0])):
        ra, rb = root(a), root(b)
        if a in into or b in out_of or ra == rb or ranks[ra] & ranks[rb] != {a % n}:
            continue
        into.add(a)
        out_of.add(b)
        label[rb], ranks[ra] = ra, ranks[ra] | ranks.pop(rb)
        pairs += 1
    new = np.array([root(int(c)) for c in chan])
    key = np.where(sends, start, finish)
    order = np.lexsort((np.arange(len(t)), sends, key, new, t.part))
    paired = reorder(program, order, {"chan": new})
    verify(paired, target=where, max_bytes=SIZE)
    algbw = simulate(paired, topo, SIZE, model="flow", target=where).algbw
    position = np.empty_like(order)
    position[order] = np.arange(len(t))
    q = paired.table
    fusable = int(np.count_nonzero(
        (position[fwd_send] == position[fwd_recv] + 1)
        & (np.diff(q.dep_ptr)[position[fwd_send]] == 1)
        & (q.chan[position[fwd_send]] == q.chan[position[fwd_recv]])))
    alone = simulate(program, topo, SIZE, model="flow", target=where).algbw
    print(f"{collective} {pieces} merged {','.join(map(str, head))}:{group} on mi250x2: "
          f"{len(fwd_send):,} forwards of {int(sends.sum()):,} sends; the best pair of "
          f"streams covers {100 * cover:.0f}% of the longer; {pairs} pairs of "
          f"{len({int(c) for c in chan[sends]})} streams; {fusable:,} forwards right after "
          f"their receive; loss {100 * (1 - algbw / default):.2f}% paired, "
          f"{100 * (1 - alone / default):.2f}% unpaired (msccl-executor, 1 GiB, flow)")


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]), tuple(int(k) for k in sys.argv[3].split(",")),
         int(sys.argv[4]))
