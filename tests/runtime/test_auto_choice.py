"""What ``auto`` runs, call by call, on 2 live ranks: remembered per call shape and tuning
table (a call that changes dtype, size, placement or table gets its own choice), and an
allreduce whose output is another view of its input's memory counts as in place."""

from __future__ import annotations

import json

import numpy as np

from commflow.collectives import Collective
from commflow.runtime import programs
from commflow.tuning_table import IN_PLACE, OUT_OF_PLACE, Rule, TuningTable
from tests.runtime.harness import flight_entries, run_world

TOP = 2**63 - 1
AG, AR, RS = Collective.ALLGATHER, Collective.ALLREDUCE, Collective.REDUCESCATTER


def _rule(coll: Collective, lo: int, hi: int, algo: str, placement: str = "any") -> Rule:
    return Rule(collective=coll, nranks=2, min_bytes=lo, max_bytes=hi, algo=algo, time_us=1.0,
                placement=placement)


def _table(*rules: Rule) -> TuningTable:
    return TuningTable(fingerprint="live:2ranks:2perhost", topology="t", model="live",
                       rules=rules)


BY_SIZE = _table(_rule(AG, 0, 4096, "shm"),
                 _rule(AG, 4097, TOP, "ring", IN_PLACE),
                 _rule(AG, 4097, TOP, "recursive_doubling", OUT_OF_PLACE),
                 _rule(RS, 0, TOP, "ring", IN_PLACE), _rule(RS, 0, TOP, "shm", OUT_OF_PLACE))
ALL_RING = _table(_rule(AG, 0, TOP, "ring"))
VIEWS = _table(_rule(AR, 0, TOP, "ring", IN_PLACE), _rule(AR, 0, TOP, "shm", OUT_OF_PLACE))


def _record(comm) -> list[str]:
    return [e["algorithm"] for e in flight_entries(comm)]


def _allgather(comm, count: int, dtype, placed: bool) -> None:
    x = (np.arange(count) % 7 + comm.rank).astype(dtype)
    want = np.concatenate([(np.arange(count) % 7 + r).astype(dtype) for r in range(2)])
    buf = np.zeros(2 * count, dtype)
    if placed:
        buf[comm.rank * count:(comm.rank + 1) * count] = x
        x = buf[comm.rank * count:(comm.rank + 1) * count]
    assert (comm.allgather(x, out=buf) == want).all()


def _calls(comm) -> list[str]:
    """Calls whose shapes, placements and tables change between them; each result exact."""
    seen = len(_record(comm))
    try:
        programs.use_tuning_table(BY_SIZE)
        for count, dtype in ((512, np.float32), (512, np.float64), (256, np.float64),
                             (512, np.float32)):  # 4 KiB, 8 KiB, 4 KiB, 4 KiB in all
            for placed in (False, True, False):
                _allgather(comm, count, dtype, placed)
        x = np.arange(8, dtype=np.int64) * (comm.rank + 1)
        want = np.arange(8, dtype=np.int64)[comm.rank * 4:(comm.rank + 1) * 4] * 3
        assert (comm.reduce_scatter(x) == want).all()
        assert (comm.reduce_scatter(x, out=x[comm.rank * 4:(comm.rank + 1) * 4]) == want).all()
        programs.use_tuning_table(ALL_RING)
        _allgather(comm, 512, np.float32, False)
        programs.use_tuning_table(None)
        _allgather(comm, 512, np.float32, False)
        _allgather(comm, 512, np.float32, True)
    finally:
        programs.use_tuning_table(None)
    return _record(comm)[seen:]


def test_auto_chooses_anew_when_the_dtype_size_placement_or_table_changes():
    rd, ring = "recursive_doubling", "ring"
    for ran in run_world(_calls, 2, timeout=60):
        assert ran == ["shm"] * 3 + [rd, ring, rd] + ["shm"] * 6 + ["shm", ring, ring] \
            + ["shm", "shm"]


def _views(comm) -> tuple[list[str], list[bool]]:
    """Allreduces under :data:`VIEWS` whose output is ``x``, another view of ``x``'s memory,
    a new array, or a view that overlaps ``x`` at another address."""
    seen = len(_record(comm))
    programs.use_tuning_table(VIEWS)
    exact = []
    try:
        for out in ("same", "view", "reshaped", "new", "shifted"):
            base = np.arange(1025, dtype=np.float32) * (comm.rank + 1)
            x = base[:1024]
            want = np.arange(1024, dtype=np.float32) * 3
            y = {"same": x, "view": x.view(), "reshaped": x.reshape(32, 32).reshape(-1),
                 "new": np.empty_like(x), "shifted": base[1:]}[out]
            exact.append(bool((comm.allreduce(x, out=y) == want).all()))
    finally:
        programs.use_tuning_table(None)
    return _record(comm)[seen:], exact


def test_an_allreduce_into_another_view_of_its_input_is_in_place():
    for ran, exact in run_world(_views, 2, timeout=60):
        assert ran == ["ring", "ring", "ring", "shm", "shm"]
        assert exact == [True] * 5


def test_the_auto_against_shm_command_of_the_benchmarks_page(capsys, tmp_path, monkeypatch):
    # docs/benchmarks.md: COMMFLOW_TUNING_TABLE=live2.json commflow bench allgather -n 2
    # --algo auto,shm --vs none -b 16 -e 256K -f 4 --iters 400 (here shorter)
    from tests.bench.cli_runner import run_bench

    table = tmp_path / "live2.json"
    table.write_text(BY_SIZE.to_json())
    monkeypatch.setenv(programs.TABLE_ENV, str(table))
    path = tmp_path / "ab.json"
    code, out, _ = run_bench(capsys, "allgather", "-n", "2", "--algo", "auto,shm", "--vs",
                             "none", "-b", "16", "-e", "256", "-f", "4", "--iters", "3",
                             "--json-out", str(path))
    assert code == 0, out
    records = json.loads(path.read_text())
    assert {(r["algo"], r["size"], r["inplace"]) for r in records} == {
        (algo, size, placed) for algo in ("auto", "shm") for size in (16, 64, 256)
        for placed in (False, True)}
    assert all(r["wrong"] == 0 and r["time_us"] > 0 for r in records)
