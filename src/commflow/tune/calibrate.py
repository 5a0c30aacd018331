"""Calibrating the simulator on measured runs: fit a transport's latency and bandwidths, and
report how far the simulator is from every measurement.

The live runtime's ranks on one host all reach each other through shared memory: modelled as
a full mesh (:func:`commflow.topology.fully_connected`) whose links have latency ``alpha``
(seconds per message) and bandwidth ``bandwidth`` (bytes/s), with local reductions at
``reduce_bandwidth`` and copies at ``copy_bandwidth`` (bytes/s). :func:`calibrate` fits the
four by least squares on the relative error (log of predicted over measured time, so every size
weighs the same), simulating each measured program (the registered algorithm the runtime runs,
``commflow.algorithms.build`` with its defaults) under the ``alphabeta`` model.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

import numpy as np

from commflow.algorithms import available, build
from commflow.errors import CommflowError
from commflow.ir import Program
from commflow.sim import simulate
from commflow.topology import fully_connected

_START = (5e-6, 5e9, 5e9, 10e9)
"""Starting point of the fit: alpha (s), bandwidth, reduce and copy bandwidth (bytes/s)."""


@dataclass(frozen=True)
class Measured:
    """One measured collective: ``time`` seconds for ``size`` bytes (nccl-tests meaning)."""

    collective: str
    algo: str
    nranks: int
    size: int
    time: float


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
        except (KeyError, TypeError, ValueError):
            raise CommflowError(
                f"bench record {i} lacks the fields of commflow bench --json (impl, algo, "
                "inplace, collective, nranks, size, time_us)") from None
        names = {a.name for a in available(collective)}
        if impl == "commflow" and not inplace and algo in names and time > 0 and size > 0:
            found.append(Measured(collective, algo, nranks, size, time))
    return found


def predict(measured: Measured, params: tuple[float, float, float, float],
            programs: dict[tuple[str, str, int], Program] | None = None) -> float:
    """Simulated seconds of one measurement under ``params`` = ``(alpha, bandwidth,
    reduce_bandwidth, copy_bandwidth)``."""
    alpha, bandwidth, reduce_bw, copy_bw = params
    key = (measured.collective, measured.algo, measured.nranks)
    program = programs.get(key) if programs is not None else None
    if program is None:
        program = build(measured.collective, measured.algo, measured.nranks)
        if programs is not None:
            programs[key] = program
    mesh = fully_connected(measured.nranks, bandwidth=bandwidth, latency=alpha)
    return simulate(program, mesh, measured.size, model="alphabeta",
                    reduce_bandwidth=reduce_bw, copy_bandwidth=copy_bw).time


def calibrate(measurements: Iterable[Measured], *,
              evaluate: Iterable[Measured] | None = None) -> Calibration:
    """Fit ``alpha``, ``bandwidth``, ``reduce_bandwidth`` and ``copy_bandwidth`` to
    ``measurements`` (see the module docstring); the rows report ``evaluate`` (default: the
    measurements themselves; pass held-out ones to see the error on runs the fit did not see).
    Raises ``CommflowError`` with fewer than 4 measurements."""
    from scipy.optimize import least_squares

    fit_on = list(measurements)
    if len(fit_on) < 4:
        raise CommflowError(f"calibration needs at least 4 measurements, got {len(fit_on)}")
    programs: dict[tuple[str, str, int], Program] = {}

    def residuals(logs: np.ndarray) -> np.ndarray:
        params = tuple(float(math.exp(v)) for v in logs)
        return np.array([math.log(predict(m, params, programs) / m.time) for m in fit_on])

    start = np.log(np.array(_START))
    fitted = least_squares(residuals, start, bounds=(start - 12, start + 12), x_scale=1.0)
    params = tuple(float(math.exp(v)) for v in fitted.x)
    report = fit_on if evaluate is None else list(evaluate)
    rows = tuple((m, predict(m, params, programs)) for m in report)
    return Calibration(*params, rows=rows)
