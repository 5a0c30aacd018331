"""Live in-network aggregation: a SwitchML-style software switch on UDP and its workers.

``run_switch(host, port, nranks, slots)`` serves a pool of integer aggregator slots;
``ina_allreduce(x, switch=(host, port), rank=r, nranks=n)`` sums float arrays through it with
per-block power-of-two scaling, retransmission on loss, and an end-host fallback when the switch
has no slot for the job (ATP). docs/ina.md describes the protocol and its error bound.
"""

from commflow.ina._common import WorkerStats
from commflow.ina.faults import Faults
from commflow.ina.protocol import (
    InaError,
    InaNoSlotsError,
    InaProtocolError,
    InaTimeoutError,
    InaVersionError,
    error_bound,
)
from commflow.ina.ring import udp_ring_allreduce
from commflow.ina.serve import run_switch
from commflow.ina.switch import Switch, SwitchStats
from commflow.ina.worker import ina_allreduce

__all__ = [
    "Faults",
    "InaError",
    "InaNoSlotsError",
    "InaProtocolError",
    "InaVersionError",
    "InaTimeoutError",
    "Switch",
    "SwitchStats",
    "WorkerStats",
    "error_bound",
    "ina_allreduce",
    "run_switch",
    "udp_ring_allreduce",
]
