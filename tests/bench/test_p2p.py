"""OSU-style point-to-point benchmarks on two ranks of the shared-memory runtime."""

from __future__ import annotations

import json

import pytest

from commflow.bench.p2p import LARGE, P2PSpec, run_p2p
from commflow.cli import main
from commflow.errors import CommflowError


def test_latency_is_positive_for_every_size():
    sizes = (1, 64, 4096)
    rows = run_p2p(P2PSpec(kind="latency", sizes=sizes, iters=30, warmup=3))
    assert [r.size for r in rows] == list(sizes)
    assert all(0 < r.value < 0.1 for r in rows)  # seconds per one-way message


@pytest.mark.parametrize("kind", ["bw", "bibw"])
def test_bandwidth_grows_with_the_message_size(kind):
    sizes = (64, 4096, 1 << 20)
    rows = run_p2p(P2PSpec(kind=kind, sizes=sizes, iters=10, warmup=1, window=8))
    values = [r.value for r in rows]
    assert all(v > 0 for v in values)
    # per-message costs dominate small messages: 16384 times the bytes must move far faster
    assert values[2] > 20 * values[0] and values[1] > 2 * values[0]


def test_large_messages_run_a_tenth_of_the_iterations():
    spec = P2PSpec(iters=1000, warmup=100)
    assert spec.rounds(LARGE) == (100, 1000)
    assert spec.rounds(LARGE + 1) == (10, 100)
    assert P2PSpec(iters=5, warmup=5).rounds(1 << 20) == (0, 1)


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"kind": "put"}, "unknown p2p benchmark 'put'"),
        ({"sizes": (0,)}, "message sizes must be positive"),
        ({"window": 0}, "window >= 1"),
    ],
)
def test_bad_specs_are_refused(fields, message):
    with pytest.raises(CommflowError, match=message):
        P2PSpec(**fields)


def _cli(capsys, *args: str) -> tuple[int, str]:
    capsys.readouterr()
    with pytest.raises(SystemExit) as done:
        main(["p2p", *args])
    return done.value.code, capsys.readouterr().out


def test_cli_prints_osu_tables_and_json(capsys):
    code, out = _cli(capsys, "latency", "-m", "1:4", "-i", "20", "-x", "2")
    assert code == 0
    lines = out.splitlines()
    assert lines[0].startswith("# OSU-style latency test")
    assert lines[1].split() == ["#", "Size", "Latency", "(us)"]
    rows = [line.split() for line in lines[2:]]
    assert [row[0] for row in rows] == ["1", "2", "4"] and all(float(r[1]) > 0 for r in rows)
    code, out = _cli(capsys, "bw", "-m", "1K", "-i", "3", "-x", "1", "-W", "4", "--json")
    records = json.loads(out)
    assert [r["size"] for r in records] == [1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024]
    assert all(r["bandwidth_mbs"] > 0 for r in records)
