"""Tuning rules per placement: the table format (version 2, version 1 still read), ``auto``'s
choice by the call's placement, the online tuner's rules, and live ranks that follow them."""

from __future__ import annotations

import json

import numpy as np
import pytest

from commflow.collectives import Collective
from commflow.errors import CommflowError
from commflow.runtime import programs
from commflow.runtime.errors import CommMismatchError
from commflow.tune.online import _rules
from commflow.tuning_table import IN_PLACE, OUT_OF_PLACE, Rule, TuningTable, from_json
from tests.runtime.harness import flight_entries, run_world

TOP = 2**63 - 1
AG = Collective.ALLGATHER
AR = Collective.ALLREDUCE
CMA = "shm:segment=2M:copy=cma"
OLD = """{"format": "commflow.tuning", "version": 1, "fingerprint": "f", "topology": "t",
 "model": "live", "rules": [{"collective": "allgather", "nranks": 2, "min_bytes": 0,
 "max_bytes": 9223372036854775807, "algo": "ring", "time_us": 3.5}]}"""


def _rule(lo: int, hi: int, algo: str, placement: str = "any", coll=AG) -> Rule:
    return Rule(collective=coll, nranks=2, min_bytes=lo, max_bytes=hi, algo=algo, time_us=1.0,
                placement=placement)


def _table(*rules: Rule) -> TuningTable:
    return TuningTable(fingerprint="live:2ranks:2perhost", topology="t", model="live",
                       rules=rules)


SPLIT = _table(_rule(0, 16 << 20, "shm"), _rule((16 << 20) + 1, TOP, CMA, IN_PLACE),
               _rule((16 << 20) + 1, TOP, "shm", OUT_OF_PLACE),
               _rule(0, 8192, "direct", IN_PLACE, AR), _rule(0, 8192, "shm", OUT_OF_PLACE, AR))


def test_round_trip_writes_version_2_only_for_placement_rules():
    doc = json.loads(SPLIT.to_json())
    assert doc["version"] == 2
    assert [r.get("placement") for r in doc["rules"]] == [
        None, "in_place", "out_of_place", "in_place", "out_of_place"]
    assert from_json(SPLIT.to_json()) == SPLIT
    plain = _table(_rule(0, TOP, "ring"))
    doc = json.loads(plain.to_json())
    assert doc["version"] == 1 and "placement" not in doc["rules"][0]
    assert from_json(plain.to_json()) == plain
    old = from_json(OLD)  # a file older commflow wrote
    assert old.rules == (Rule(collective=AG, nranks=2, min_bytes=0, max_bytes=TOP, algo="ring",
                              time_us=3.5),)
    assert old.lookup(AG, 2, 100, in_place=True) == old.lookup(AG, 2, 100) == "ring"


def test_malformed_placements_are_refused():
    doc = json.loads(SPLIT.to_json())
    with pytest.raises(CommflowError, match="version 3 is not supported"):
        from_json(json.dumps({**doc, "version": 3}))
    with pytest.raises(CommflowError, match=r"rules\[1\] must have exactly"):
        from_json(json.dumps({**doc, "version": 1}))  # version 1 has no placement
    doc["rules"][0]["placement"] = "inplace"
    with pytest.raises(CommflowError, match="placement must be one of any, in_place"):
        from_json(json.dumps(doc))
    with pytest.raises(CommflowError, match="overlapping rules .0..100 any and 50..200 in_place"):
        _table(_rule(0, 100, "ring"), _rule(50, 200, "direct", IN_PLACE))
    with pytest.raises(CommflowError, match="overlapping"):
        _table(_rule(0, 100, "ring", IN_PLACE), _rule(100, 200, "direct", IN_PLACE))


