"""The flight recorder's ring and files, and the analysis of ``commflow doctor`` on records
written by the real recorder for made-up histories."""

from __future__ import annotations

import json
import time

import numpy as np
import pytest

from commflow.errors import CommflowError
from commflow.runtime import FlightConfig, FlightRecorder, FlightRecordError, diagnose, load_records
from commflow.runtime.doctor import human_bytes

F32 = np.dtype(np.float32)
MIB4 = 1 << 20  # float32 elements in 4 MiB


def recorder(tmp_path, rank: int, nranks: int = 4, capacity: int = 64, comm_id: int = 0):
    meta = {"job": "j", "comm_id": comm_id, "rank": rank, "global_rank": rank,
            "nranks": nranks, "ranks": list(range(nranks))}
    return FlightRecorder(capacity, dump_dir=tmp_path, meta=meta)


def play(fr: FlightRecorder, calls, *, last: str = "completed") -> None:
    """Record ``calls`` (``(op, count, root)``), all completed but the last, left ``last``."""
    for seq, (op, count, root) in enumerate(calls):
        entry = fr.record(seq, op, F32, count * 4, reduce="sum" if op == "allreduce" else None,
                          root=root, peer=None, algo="ring", started=True)
        if seq < len(calls) - 1 or last == "completed":
            fr.complete(entry)
        elif last == "failed":
            fr.fail()


def world(tmp_path, histories, *, last="completed"):
    for rank, calls in histories.items():
        fr = recorder(tmp_path, rank, nranks=4)
        play(fr, calls, last=last if isinstance(last, str) else last[rank])
        fr.dump(fr.default_path())
    (found,) = diagnose(load_records([tmp_path]))
    return found


AR = ("allreduce", MIB4, None)
BC = ("broadcast", MIB4, 0)


def test_consistent_history_is_ok(tmp_path):
    found = world(tmp_path, {r: [AR, BC, AR] for r in range(4)})
    assert (found.ok, found.kind, found.seq, found.culprits) == (True, "consistent", 2, ())
    assert found.message == "all ranks completed seq 2; no mismatch"


def test_rank_that_never_entered_is_named(tmp_path):
    histories = {r: [AR, AR, AR, AR] for r in (0, 1, 3)} | {2: [AR, AR, AR]}
    found = world(tmp_path, histories, last={0: "failed", 1: "failed", 2: "completed",
                                             3: "started"})
    assert (found.kind, found.seq, found.culprits) == ("not_entered", 3, (2,))
    assert found.message == ("rank 2 never entered collective seq 3 (allreduce, 4 MiB) that "
                             "ranks 0,1,3 started")


def test_rank_that_entered_only_after_a_failure_is_named(tmp_path):
    for rank in range(4):
        fr = recorder(tmp_path, rank)
        play(fr, [AR] * (4 if rank != 2 else 3), last="failed" if rank != 2 else "completed")
        if rank == 2:  # its watcher heard rank 0's request, then it called the collective
            fr.failed_peer, fr.failed_at = 0, time.monotonic()
            fr.record(3, "allreduce", F32, 4 << 20, reduce="sum", root=None, peer=None,
                      algo="ring", started=True)
            fr.fail()
            assert [e["late"] for e in fr.snapshot("test")["entries"]] == [False] * 3 + [True]
        fr.dump(fr.default_path())
    (found,) = diagnose(load_records([tmp_path]))
    assert (found.kind, found.seq, found.culprits) == ("not_entered", 3, (2,))
    assert found.message == ("rank 2 never entered collective seq 3 (allreduce, 4 MiB) that "
                             "ranks 0,1,3 started in time (rank 2 entered it only after rank 0 "
                             "had failed)")


def test_missing_record_comes_with_who_lags(tmp_path):
    found = world(tmp_path, {0: [AR, AR, AR], 1: [AR, AR, AR], 2: [AR, AR]})
    assert (found.kind, found.seq, found.culprits) == ("missing_record", 2, (2, 3))
    assert found.message == ("no record from rank 3 (a process that died before writing one, "
                             "or a file not given); rank 2 never entered collective seq 2 "
                             "(allreduce, 4 MiB) that ranks 0,1 started")


def test_op_mismatch_names_the_odd_rank(tmp_path):
    histories = {r: [AR, AR] for r in (0, 2, 3)} | {1: [AR, BC]}
    found = world(tmp_path, histories, last="failed")
    assert (found.kind, found.seq, found.culprits) == ("mismatch", 1, (1,))
    assert found.message == ("ranks disagree on collective seq 1: rank 1 called broadcast, the "
                             "others allreduce")


def test_size_mismatch_shows_both_sizes(tmp_path):
    histories = {r: [AR, AR, AR] for r in (0, 1, 2)} | {3: [AR, ("allreduce", 512, None), AR]}
    found = world(tmp_path, histories)
    assert (found.kind, found.seq, found.culprits) == ("mismatch", 1, (3,))
    assert found.message == ("ranks disagree on collective seq 1: rank 3 called allreduce (2 KiB)"
                             ", the others allreduce (4 MiB)")


def test_root_mismatch_without_majority(tmp_path):
    for rank, root in ((0, 0), (1, 1)):
        fr = recorder(tmp_path, rank, nranks=2)
        play(fr, [("broadcast", 8, root)])
        fr.dump(fr.default_path())
    (found,) = diagnose(load_records([tmp_path]))
    assert (found.kind, found.culprits) == ("mismatch", (0, 1))
    assert found.message.startswith("ranks disagree on collective seq 0: rank 0 called broadcast "
                                    "(root 0), rank 1 broadcast (root 1) (no majority")


