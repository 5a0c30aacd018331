"""The compiled verifier agrees with the earlier Python one, catches races ordered (or not)
only through messages of another participant, and verifies a synthesized multi-box program
the earlier one refused as too large."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from commflow.collectives import Collective
from commflow.errors import VerificationError
from commflow.ir import Program, ProgramBuilder, element_trace, inp, out, verify
from commflow.ir.step import Op
from commflow.synth import synthesize
from commflow.topology import load

from .mutations import drop_deps, drop_step, duplicate_reduce, set_peer
from .reference_verify import reference_trace, reference_verify
from .test_mutations import programs


def _outcome(check, program: Program) -> tuple[str, tuple] | None:
    """None when ``check`` accepts ``program``, else the error's message and location."""
    try:
        check(program)
    except VerificationError as err:
        return str(err), (err.rank, err.channel, err.step, err.chunk)
    return None


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(programs(), st.data())
def test_compiled_verifier_agrees_with_the_python_one(program, data):
    i = data.draw(st.integers(0, program.nsteps - 1))
    t = program.table
    mutants = [program, drop_step(program, i), drop_deps(program, i)]
    if t.op[i] in (Op.RECV_REDUCE, Op.REDUCE):
        mutants.append(duplicate_reduce(program, i))
    others = [p for p in range(program.nranks) if t.peer[i] >= 0 and p not in (t.part[i],
                                                                                 t.peer[i])]
    if others:
        mutants.append(set_peer(program, i, data.draw(st.sampled_from(others))))
    for mutant in mutants:
        assert _outcome(verify, mutant) == _outcome(reference_verify, mutant)
    assert np.array_equal(element_trace(program), reference_trace(program))


def _chain(ordered: bool) -> Program:
    """Allgather on 2 ranks where rank 0's channels 0 and 1 both write ``out(0)``. With
    ``ordered``, channel 0 writes after a message that rank 1 sends only after channel 1's
    write reached it (no dependency on rank 0 orders them, only the message chain)."""
    b = ProgramBuilder(Collective.ALLGATHER, 2, chunk_factor=1, name="chain")
    b.copy(0, inp(0), out(0), channel=1)
    b.send(0, 1, out(0), channel=1)
    if not ordered:
        b.copy(0, inp(0), out(0), channel=0)
    b.recv(0, 1, out(1), channel=0)
    if ordered:
        b.copy(0, inp(0), out(0), channel=0)
    b.recv(1, 0, out(0), channel=1)
    copied = b.copy(1, inp(0), out(1), channel=1)
    b.send(1, 0, out(1), channel=0, deps=[copied])
    return b.build()


def test_race_ordered_only_through_another_participant():
    verify(_chain(ordered=True))
    reference_verify(_chain(ordered=True))
    with pytest.raises(VerificationError, match="data race with step 0 of channel") as err:
        verify(_chain(ordered=False))
    assert (err.value.rank, err.value.chunk) == (0, ("output", 0))
    assert _outcome(verify, _chain(ordered=False)) == \
        _outcome(reference_verify, _chain(ordered=False))


def test_multi_box_synthesized_program_verifies():
    program = synthesize("allgather", load("dgx-a100x2"), pieces=2)
    channels = len(program.table.channel_starts) - 1
    assert program.nsteps * channels > 50_000_000  # the earlier verifier's limit
    verify(program)
