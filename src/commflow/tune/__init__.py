"""Tuning: the one place that chooses among programs.

Synthesis (:mod:`commflow.synth`) and the registry (:mod:`commflow.algorithms`) make programs;
this package ranks them by the simulator and picks:

- :func:`choose`: the fastest program for one size (``commflow synth --objective balanced``),
  among the bandwidth synthesis at 1, 2, 4, ... pieces, the step schedule and every registered
  algorithm (:func:`candidates`), within a message depth (:func:`message_depth`).
- :func:`rank`: every candidate's simulated time at one size, fastest first.
- :func:`program_set`: the fastest candidate (synthesized or registered) per size range, for
  ``commflow synth --by-size`` and MSCCL's ``minBytes``/``maxBytes``.
- :func:`offline_table`: the fastest registered algorithm per size range, as a
  :class:`~commflow.tuning_table.TuningTable` (JSON, NCCL tuner CSV) for ``commflow tune``.
- :func:`tune_live`: the fastest algorithm per size range measured on a live communicator
  (successive halving, every rank agreeing), as a table ``auto`` follows.
- :func:`versus_fixed`: measured ``auto`` against the fastest fixed algorithm per size and
  over the sweep (``commflow bench --algo all``).
- :func:`calibrate`: the live transport's latency and bandwidths fitted to measured runs
  (``commflow bench --json``), with the simulator's error on each (``commflow calibrate``).
"""

from commflow.tune.by_size import SizeRange, program_set
from commflow.tune.calibrate import Calibration, Measured, calibrate, from_records
from commflow.tune.fastest import (
    DEFAULT_PIECES,
    DEFAULT_SIZE,
    STEP_RANKS,
    STEP_TIME_LIMIT,
    Candidate,
    candidates,
    choose,
    message_depth,
)
from commflow.tune.measured import SizeVerdict, Versus, versus_fixed
from commflow.tune.offline import Ranked, offline_table, rank, registered
from commflow.tune.online import live_fingerprint, tune_live

__all__ = [
    "Calibration",
    "Measured",
    "DEFAULT_PIECES",
    "DEFAULT_SIZE",
    "STEP_RANKS",
    "STEP_TIME_LIMIT",
    "Candidate",
    "Ranked",
    "SizeRange",
    "calibrate",
    "candidates",
    "choose",
    "from_records",
    "message_depth",
    "offline_table",
    "program_set",
    "rank",
    "live_fingerprint",
    "registered",
    "tune_live",
    "SizeVerdict",
    "Versus",
    "versus_fixed",
]
