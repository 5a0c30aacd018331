"""The flight recorder on live communicators: what it records, the dumps every rank writes when
one fails, and ``commflow doctor`` naming the rank out of step."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

from commflow.cli import app
from commflow.errors import CommflowError
from commflow.runtime import diagnose, load_records

from .harness import run_world

DOC = Path(__file__).resolve().parents[2] / "docs" / "reliability.md"


def doc_example(name: str) -> tuple[str, str]:
    """The script ``name`` of docs/reliability.md and the first line ``commflow doctor``
    prints for it there."""
    text = DOC.read_text().split("## Flight recorder and commflow doctor", 1)[1]
    script = re.search(rf"\(`{re.escape(name)}`\):\n\n```python\n(.*?)```", text, re.S)[1]
    shown = re.search(rf"run -n 4 {re.escape(name)}\n.*?\$ commflow doctor \S+\n(.*?)\n", text,
                      re.S)[1]
    return script, shown


def run_doc_example(tmp_path, name: str, timeout: str) -> tuple[subprocess.CompletedProcess,
                                                                   Path, str]:
    script, shown = doc_example(name)
    (tmp_path / name).write_text(script)
    dumps = tmp_path / "dumps"
    env = {**os.environ, "COMMFLOW_TIMEOUT": timeout, "COMMFLOW_DUMP_DIR": str(dumps)}
    job = subprocess.run([sys.executable, "-m", "commflow.cli", "run", "-n", "4",
                          str(tmp_path / name)], env=env, capture_output=True, text=True,
                         timeout=60, check=False)
    assert job.returncode == 1, job.stderr
    assert sorted(p.name for p in dumps.iterdir()) == [f"flight-rank{r}.json" for r in range(4)]
    return job, dumps, shown


def test_stalled_rank_is_named_from_every_ranks_dump(tmp_path):
    job, dumps, shown = run_doc_example(tmp_path, "stall.py", "3")
    for rank in (0, 1, 3):
        assert f"[flight record: {dumps}/flight-rank{rank}.json; compare every rank's with " \
               f"`commflow doctor {dumps}`]" in job.stderr, job.stderr
    stalled = json.loads((dumps / "flight-rank2.json").read_text())
    assert stalled["trigger"].startswith("requested by rank ")
    assert [(e["seq"], e["state"], e["late"]) for e in stalled["entries"]] == [
        (0, "completed", False), (1, "completed", False), (2, "completed", False)]

    result = CliRunner().invoke(app, ["doctor", str(dumps)])
    assert result.exit_code == 1, result.output
    assert result.output.splitlines()[0] == shown == (
        "FAILED: rank 2 never entered collective seq 3 (allreduce, 4 MiB) that ranks 0,1,3 "
        "started")
    found = json.loads(CliRunner().invoke(app, ["doctor", str(dumps), "--json"]).output)
    assert [(f["kind"], f["seq"], f["culprits"]) for f in found] == [("not_entered", 3, [2])]
    states = [r["state"] for r in found[0]["ranks"]]
    assert states[2] == "completed" and "failed" in states, states  # a rank stopped by the
    assert {states[r] for r in (0, 1, 3)} <= {"failed", "started"}  # launcher first: started


def test_rank_taking_another_branch_is_named(tmp_path):
    job, dumps, shown = run_doc_example(tmp_path, "mismatch.py", "20")
    assert job.stderr.count("CommMismatchError: ") == 4, job.stderr
    result = CliRunner().invoke(app, ["doctor", str(dumps)])
    assert result.exit_code == 1, result.output
    assert result.output.splitlines()[0] == shown == (
        "FAILED: ranks disagree on collective seq 2: rank 1 called broadcast, the others "
        "allreduce")


def _mismatch(comm):
    x = np.arange(64, dtype=np.float32)
    comm.allreduce(x, algo="ring", timeout=20)
    if comm.rank == 0:
        comm.allreduce(x, algo="ring", timeout=20)
    else:
        comm.allgather(x[:32], algo="ring", timeout=20)


def test_mismatched_calls_dump_and_are_diagnosed(tmp_path, monkeypatch):
    monkeypatch.setenv("COMMFLOW_DUMP_DIR", str(tmp_path))
    results = run_world(_mismatch, 2, timeout=30, expect_failure=True)
    for rank, (ok, text) in enumerate(results):
        assert not ok and text.startswith("CommMismatchError"), text
        assert f"[flight record: {tmp_path}/flight-rank{rank}.json" in text.splitlines()[0]
    (found,) = diagnose(load_records([tmp_path]))
    assert (found.kind, found.seq, found.culprits) == ("mismatch", 1, (0, 1))
    assert found.message.startswith("ranks disagree on collective seq 1: rank 0 called "
                                    "allreduce, rank 1 allgather")


def _record_and_dump(comm, path):
    x = np.arange(8, dtype=np.float32)
    comm.allreduce(x)
    comm.allgather(x, algo="ring", async_op=True).wait()
    if comm.rank == 0:
        comm.send(x, 1)
    else:
        comm.recv(x, 0)
    comm.broadcast(x, root=1, algo="binomial_tree")
    return str(comm.dump_flight_record(f"{path}/r{comm.rank}.json"))


def test_dump_flight_record_lists_every_operation(tmp_path):
    paths = run_world(_record_and_dump, 2, str(tmp_path))
    entries = json.loads(Path(paths[1]).read_text())["entries"]
    assert [(e["seq"], e["op"], e["kind"], e["count"], e["bytes"], e["reduce"], e["root"],
             e["peer"], e["algorithm"], e["state"]) for e in entries] == [
        (0, "allreduce", "collective", 8, 32, "sum", None, None, "shm", "completed"),
        (1, "allgather", "collective", 8, 32, None, None, None, "ring", "completed"),
        (0, "recv", "p2p", 8, 32, None, None, 0, "p2p", "completed"),
        (2, "broadcast", "collective", 8, 32, None, 1, None, "binomial_tree", "completed"),
    ]
    (found,) = diagnose(load_records(paths))
    assert (found.ok, found.message) == (True, "all ranks completed seq 2; no mismatch")


def _disabled(comm):
    comm.allreduce(np.ones(4, np.float32))
    with pytest.raises(CommflowError, match="flight recorder is off"):
        comm.dump_flight_record("never.json")


def test_recorder_can_be_turned_off(monkeypatch):
    monkeypatch.setenv("COMMFLOW_FLIGHT_RECORDER", "0")
    run_world(_disabled, 2)


def _sub_mismatch(comm, path):
    sub = comm.split(comm.rank % 2)
    x = np.arange(16, dtype=np.float32)
    sub.allreduce(x, algo="ring", timeout=20)
    if comm.rank % 2 == 0:  # the world's split is over here (completed in the record)
        Path(f"{path}/split-done-{comm.rank}").touch()
    if comm.rank == 3:
        while not all(Path(f"{path}/split-done-{r}").exists() for r in (0, 2)):
            time.sleep(0.01)
        sub.allreduce(x[:8], algo="ring", timeout=20)
    else:
        sub.allreduce(x, algo="ring", timeout=20)
    time.sleep(1)  # still alive when ranks 1 and 3 fail and ask for records


def test_sub_communicator_records_are_diagnosed_apart(tmp_path, monkeypatch):
    dumps = tmp_path / "dumps"
    monkeypatch.setenv("COMMFLOW_DUMP_DIR", str(dumps))
    results = run_world(_sub_mismatch, 4, str(tmp_path), timeout=30, expect_failure=True)
    for rank in (1, 3):  # (a mismatch aborts the host: ranks 0 and 2 may fail too)
        assert results[rank][1].startswith("CommMismatchError"), results[rank]
    findings = diagnose(load_records([dumps]))
    world = findings[0]
    assert (world.comm_id, world.ok, world.message) == (
        0, True, "all ranks completed seq 0; no mismatch")  # split's allgather
    (odd,) = [f for f in findings if [r.global_rank for r in f.records] == [1, 3]]
    assert (odd.kind, odd.seq, odd.nranks, odd.culprits) == ("mismatch", 1, 2, (0, 1))
    assert odd.message == (f"communicator {odd.comm_id}: ranks disagree on collective seq 1: "
                           f"rank 0 called allreduce (64 B), rank 1 allreduce (32 B) (no "
                           f"majority: any of them may be the one out of step)")
    (even,) = [f for f in findings if [r.global_rank for r in f.records] == [0, 2]]
    assert sorted(p.name for p in dumps.iterdir()) == sorted(
        [f"flight-rank{r}.json" for r in range(4)]
        + [f"flight-comm{f.comm_id}-rank{r}.json" for f, ranks in ((odd, (1, 3)), (even, (0, 2)))
           for r in ranks])
