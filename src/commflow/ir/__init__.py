"""The program IR: a collective algorithm as per-participant channels of steps.

Build programs with :class:`ProgramBuilder` (or :func:`make_program` from columns), check them
with :func:`verify`, serialize with :func:`to_json`/:func:`from_json`, export with
:func:`to_msccl_xml` for a :class:`Target` (:func:`get_target`: ``live``, ``msccl``,
``msccl-executor``, ``rccl``), whose bounded buffers :func:`verify` and the simulator honour.
"""

from commflow.ir.build import ProgramBuilder, StepId, make_program
from commflow.ir.matching import match_transfers
from commflow.ir.msccl import DEFAULT_MAX_BYTES, chunks_per_loop, to_msccl_xml
from commflow.ir.msccl_import import from_msccl_xml
from commflow.ir.program import Participant, Program, StepTable
from commflow.ir.serialize import from_json, load_program, save_program, to_json
from commflow.ir.step import Buffer, Op, ParticipantKind, Ref, Step, inp, out, scr
from commflow.ir.target import PROTOCOLS, TARGETS, Target, bounded, get_target
from commflow.ir.transform import relabel, repeat, split_channels
from commflow.ir.verify import element_trace, verify

__all__ = [
    "DEFAULT_MAX_BYTES",
    "PROTOCOLS",
    "TARGETS",
    "Buffer",
    "Op",
    "Participant",
    "ParticipantKind",
    "Program",
    "ProgramBuilder",
    "Ref",
    "Step",
    "StepId",
    "StepTable",
    "Target",
    "bounded",
    "chunks_per_loop",
    "element_trace",
    "from_json",
    "from_msccl_xml",
    "get_target",
    "inp",
    "load_program",
    "make_program",
    "match_transfers",
    "out",
    "relabel",
    "repeat",
    "split_channels",
    "save_program",
    "scr",
    "to_json",
    "to_msccl_xml",
    "verify",
]
