"""Calibrating the simulator on measured runs: fit a transport's latency and bandwidths, and
report how far the simulator is from every measurement.

The live runtime's ranks on one host all reach each other through shared memory: modelled as
a full mesh (:func:`commflow.topology.fully_connected`) whose links have latency ``alpha``
(seconds per message) and bandwidth ``bandwidth`` (bytes/s), with local reductions at
``reduce_bandwidth`` and copies at ``copy_bandwidth`` (bytes/s). :func:`calibrate` fits the
four by least squares on the relative error (log of predicted over measured time, so every size
weighs the same; a soft-L1 loss, so that a run stalled by the scheduler does not drag the
fit), simulating each measured program (the registered algorithm the runtime runs,
``commflow.algorithms.build`` with its defaults) under the ``alphabeta`` model.

With ``model="flow"`` the host is a memory bus instead (:func:`host_topology`): every rank
reaches a hub through a port of ``bandwidth`` (its latency ``alpha``), and all transfers
cross one hub link of ``bus_bandwidth``, shared fairly by the flow model's water-filling; so
the ranks' concurrent copies contend as they do for the host's memory. The fit then has a
fifth parameter, the bus bandwidth.

``model="host"`` adds what the host's CPUs and caches cost on top of the flow model (four more
parameters): a fixed ``call_overhead`` per collective (entering the call through the
executor and its end-of-call checks), ``message_cpu`` seconds of CPU per message a rank sends or
receives (posting, polling, waking; stretched by ``nranks / cpus`` when the ranks outnumber
the usable CPUs, as each rank then gets that share of a core), and a cache knee: every
bandwidth is divided by ``1 + cache_slowdown * x**2 / (1 + x**2)`` with ``x`` the bytes the
host's ranks touch (inputs and outputs) over ``cache_bytes``, so buffers that stay in the
caches move faster than those that stream from memory.

The same models fit the engine transport (``commflow bench --hosts N`` with a host per rank:
every pair of ranks talks through gloo over TCP): its measurements carry their ``hosts`` and
are fitted apart from shared memory's, since one set of parameters cannot describe both.
"""

from __future__ import annotations

import math
import os
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

import numpy as np

from commflow.algorithms import available, build
from commflow.errors import CommflowError
from commflow.ir import Op, Program
from commflow.sim import simulate
from commflow.topology import Node, NodeKind, Topology, fully_connected, make_topology
from commflow.topology.graph import Link

_START = (5e-6, 5e9, 5e9, 10e9, 10e9, 10e-6, 5e-6, float(8 << 20), 1.0)
"""Starting point of the fit: alpha (s), bandwidth, reduce, copy and bus bandwidth (bytes/s;
the bus for the flow and host models), then the host model's call overhead (s), CPU per
message (s), cache size (bytes) and slowdown beyond it."""

MODELS = ("alphabeta", "flow", "host")
"""What :func:`calibrate` fits: a full mesh under the alphabeta model, a memory bus under the
flow model, or that bus with the host's CPU and cache costs (see the module docstring)."""

_PARAMETERS = {"alphabeta": 4, "flow": 5, "host": 9}
"""How many of :data:`_START` each model fits."""


@dataclass(frozen=True)
class Measured:
    """One measured collective: ``time`` seconds for ``size`` bytes (nccl-tests meaning)."""

    collective: str
    algo: str
    nranks: int
    size: int
    time: float
    hosts: int = 1
    """Emulated hosts of the run (``commflow bench --hosts``): 1, shared memory; one per rank,
    the engine transport between every pair."""


@dataclass(frozen=True)
class Calibration:
    """Fitted transport parameters and the simulator's error on each measurement."""

    alpha: float
    """Seconds per message."""
    bandwidth: float
    """Bytes/s of a rank-to-rank transfer."""
    reduce_bandwidth: float
    """Bytes/s of a local reduction."""
    copy_bandwidth: float
    """Bytes/s of a local copy."""
    rows: tuple[tuple[Measured, float], ...]
    """Each measurement with its predicted time (seconds)."""
    model: str = "alphabeta"
    """The simulator model fitted (see :data:`MODELS`)."""
    bus_bandwidth: float | None = None
    """Bytes/s of the memory bus all transfers share (flow and host models), else ``None``."""
    call_overhead: float = 0.0
    """Seconds every call costs besides its messages (host model)."""
    message_cpu: float = 0.0
    """Seconds of CPU per message a rank sends or receives (host model)."""
    cache_bytes: float | None = None
    """Bytes the ranks may touch before the bandwidths drop (host model), else ``None``."""
    cache_slowdown: float = 0.0
    """How much slower every bandwidth is far beyond :attr:`cache_bytes` (host model)."""
    cpus: int = 1
    """Usable CPUs of the host the measurements ran on (host model)."""

    def errors(self) -> np.ndarray:
        """Relative errors ``(predicted - measured) / measured`` of :attr:`rows`."""
        return np.array([(p - m.time) / m.time for m, p in self.rows])

    def median_error(self) -> float:
        """Median of the absolute relative errors."""
        return float(np.median(np.abs(self.errors())))