def test_auto_chooses_by_placement_and_the_nccl_csv_keeps_rules_for_both():
    try:
        programs.use_tuning_table(SPLIT)
        for size, in_place, expected in ((1 << 20, True, "shm"), (1 << 20, False, "shm"),
                                         (64 << 20, True, CMA), (64 << 20, False, "shm")):
            assert programs.choose(AG, 2, size, "auto", fast_path=True,
                                   in_place=in_place) == expected
        assert programs.choose(AR, 2, 4096, "auto", in_place=True) == "direct"
        assert programs.choices(AR, 2, 4096) == ("recursive_doubling", "direct")
        assert programs.choose(AR, 2, 4096, "auto", fast_path=True) == "shm"
        assert programs.choose(AR, 2, 4096, "auto") == "recursive_doubling"  # no fast path
        assert [programs.choices(AG, 2, size, fast_path=True)
                for size in (1 << 20, 64 << 20)] == [("shm", "shm"), ("shm", CMA)]
    finally:
        programs.use_tuning_table(None)
    csv = _table(_rule(0, 10, "ring"), _rule(11, 20, "ring", IN_PLACE),
                 _rule(11, TOP, "double_binary_tree", OUT_OF_PLACE)).to_nccl_csv()
    assert csv.splitlines()[1:] == ["allgather,0,10,ring,simple,-1,-1,2"]


def test_the_online_tuner_splits_rules_where_the_placements_winners_differ():
    winners = [(("shm", 1e-6), ("shm", 3e-6)), (("shm", 1e-3), (CMA, 5e-4)),
               (("shm", 2e-3), (CMA, 1e-3)), (("ring", 1e-2), ("ring", 3e-2))]
    rules = _rules(AG, 2, [16, 1024, 4096, 1 << 20], winners)
    assert [(r.min_bytes, r.max_bytes, r.algo, r.placement, r.time_us) for r in rules] == [
        (0, 16, "shm", "any", pytest.approx(2.0)),
        (17, 4096, "shm", OUT_OF_PLACE, pytest.approx(2000.0)),
        (17, 4096, CMA, IN_PLACE, pytest.approx(1000.0)),
        (4097, TOP, "ring", "any", pytest.approx(20000.0))]


def _follow(comm, text: str, count: int, mixed: bool):
    from commflow.runtime import cma

    table = from_json(text)
    if not cma.permitted(comm):  # single-copy reads refused here: another variant then
        table = _table(*(_rule(r.min_bytes, r.max_bytes, "shm:segment=2M", r.placement)
                         if r.algo == CMA else r for r in table.rules))
    programs.use_tuning_table(table)
    x = np.arange(count, dtype=np.float32) % 13 + comm.rank
    want = np.concatenate([np.arange(count, dtype=np.float32) % 13 + r for r in range(2)])
    buf = np.empty(2 * count, np.float32)
    block = buf[comm.rank * count:(comm.rank + 1) * count]
    block[...] = x
    try:
        if mixed:  # rank 0 in place, rank 1 out of place
            comm.allgather(block if comm.rank == 0 else x, out=buf)
        else:
            out = comm.allgather(x)
            comm.allgather(block, out=buf)
            assert (out == want).all() and (buf == want).all()
            y = np.arange(1024, dtype=np.float32) * (comm.rank + 1)
            small = comm.allreduce(y)  # 4 KiB: the compiled path
            comm.allreduce(y, out=y)  # the in-place rule's program
            assert (small == y).all() and (y == np.arange(1024) * 3).all()
    finally:
        programs.use_tuning_table(None)
    return [(e["op"], e["algorithm"]) for e in flight_entries(comm)][-4:]


def test_live_ranks_run_each_placements_rule():
    for ran in run_world(_follow, 2, SPLIT.to_json(), 8 << 20, False, timeout=60):
        variant = ran[1][1]
        assert ran == [("allgather", "shm"), ("allgather", variant), ("allreduce", "shm"),
                       ("allreduce", "direct")]
        assert variant in (CMA, "shm:segment=2M")
    # at 4 MiB one rule holds for both placements: ranks in different placements agree
    for ran in run_world(_follow, 2, SPLIT.to_json(), 512 << 10, True, timeout=60):
        assert ran[-1] == ("allgather", "shm")


def test_ranks_in_different_placements_under_split_rules_fail_with_a_mismatch():
    results = run_world(_follow, 2, SPLIT.to_json(), 8 << 20, True, timeout=60,
                        expect_failure=True)
    assert all(not ok for ok, _ in results)
    assert any(CommMismatchError.__name__ in text for _, text in results)
