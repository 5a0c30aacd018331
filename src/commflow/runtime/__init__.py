"""Real collectives between processes: shared memory inside a host.

``comm = commflow.runtime.init()`` joins the job described by the environment (commflow's
launcher, torchrun or mpirun); the :class:`Communicator` runs any verified program of
:mod:`commflow.algorithms` (``algo=`` names one, ``"auto"`` chooses).
"""

from commflow.runtime.calls import Handle
from commflow.runtime.communicator import Communicator
from commflow.runtime.doctor import Diagnosis, FlightEntry, FlightRecord, diagnose, load_records
from commflow.runtime.errors import (
    CommAbortedError,
    CommError,
    CommMismatchError,
    CommProtocolError,
    CommTimeoutError,
    CrossMemoryError,
    FlightRecordError,
)
from commflow.runtime.flight import FlightConfig, FlightRecorder
from commflow.runtime.init import DEFAULT_TIMEOUT, init
from commflow.runtime.ops import OPS, dtype_of
from commflow.runtime.programs import names as algorithm_names
from commflow.runtime.programs import use_tuning_table
from commflow.runtime.straggler import Straggler, StragglerConfig
from commflow.runtime.variants import Variant
from commflow.runtime.world import WorldSpec, detect_world

__all__ = [
    "DEFAULT_TIMEOUT",
    "OPS",
    "CommAbortedError",
    "CommError",
    "CommMismatchError",
    "CommProtocolError",
    "CommTimeoutError",
    "Communicator",
    "CrossMemoryError",
    "Diagnosis",
    "FlightConfig",
    "FlightEntry",
    "FlightRecord",
    "FlightRecordError",
    "FlightRecorder",
    "Handle",
    "Straggler",
    "StragglerConfig",
    "Variant",
    "WorldSpec",
    "algorithm_names",
    "detect_world",
    "diagnose",
    "dtype_of",
    "init",
    "load_records",
    "use_tuning_table",
]
