"""``commflow doctor``: exit status, first line, JSON fields and errors on real records."""

from __future__ import annotations

import json

import numpy as np

from commflow.runtime import FlightRecorder


def write_world(tmp_path, calls_by_rank: dict[int, int], nranks: int = 3) -> None:
    """Rank r completes ``calls_by_rank[r]`` allreduces of 1 KiB."""
    for rank, calls in calls_by_rank.items():
        fr = FlightRecorder(8, dump_dir=tmp_path, meta={
            "job": "j", "comm_id": 0, "rank": rank, "global_rank": rank, "nranks": nranks,
            "ranks": list(range(nranks))})
        for seq in range(calls):
            fr.complete(fr.record(seq, "allreduce", np.dtype(np.float32), 1024, reduce="sum",
                                  root=None, peer=None, algo="ring", started=True))
        fr.dump(fr.default_path())


def test_consistent_records_exit_0(commflow, tmp_path):
    write_world(tmp_path, {0: 5, 1: 5, 2: 5})
    run = commflow("doctor", str(tmp_path))
    assert run.code == 0, run.stderr
    lines = run.stdout.splitlines()
    assert lines[0] == "OK: all ranks completed seq 4; no mismatch"
    assert lines[1].split() == ["rank", "last", "seq", "collective", "state", "record"]
    assert lines[2].split() == ["0", "4", "allreduce,", "1", "KiB", "completed",
                                str(tmp_path / "flight-rank0.json")]


def test_lagging_rank_exits_1_with_json(commflow, tmp_path):
    write_world(tmp_path, {0: 5, 1: 4, 2: 5})
    run = commflow("doctor", *(str(tmp_path / f"flight-rank{r}.json") for r in range(3)),
                   "--json")
    assert run.code == 1, run.stderr
    (found,) = json.loads(run.stdout)
    assert {k: found[k] for k in ("ok", "kind", "seq", "culprits", "nranks")} == {
        "ok": False, "kind": "not_entered", "seq": 4, "culprits": [1], "nranks": 3}
    assert found["message"] == ("rank 1 never entered collective seq 4 (allreduce, 1 KiB) that "
                                "ranks 0,2 started")
    assert [(r["rank"], r["last_seq"], r["state"]) for r in found["ranks"]] == [
        (0, 4, "completed"), (1, 3, "completed"), (2, 4, "completed")]


def test_malformed_file_is_one_error_line(commflow, tmp_path):
    bad = tmp_path / "flight-rank0.json"
    bad.write_text('{"format": "commflow-flight-record", "version": 1, "entries": "x"}')
    run = commflow("doctor", str(bad))
    assert run.code == 2
    assert run.stdout == ""
    assert run.stderr.startswith(f"error: {bad}.entries: expected list, got 'x'")
    assert "Traceback" not in run.stderr


def test_help(commflow):
    run = commflow("doctor", "--help")
    assert run.code == 0 and "flight records" in run.stdout and "--json" in run.stdout