def test_missing_record_is_named(tmp_path):
    found = world(tmp_path, {r: [AR, AR] for r in (0, 1, 3)})
    assert (found.kind, found.seq, found.culprits) == ("missing_record", 1, (2,))
    assert found.message.startswith("no record from rank 2 ")


def test_all_entered_but_not_completed_is_not_blamed_on_a_rank(tmp_path):
    found = world(tmp_path, {r: [AR, BC] for r in range(4)},
                  last={0: "failed", 1: "failed", 2: "started", 3: "completed"})
    assert (found.ok, found.kind, found.seq, found.culprits) == (False, "incomplete", 1, ())
    assert "failed on ranks 0,1; started on rank 2: no rank fell out of step" in found.message


def test_ring_keeps_the_last_operations(tmp_path):
    fr = recorder(tmp_path, 0, nranks=1, capacity=4)
    play(fr, [AR] * 10)
    data = json.loads(fr.dump(tmp_path / "r.json").read_text())
    assert [e["seq"] for e in data["entries"]] == [6, 7, 8, 9]
    assert (data["recorded"], data["next_seq"], data["capacity"]) == (10, 10, 4)
    entry = data["entries"][-1]
    assert {k: entry[k] for k in ("op", "dtype", "count", "bytes", "reduce", "root", "peer",
                                  "algorithm", "state", "late")} == {
        "op": "allreduce", "dtype": "float32", "count": MIB4, "bytes": 4 << 20,
        "reduce": "sum", "root": None, "peer": None, "algorithm": "ring", "state": "completed",
        "late": False}
    assert entry["t_scheduled"] <= entry["t_start"] <= entry["t_end"] <= data["dumped_at"]


def test_states_follow_the_operation(tmp_path):
    fr = recorder(tmp_path, 0, nranks=2)
    a = fr.record(0, "allgather", F32, 16, reduce=None, root=None, peer=None, algo="auto",
                  started=False)
    b = fr.record(0, "send", F32, 16, reduce=None, root=None, peer=1, algo="p2p",
                  started=False)
    assert (a.state, b.state) == ("scheduled", "scheduled")
    fr.start(a, "ring")
    fr.complete(a)
    fr.start(b, "p2p")
    fr.fail()
    entries = fr.snapshot("test")["entries"]
    assert [(e["kind"], e["algorithm"], e["state"]) for e in entries] == [
        ("collective", "ring", "completed"), ("p2p", "p2p", "failed")]
    assert fr.next_seq == 1  # sends and receives do not count as collectives


def test_config_from_environment(tmp_path):
    config = FlightConfig.from_env({"COMMFLOW_FLIGHT_RECORDER": "0",
                                    "COMMFLOW_DUMP_DIR": str(tmp_path)}, "job1")
    assert (config.capacity, config.dump_dir) == (0, tmp_path)
    default = FlightConfig.from_env({}, "job1")
    assert default.capacity == 256 and default.dump_dir.name == "commflow-job1"
    for text in ("-1", "many", str((1 << 20) + 1)):
        with pytest.raises(CommflowError, match=f"COMMFLOW_FLIGHT_RECORDER='{text}'"):
            FlightConfig.from_env({"COMMFLOW_FLIGHT_RECORDER": text}, "job1")


@pytest.mark.parametrize(("text", "message"), [
    ("{", "not JSON"),
    ('{"format": "other"}', "not a commflow flight record"),
    ('{"format": "commflow-flight-record", "version": 7}', "version 7"),
])
def test_malformed_files_are_refused(tmp_path, text, message):
    (tmp_path / "flight-rank0.json").write_text(text)
    with pytest.raises(FlightRecordError, match=message):
        load_records([tmp_path])


def test_bad_field_is_named(tmp_path):
    fr = recorder(tmp_path, 0)
    play(fr, [AR])
    path = fr.dump(fr.default_path())
    data = json.loads(path.read_text())
    data["entries"][0]["state"] = "lost"
    path.write_text(json.dumps(data))
    with pytest.raises(FlightRecordError, match=r"entries\[0\]: .*'lost'"):
        load_records([path])
    data["entries"][0]["seq"] = "3"
    path.write_text(json.dumps(data))
    with pytest.raises(FlightRecordError, match=r"entries\[0\]\.seq: expected int, got '3'"):
        load_records([path])


def test_the_same_rank_twice_is_refused(tmp_path):
    fr = recorder(tmp_path, 1)
    play(fr, [AR])
    fr.dump(tmp_path / "flight-a.json")
    fr.dump(tmp_path / "flight-b.json")
    with pytest.raises(FlightRecordError, match="both rank 1 of communicator 0"):
        diagnose(load_records([tmp_path]))


def test_directory_without_records_is_refused(tmp_path):
    (tmp_path / "program.json").write_text("{}")
    with pytest.raises(FlightRecordError, match=r"no flight records \(flight-\*\.json\)"):
        load_records([tmp_path])
    with pytest.raises(FlightRecordError, match="no such file or directory"):
        load_records([tmp_path / "nowhere"])


def test_human_bytes():
    assert [human_bytes(n) for n in (12, 1536, 4 << 20, 3 << 30)] == [
        "12 B", "1.5 KiB", "4 MiB", "3 GiB"]