def from_records(records: Iterable[Mapping[str, object]]) -> list[Measured]:
    """The measurements of ``commflow bench --json`` records that ran a registered algorithm
    of commflow (out of place); fast paths, peers and program files are left out. Raises
    ``CommflowError`` for records without the bench's fields."""
    found = []
    for i, r in enumerate(records):
        try:
            impl, algo, inplace = r["impl"], str(r["algo"]), bool(r["inplace"])
            collective, nranks = str(r["collective"]), int(r["nranks"])
            size, time = int(r["size"]), float(r["time_us"]) * 1e-6
            hosts = int(r.get("hosts", 1))
        except (KeyError, TypeError, ValueError):
            raise CommflowError(
                f"bench record {i} lacks the fields of commflow bench --json (impl, algo, "
                "inplace, collective, nranks, size, time_us)") from None
        names = {a.name for a in available(collective)}
        if impl == "commflow" and not inplace and algo in names and time > 0 and size > 0:
            found.append(Measured(collective, algo, nranks, size, time, hosts))
    return found


def _one_transport(measured: list[Measured]) -> None:
    """Raise ``CommflowError`` unless every run of ``measured`` used one transport: all its
    ranks on one host (shared memory) or each on its own (the engine), the same in every
    run."""
    mixed = sorted({m.hosts for m in measured if 1 < m.hosts < m.nranks})
    if mixed:
        raise CommflowError(
            f"calibrate: runs over {mixed[0]} emulated hosts mix shared memory and the engine "
            "transport, which one model cannot fit; measure with --hosts 1 or --hosts = -n")
    kinds = {m.hosts > 1 for m in measured}
    if len(kinds) > 1:
        raise CommflowError(
            "calibrate: the runs mix one host (shared memory) with a host per rank (the "
            "engine transport); fit each transport on its own runs")


def host_topology(nranks: int, *, alpha: float, bandwidth: float,
                  bus_bandwidth: float | None = None) -> Topology:
    """The ranks of one host: a full mesh of ``bandwidth`` links of latency ``alpha``, or with
    ``bus_bandwidth`` a memory bus (ranks -> port of ``bandwidth``, latency ``alpha`` -> one
    shared hub link of ``bus_bandwidth`` -> port -> ranks)."""
    if bus_bandwidth is None:
        return fully_connected(nranks, bandwidth=bandwidth, latency=alpha)
    nodes = [Node(i, NodeKind.RANK, f"rank{i}", 0) for i in range(nranks)]
    nodes += [Node(nranks, NodeKind.SWITCH, "bus-in", 0),
              Node(nranks + 1, NodeKind.SWITCH, "bus-out", 0)]
    links = [Link(nranks, nranks + 1, bus_bandwidth, 0.0)]
    for r in range(nranks):
        links += [Link(r, nranks, bandwidth, alpha), Link(nranks + 1, r, bandwidth, 0.0)]
    return make_topology(f"host bus {nranks} ranks", nodes, links)


def _program(measured: Measured,
             programs: dict[tuple[str, str, int], Program] | None) -> Program:
    key = (measured.collective, measured.algo, measured.nranks)
    program = programs.get(key) if programs is not None else None
    if program is None:
        program = build(measured.collective, measured.algo, measured.nranks)
        if programs is not None:
            programs[key] = program
    return program


def messages_per_rank(program: Program) -> int:
    """The most messages (sends and receives) any rank of ``program`` handles in one call."""
    table = program.table
    ranks = table.part < program.nranks
    moving = np.isin(table.op, (Op.SEND, Op.RECV, Op.RECV_REDUCE)) & ranks
    return int(np.bincount(table.part[moving], minlength=program.nranks).max(initial=0))


