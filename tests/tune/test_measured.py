"""tune.versus_fixed: auto against the fastest fixed algorithm per size and over a sweep."""

import pytest

from commflow.tune import versus_fixed

ROWS = [("auto", 8, 2.0), ("ring", 8, 3.0), ("shm", 8, 1.9),
        ("auto", 64, 5.0), ("ring", 64, 5.5), ("shm", 64, 6.0),
        ("auto", 512, 9.0), ("ring", 512, 9.0)]  # shm missing at 512: size left out


def test_per_size_and_sweep():
    versus = versus_fixed(ROWS)
    assert [(v.size, v.best) for v in versus.sizes] == [(8, "shm"), (64, "ring")]
    assert versus.worst().size == 8 and versus.worst().ratio == pytest.approx(2.0 / 1.9)
    assert versus.totals == {"auto": 7.0, "ring": 8.5, "shm": 7.9}
    assert versus.beats_every_fixed()
    assert versus.within(0.06) and not versus.within(0.05)


def test_auto_slower_over_the_sweep():
    versus = versus_fixed([("auto", 8, 2.0), ("ring", 8, 1.0), ("auto", 16, 1.0),
                           ("ring", 16, 1.5)])
    assert not versus.beats_every_fixed()


def test_needs_auto_and_a_fixed_one():
    with pytest.raises(ValueError, match="auto"):
        versus_fixed([("ring", 8, 1.0)])


def _records(times: dict[str, list[float]]) -> list[dict]:
    return [{"impl": "commflow", "collective": "allgather", "nranks": 2, "algo": algo,
             "size": size, "time_us": t, "inplace": inplace}
            for algo, row in times.items() for size, t in zip((16, 64), row, strict=True)
            for inplace in (False, True)]


def _script():
    import importlib.util
    from pathlib import Path

    script = Path(__file__).resolve().parents[2] / "benchmarks" / "auto_vs_fixed.py"
    spec = importlib.util.spec_from_file_location("auto_vs_fixed", script)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_benchmark_table_judges_the_median_of_repeated_runs(tmp_path, capsys):
    import json

    module = _script()
    runs = [{"auto": [1.0, 2.0], "shm": [1.2, 2.0], "ring": [3.0, 3.0]},
            {"auto": [9.0, 2.0], "shm": [1.0, 2.2], "ring": [3.0, 3.0]},  # a stall at 16
            {"auto": [1.0, 2.0], "shm": [1.1, 2.1], "ring": [3.0, 3.0]}]
    paths = []
    for i, times in enumerate(runs):
        paths.append(tmp_path / f"r{i}.json")
        paths[-1].write_text(json.dumps(_records(times)))
    module.main([str(p) for p in paths])
    rows = capsys.readouterr().out.splitlines()[2:]
    # medians: auto 1.0 / 2.0, shm 1.1 / 2.1: within 5% at both sizes, sweep 3.0 / 3.2; mean
    # of size / time: auto (16 + 32) / 2 = 24 against shm (14.55 + 30.48) / 2 = 22.51
    assert rows[0] == ("| allgather | 2 | out-of-place | 2 / 2 (runs: 2, 1, 2) | 0.95 (64, shm) "
                       "| 0.94 (shm) | 0.94 (runs: 0.94, 3.44, 0.94) "
                       "| 1.07 (runs: 1.06, 0.75, 1.07) |")
    # nccl-tests' summary pools both placements (the same times here): the same ratios
    assert _table(rows, 1)[0] == "| allgather | 2 | 1.07 (shm) (runs: 1.06, 0.75, 1.07) |"


def test_the_avg_bus_bandwidth_pools_both_placements(tmp_path, capsys):
    import json

    module = _script()
    records = _records({"auto": [1.0, 2.0], "shm": [1.0, 2.0], "ring": [4.0, 4.0]})
    for r in records:  # shm 2x as fast as auto in place at 64, auto 2x as fast out of place
        if r["size"] == 64:
            r["time_us"] = {("auto", False): 1.0, ("shm", False): 2.0,
                            ("auto", True): 2.0, ("shm", True): 1.0}.get(
                (r["algo"], r["inplace"]), r["time_us"])
    path = tmp_path / "r.json"
    path.write_text(json.dumps(records))
    module.main([str(path)])
    rows = capsys.readouterr().out.splitlines()
    # out of place: auto (16 + 64) / 2 = 40 against shm (16 + 32) / 2 = 24; in place the
    # reverse; pooled: auto (16 + 64 + 16 + 32) / 4 = 32 = shm's, ring's 10
    assert rows[2].endswith("| 1.67 |") and rows[3].endswith("| 0.60 |")
    assert _table(rows, 1) == ["| allgather | 2 | 1.00 (shm) |"]
    # the fastest program over shm, out of place: ring 4 us against 1 at 16 B, 2 at 64 B
    assert _table(rows, 2) == ["| allgather | 2 | 4.00 | 2.00 |"]


def _table(lines: list[str], which: int) -> list[str]:
    """The rows (below header and rule) of the ``which``-th table of the script's output."""
    tables = "\n".join(lines).split("\n\n")
    return tables[which].splitlines()[2:]
