"""Stragglers: a rank that sleeps before some collectives is named while the job runs (log
line, flight record) and by ``commflow doctor`` from the records."""

from __future__ import annotations

import logging
import subprocess
import sys
import time

import numpy as np
import pytest

from commflow.errors import CommflowError
from commflow.runtime.doctor import diagnose, load_records
from commflow.runtime.straggler import (
    StragglerBoard,
    StragglerConfig,
    find,
    find_in_records,
    outside_time,
)

from .harness import run_world

SLEEP = 1.0  # long beside the scheduling noise of 4 ranks on 2 cores
SLOW_RANK = 2


def _sleepy(comm, dump_dir):
    """16 allreduces; rank 2 sleeps before collectives 4..7 (the second window of 4)."""
    lines: list[str] = []
    handler = logging.Handler()
    handler.emit = lambda record: lines.append(record.getMessage())
    logging.getLogger("commflow.runtime.straggler").addHandler(handler)
    x = np.ones(8, np.float32)
    for seq in range(16):
        if comm.rank == SLOW_RANK and 4 <= seq < 8:
            time.sleep(SLEEP)
        comm.allreduce(x)
    comm.dump_flight_record(f"{dump_dir}/flight-rank{comm.rank}.json")
    return lines, comm._flight.stragglers


def test_a_rank_sleeping_before_collectives_is_reported(tmp_path, monkeypatch):
    monkeypatch.setenv("COMMFLOW_STRAGGLER_WINDOW", "4")
    monkeypatch.setenv("COMMFLOW_STRAGGLER_FACTOR", "3")
    monkeypatch.setenv("COMMFLOW_STRAGGLER_MIN", "0.5")
    results = run_world(_sleepy, 4, str(tmp_path), timeout=60)
    for rank, (lines, found) in enumerate(results):
        window = [f for f in found if f["first_seq"] == 4]
        assert [f["rank"] for f in window] == [SLOW_RANK], (rank, found)
        assert window[0]["last_seq"] == 7 and window[0]["seconds"] >= 4 * SLEEP
        assert window[0]["median"] < 0.5 * SLEEP
        mine = [line for line in lines if "outside collectives #4-#7" in line]
        # local rank 0 logs for the host; the others only record
        assert len(mine) == (1 if rank == 0 else 0), lines
    assert results[0][0][0].startswith(f"straggler: rank {SLOW_RANK} spent ")
    assert "the median" in results[0][0][0] and "COMMFLOW_STRAGGLER_FACTOR=3" in results[0][0][0]

    diagnosis, = diagnose(load_records([tmp_path]),
                          stragglers=StragglerConfig(window=4, min_seconds=0.5))
    assert diagnosis.ok
    assert [(s.rank, s.first_seq) for s in diagnosis.stragglers] == [(SLOW_RANK, 4)]
    shown = subprocess.run(
        [sys.executable, "-c", "from commflow.cli import main; main()", "doctor", str(tmp_path)],
        capture_output=True, text=True, check=False, timeout=60)
    assert shown.returncode == 0, shown.stderr
    assert f"straggler: rank {SLOW_RANK} spent " in shown.stdout
    assert "outside collectives #4-#7" in shown.stdout


def test_time_outside_collectives_and_the_rule():
    calls = {0: (10.0, 10.5), 1: (11.0, 11.2), 2: (11.2, 11.3), 3: (13.3, 13.4)}
    assert outside_time(calls, 1, 3) == pytest.approx(0.5 + 0.0 + 2.0)
    assert outside_time(calls, 0, 0) == 0.0  # nothing before the first collective
    config = StragglerConfig(factor=3, window=4, min_seconds=0.05)
    slow, = find({0: 0.01, 1: 0.012, 2: 0.9, 3: 0.011}, 8, 11, config)
    assert (slow.rank, slow.first_seq, slow.last_seq, slow.seconds) == (2, 8, 11, 0.9)
    assert slow.median == pytest.approx(0.0115)
    assert slow.describe() == ("rank 2 spent 0.9 s outside collectives #8-#11, 78.3x the median "
                               "0.0115 s")
    assert find({0: 0.01, 1: 0.04, 2: 0.011}, 0, 3, config) == []  # 4x, but under 0.05 s
    assert find({0: 1.0}, 0, 3, config) == []  # nobody to compare with


def test_doctor_windows_need_every_rank():
    config = StragglerConfig(factor=1.5, window=2, min_seconds=0)
    fast = {s: (float(s), s + 0.5) for s in range(6)}
    slow = {s: (s + (0.9 if s in (2, 3) else 0.0), s + 0.95) for s in range(6)}
    found = find_in_records({0: fast, 1: fast, 2: slow}, config)
    assert [(s.rank, s.first_seq, s.last_seq) for s in found] == [(2, 2, 3)]
    assert find_in_records({0: fast, 1: slow}, StragglerConfig(factor=0)) == []


def test_the_board_compares_a_window_once_every_local_rank_posted_it():
    lines = [np.zeros(8) for _ in range(3)]
    config = StragglerConfig(window=2, min_seconds=0.1)
    boards = [StragglerBoard(lines, me, 10 + me, config) for me in range(2)]
    boards[0].post(0, 0.01)
    boards[1].post(0, 2.0)
    assert boards[0].compare(0) == []  # local rank 2 has not joined (its recorder is off)
    StragglerBoard(lines, 2, 12, config).post(0, 0.02)
    found = boards[0].compare(0)
    assert [(s.rank, s.first_seq, s.last_seq, s.seconds) for s in found] == [(11, 0, 1, 2.0)]
    assert found[0].median == pytest.approx(0.02)
    assert boards[1].compare(1) == []  # nobody posted window 1 yet


def test_settings_from_the_environment():
    config = StragglerConfig.from_env({"COMMFLOW_STRAGGLER_FACTOR": "4",
                                       "COMMFLOW_STRAGGLER_WINDOW": "20",
                                       "COMMFLOW_STRAGGLER_MIN": "0.1"})
    assert config == StragglerConfig(factor=4.0, window=20, min_seconds=0.1)
    assert StragglerConfig.from_env({}) == StragglerConfig(factor=3.0, window=100,
                                                           min_seconds=0.05)
    assert not StragglerConfig.from_env({"COMMFLOW_STRAGGLER_FACTOR": "0"}).enabled
    with pytest.raises(CommflowError, match="COMMFLOW_STRAGGLER_WINDOW='x'"):
        StragglerConfig.from_env({"COMMFLOW_STRAGGLER_WINDOW": "x"})
    with pytest.raises(CommflowError, match="factor must be 0 .off. or a number >= 1"):
        StragglerConfig(factor=0.5)


def _quick(comm):
    x = np.ones(8, np.float32)
    for _ in range(24):
        comm.allreduce(x)  # the compiled small-message path: calls that never wait
    return comm._flight.window


def test_windows_close_on_calls_that_never_wait(monkeypatch):
    monkeypatch.setenv("COMMFLOW_STRAGGLER_WINDOW", "4")
    assert run_world(_quick, 2) == [6, 6]
