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


def test_the_host_model_adds_call_message_and_cache_costs_to_the_flow_model():
    from commflow.algorithms import build
    from commflow.tune.calibrate import messages_per_rank, touched_bytes

    assert messages_per_rank(build("allreduce", "ring", 4)) == 12  # 2(n-1) sends and receives
    assert messages_per_rank(build("allgather", "direct", 4)) == 6
    ring = build("allreduce", "ring", 4)
    assert touched_bytes(ring, 1 << 20) == 4 * 2 * (1 << 20)  # every rank's input and output
    flow = (12e-6, 3e9, 6e9, 9e9, 4e9)
    run = Measured("allreduce", "ring", 4, 1 << 20, 1.0)
    plain = predict(run, flow)
    # 4 ranks on 2 CPUs: each rank's 12 messages cost twice their CPU time
    assert predict(run, (*flow, 20e-6, 5e-6, 1e30, 0.0), cpus=2) == pytest.approx(
        plain + 20e-6 + 2 * 5e-6 * 12, rel=1e-12)
    assert predict(run, (*flow, 20e-6, 5e-6, 1e30, 0.0), cpus=4) == pytest.approx(
        plain + 20e-6 + 5e-6 * 12, rel=1e-12)
    # far beyond the cache every bandwidth is (1 + slowdown) times lower
    big = Measured("allreduce", "ring", 4, 1 << 30, 1.0)
    slowed = tuple(v / 3 if i else v for i, v in enumerate(flow))
    assert predict(big, (*flow, 0.0, 0.0, 1.0, 2.0)) == pytest.approx(
        predict(big, slowed), rel=1e-6)


def test_the_host_model_recovers_its_parameters():
    truth = (12e-6, 3e9, 6e9, 9e9, 4e9, 20e-6, 5e-6, float(4 << 20), 1.5)
    sizes = [1 << k for k in range(8, 27, 2)]
    runs = [Measured(c, a, n, s, 1.0) for c, a, n in CASES for s in sizes]
    measured = [Measured(m.collective, m.algo, m.nranks, m.size,
                         predict(m, truth, cpus=2)) for m in runs]
    result = calibrate(measured[::2], evaluate=measured[1::2], model="host", cpus=2)
    assert result.model == "host" and result.cpus == 2
    assert result.median_error() < 0.01
    assert result.call_overhead == pytest.approx(truth[5], rel=0.1)
    assert result.cache_slowdown == pytest.approx(truth[8], rel=0.1)
    with pytest.raises(CommflowError, match="at least 9"):
        calibrate(measured[:8], model="host")


def test_runs_over_emulated_hosts_are_fitted_apart_from_shared_memory():
    record = {"impl": "commflow", "algo": "ring", "inplace": False, "collective": "allreduce",
              "nranks": 2, "size": 1024, "time_us": 100.0}
    one, engine = from_records([record, {**record, "hosts": 2}])
    assert (one.hosts, engine.hosts) == (1, 2)  # records before --hosts: one host
    shm = synthetic()
    over = [Measured(m.collective, m.algo, m.nranks, m.size, m.time, m.nranks) for m in shm]
    with pytest.raises(CommflowError, match="fit each transport on its own runs"):
        calibrate(shm[:8], evaluate=over[:8])
    routed = [Measured("allreduce", "ring", 4, s, 1e-3, 2) for s in SIZES]
    with pytest.raises(CommflowError, match="mix shared memory and the engine"):
        calibrate(routed)
    fit = calibrate(over[::2], evaluate=iter(over[1::2]))  # any iterable, read once
    assert len(fit.rows) == len(over[1::2]) and fit.median_error() < 0.01
