"""Calibration: parameters that generated the times are recovered, and the error report is
exact on the measurements it fits."""

import pytest

from commflow.errors import CommflowError
from commflow.tune.calibrate import Measured, calibrate, from_records, predict

TRUTH = (12e-6, 3e9, 6e9, 9e9)
CASES = [("allreduce", "ring", 2), ("allreduce", "recursive_doubling", 4),
         ("allreduce", "direct", 4), ("allgather", "ring", 4), ("allgather", "direct", 2)]
SIZES = [1 << 10, 1 << 14, 1 << 18, 1 << 22, 1 << 24]


def synthetic():
    runs = [Measured(c, a, n, s, 1.0) for c, a, n in CASES for s in SIZES]
    return [Measured(m.collective, m.algo, m.nranks, m.size, predict(m, TRUTH)) for m in runs]


def test_the_generating_parameters_are_recovered():
    measured = synthetic()
    result = calibrate(measured[::2], evaluate=measured[1::2])
    assert result.alpha == pytest.approx(TRUTH[0], rel=0.02)
    assert result.bandwidth == pytest.approx(TRUTH[1], rel=0.02)
    assert result.median_error() < 0.01
    assert len(result.rows) == len(measured[1::2])


def test_records_of_commflow_bench_are_read_and_checked():
    record = {"impl": "commflow", "algo": "ring", "inplace": False, "collective": "allreduce",
              "nranks": 2, "size": 1024, "time_us": 100.0}
    others = [{**record, "impl": "gloo"}, {**record, "inplace": True},
              {**record, "algo": "shm"}]
    (found,) = from_records([record, *others])
    assert found == Measured("allreduce", "ring", 2, 1024, found.time)
    assert found.time == pytest.approx(1e-4, rel=1e-12)
    with pytest.raises(CommflowError, match="lacks the fields"):
        from_records([{"impl": "commflow"}])
    with pytest.raises(CommflowError, match="at least 4"):
        calibrate(synthetic()[:3])


def test_the_flow_model_on_a_memory_bus_recovers_its_parameters():
    truth = (12e-6, 3e9, 6e9, 9e9, 4e9)  # the bus below two ports: 4 ranks contend
    runs = [Measured(c, a, n, s, 1.0) for c, a, n in CASES[1:] for s in SIZES[::2]]
    measured = [Measured(m.collective, m.algo, m.nranks, m.size, predict(m, truth))
                for m in runs]
    result = calibrate(measured, model="flow")
    assert result.model == "flow"
    assert result.bus_bandwidth == pytest.approx(truth[4], rel=0.05)
    assert result.median_error() < 0.01
    slow = predict(Measured("allgather", "direct", 4, 1 << 24, 1.0), truth)
    fast = predict(Measured("allgather", "direct", 4, 1 << 24, 1.0), (*truth[:4], 1e12))
    assert slow > 1.5 * fast  # the bus, not the ports, bounds 4 ranks' transfers
    with pytest.raises(CommflowError, match="unknown model"):
        calibrate(measured, model="mesh")
