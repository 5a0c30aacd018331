"""Alpha-beta timing of a program on a fully connected network, in exact fractions.

A channel runs its steps in order. A send keeps its channel busy for ``alpha + bytes·beta``
and its message arrives when it ends; a receive ends at the later of its start and its
message's arrival; local steps take no time. Every rank pair has its own link, so a rank
receives from several peers at once. This is the model under which the closed forms of
Thakur, Rabenseifner & Gropp 2005 hold.
"""

from __future__ import annotations

from fractions import Fraction

import numpy as np

from commflow.ir import Op, Program, match_transfers

from .interpret import execution_order


def alpha_beta_time(program: Program, alpha: Fraction, beta: Fraction, size: Fraction) -> Fraction:
    """Completion time of ``program`` moving ``size`` bytes (nccl-tests convention)."""
    t = program.table
    chunk = program.chunk_bytes(Fraction(size))
    sender = match_transfers(program)
    end: list[Fraction] = [Fraction(0)] * len(t)
    for i in execution_order(program, np.random.default_rng(0)):
        before = [end[int(d)] for d in t.deps_of(i)]
        if t.position[i] > 0:
            before.append(end[i - 1])
        start = max(before, default=Fraction(0))
        op = Op(int(t.op[i]))
        if op is Op.SEND:
            end[i] = start + alpha + int(t.count[i]) * chunk * beta
        elif op.receives:
            end[i] = max(start, end[int(sender[i])])
        else:
            end[i] = start
    return max(end, default=Fraction(0))


def message_count(program: Program) -> int:
    """Number of sends in ``program``."""
    return int(np.count_nonzero(program.table.op == Op.SEND))