def touched_bytes(program: Program, size: float) -> float:
    """Bytes of input and output buffers all ranks of ``program`` hold for ``size``."""
    inputs, outputs = program.expected_buffers()
    return program.nranks * (inputs + outputs) * program.chunk_bytes(size)


def predict(measured: Measured, params: tuple[float, ...],
            programs: dict[tuple[str, str, int], Program] | None = None, *,
            cpus: int = 1) -> float:
    """Simulated seconds of one measurement under ``params`` = ``(alpha, bandwidth,
    reduce_bandwidth, copy_bandwidth)`` (alphabeta model, full mesh), with a fifth,
    ``bus_bandwidth``, the flow model on :func:`host_topology`'s bus, and with four more,
    ``(call_overhead, message_cpu, cache_bytes, cache_slowdown)``, the host model on a host of
    ``cpus`` usable CPUs (module docstring)."""
    alpha, bandwidth, reduce_bw, copy_bw = params[:4]
    bus = params[4] if len(params) > 4 else None
    program = _program(measured, programs)
    extra, slow = 0.0, 1.0
    if len(params) > 5:
        call, message_cpu, cache, slowdown = params[5:9]
        share = max(1.0, measured.nranks / cpus)
        extra = call + message_cpu * share * messages_per_rank(program)
        x = (touched_bytes(program, measured.size) / cache) ** 2
        slow = 1.0 + slowdown * x / (1.0 + x)
    host = host_topology(measured.nranks, alpha=alpha, bandwidth=bandwidth / slow,
                         bus_bandwidth=None if bus is None else bus / slow)
    return extra + simulate(program, host, measured.size,
                            model="alphabeta" if bus is None else "flow",
                            reduce_bandwidth=reduce_bw / slow,
                            copy_bandwidth=copy_bw / slow).time


def calibrate(measurements: Iterable[Measured], *,
              evaluate: Iterable[Measured] | None = None,
              model: str = "alphabeta", cpus: int | None = None) -> Calibration:
    """Fit ``alpha``, ``bandwidth``, ``reduce_bandwidth`` and ``copy_bandwidth`` (for
    ``model="flow"`` also ``bus_bandwidth``; for ``"host"`` also the call overhead, the CPU
    per message and the cache knee) to ``measurements`` (see the module docstring); the rows
    report ``evaluate`` (default: the measurements themselves; pass held-out ones to see the
    error on runs the fit did not see). ``cpus``: usable CPUs of the measured host (host
    model; default this machine's). Raises ``CommflowError`` for an unknown model, fewer
    measurements than parameters, or runs of different transports (:attr:`Measured.hosts`)."""
    from scipy.optimize import least_squares

    if model not in MODELS:
        raise CommflowError(f"calibrate: unknown model {model!r}; use one of "
                            f"{', '.join(MODELS)}")
    fit_on = list(measurements)
    report = fit_on if evaluate is None else list(evaluate)
    _one_transport(fit_on + report)
    count = _PARAMETERS[model]
    if len(fit_on) < count:
        raise CommflowError(f"calibration of the {model} model needs at least {count} "
                            f"measurements, got {len(fit_on)}")
    cpus = cpus if cpus is not None else len(os.sched_getaffinity(0))
    programs: dict[tuple[str, str, int], Program] = {}

    def residuals(logs: np.ndarray) -> np.ndarray:
        params = tuple(float(math.exp(v)) for v in logs)
        return np.array([math.log(predict(m, params, programs, cpus=cpus) / m.time)
                         for m in fit_on])

    start = np.log(np.array(_START[:count]))
    fitted = least_squares(residuals, start, bounds=(start - 12, start + 12), x_scale=1.0,
                           loss="soft_l1", f_scale=0.1)
    params = tuple(float(math.exp(v)) for v in fitted.x)
    rows = tuple((m, predict(m, params, programs, cpus=cpus)) for m in report)
    host = dict(zip(("call_overhead", "message_cpu", "cache_bytes", "cache_slowdown"),
                    params[5:], strict=False))
    return Calibration(*params[:4], rows=rows, model=model,
                       bus_bandwidth=params[4] if len(params) > 4 else None, cpus=cpus,
                       **host)
