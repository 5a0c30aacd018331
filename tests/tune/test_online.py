"""Online tuning on a live 2-rank world: every rank gets the same table, its rules are the
measured winners, and ``auto`` follows a loaded table."""

from __future__ import annotations

import json

import pytest

from commflow.collectives import Collective
from commflow.errors import CommflowError
from commflow.runtime import programs
from commflow.tuning_table import Rule, TuningTable, from_json
from tests.runtime.harness import flight_entries, run_world

SIZES = [1024, 1 << 20]


def _tune(comm):
    from commflow.tune import tune_live
    from commflow.tune.online import candidates, halve

    table = tune_live(comm, SIZES, collectives=["allreduce", "allgather"], budget=20.0)
    names = candidates(comm, Collective.ALLREDUCE)
    best, seconds = halve(comm, Collective.ALLREDUCE, 4096, names[:2], iters=1)
    with pytest.raises(CommflowError, match="increasing sizes"):
        tune_live(comm, [4096, 1024])
    # an incumbent stays unless the winner beats it by the margin (here: 100%, never)
    never = lambda name: 1.0  # noqa: E731
    kept = [halve(comm, Collective.ALLREDUCE, 4096, ["shm", "ring"], incumbent=name,
                  margin=never)[0] for name in ("shm", "ring")]
    kept.append(halve(comm, Collective.REDUCESCATTER, 4096, ["ring", "shm"], incumbent="ring",
                      margin=never)[0])  # in place too: the output is this rank's block
    return table.to_json(), names, (best, seconds), kept


def test_every_rank_gets_the_same_table_of_measured_winners():
    results = run_world(_tune, 2, timeout=120.0)
    texts = {text for text, _, _, _ in results}
    assert len(texts) == 1
    table = from_json(texts.pop())
    assert table.model == "live" and table.fingerprint.startswith("live:2ranks")
    names = results[0][1]
    assert "ring" in names and "ina" not in names
    for coll in (Collective.ALLREDUCE, Collective.ALLGATHER):
        rules = [r for r in table.rules if r.collective is coll]
        assert rules[0].min_bytes == 0 and rules[-1].max_bytes == 2**63 - 1
        assert all(r.algo in names for r in rules)
        for size in SIZES:
            assert table.lookup(coll, 2, size) in names
    best, seconds = results[0][2]
    assert best in names[:2] and seconds > 0
    assert {r[2] for r in results} == {(best, seconds)}
    assert all(r[3] == ["shm", "ring", "ring"] for r in results)
    json.loads(table.to_json())


def test_auto_follows_a_loaded_table():
    table = TuningTable(fingerprint="live:2ranks:2perhost", topology="t", model="live", rules=(
        Rule(collective=Collective.ALLREDUCE, nranks=2, min_bytes=0, max_bytes=4096,
             algo="direct", time_us=1.0),
        Rule(collective=Collective.ALLREDUCE, nranks=2, min_bytes=4097,
             max_bytes=2**63 - 1, algo="shm", time_us=1.0),
    ))
    try:
        programs.use_tuning_table(table)
        assert programs.choose(Collective.ALLREDUCE, 2, 100, "auto") == "direct"
        assert programs.choose(Collective.ALLREDUCE, 2, 100, "ring") == "ring"
        # a fast-path rule only where the fast path applies
        assert programs.choose(Collective.ALLREDUCE, 2, 1 << 20, "auto",
                               fast_path=True) == "shm"
        assert programs.choose(Collective.ALLREDUCE, 2, 1 << 20, "auto") == "ring"
        # no rule for 4 ranks: the built-in choice
        assert programs.choose(Collective.ALLREDUCE, 4, 100, "auto") == "recursive_doubling"
    finally:
        programs.use_tuning_table(None)
    assert programs.choose(Collective.ALLREDUCE, 2, 100, "auto") == "recursive_doubling"


def _follow(comm, path):
    import numpy as np

    programs.use_tuning_table(path)
    out = comm.allreduce(np.arange(10, dtype=np.float32))
    return out.tolist(), programs.choose(Collective.ALLREDUCE, comm.size, 40, "auto")


def test_ranks_run_the_tabled_algorithm(tmp_path):
    path = tmp_path / "table.json"
    TuningTable(fingerprint="live:2ranks:2perhost", topology="t", model="live", rules=(
        Rule(collective=Collective.ALLREDUCE, nranks=2, min_bytes=0, max_bytes=2**63 - 1,
             algo="direct", time_us=1.0),)).save(path)
    for out, chosen in run_world(_follow, 2, str(path)):
        assert out == [2.0 * i for i in range(10)]
        assert chosen == "direct"



def _variant_rule(comm, path):
    import numpy as np

    from commflow.tune.online import candidates, distinct

    programs.use_tuning_table(path)
    x = np.arange(1 << 18, dtype=np.float32) % 7 * (comm.rank + 1)  # 1 MiB
    # rank 0 follows the table; rank 1 names the variant: one call, so the same signature
    got = comm.allreduce(x, algo="auto" if comm.rank == 0 else "shm:segment=256K")
    # 1 KiB: the variant cuts it as shm does, so auto takes the compiled path, as shm
    comm.allreduce(x[:256])
    comm.allgather(x)  # no rule for allgather: the built-in choice
    names = candidates(comm, Collective.ALLREDUCE)
    return (got.tolist() == (x / (comm.rank + 1) * 3).tolist(), names,
            distinct(names, Collective.ALLREDUCE, 1024, comm.size),
            [e["algorithm"] for e in flight_entries(comm)])


def test_auto_runs_the_fast_path_variant_a_table_names(tmp_path):
    path = tmp_path / "table.json"
    TuningTable(fingerprint="live:2ranks:2perhost", topology="t", model="live", rules=(
        Rule(collective=Collective.ALLREDUCE, nranks=2, min_bytes=0, max_bytes=2**63 - 1,
             algo="shm:segment=256K", time_us=1.0),)).save(path)
    assert from_json(path.read_text()).lookup("allreduce", 2, 1 << 20) == "shm:segment=256K"
    for exact, names, small, ran in run_world(_variant_rule, 2, str(path)):
        assert exact
        # then candidates() asks every rank whether it may read the others (barrier, allreduce)
        assert ran == ["shm:segment=256K", "shm", "shm", "shm", "shm"]
        assert names[0] == "shm" and "shm:segment=1M" in names and "ring" in names
        # at 1 KiB every variant is one-shot as shm is: timed once
        assert [n for n in small if n.startswith("shm")] == ["shm"]
    try:
        programs.use_tuning_table(path)
        assert programs.choose(Collective.ALLREDUCE, 2, 1 << 20, "auto",
                               fast_path=True) == "shm:segment=256K"
        assert programs.choose(Collective.ALLREDUCE, 2, 1 << 20, "auto") == "ring"
        assert programs.choose(Collective.ALLREDUCE, 2, 1 << 20, "shm") == "shm"
    finally:
        programs.use_tuning_table(None)


def test_a_table_naming_a_malformed_variant_is_refused(tmp_path):
    path = tmp_path / "table.json"
    TuningTable(fingerprint="f", topology="t", model="live", rules=(
        Rule(collective=Collective.ALLREDUCE, nranks=2, min_bytes=0, max_bytes=10,
             algo="shm:segments=1M", time_us=1.0),)).save(path)
    with pytest.raises(CommflowError, match="segments=1M"):
        programs.use_tuning_table(path)
    programs.use_tuning_table(None)
