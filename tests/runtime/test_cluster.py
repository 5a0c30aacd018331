"""Emulated hosts: ``commflow cluster up`` makes network namespaces with shaped links, ``commflow
run --hosts`` runs a job across them (shared memory inside a host, gloo between hosts), and
``commflow cluster down`` removes everything. Needs root, as CI runs; a machine where the
namespaces cannot be made fails here with the reason."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from commflow.errors import CommflowError
from commflow.runtime import cluster

CLI = [sys.executable, "-c", "from commflow.cli import main; main()"]

DOCS = Path(__file__).resolve().parents[2] / "docs" / "runtime.md"

TBF_BUCKET = 250_000
"""Bytes a 1 Gbit/s tbf of ``commflow cluster`` lets through at once (2 ms of traffic)."""


def docs_example() -> str:
    """The Python block of the "Multi-host" section of docs/runtime.md."""
    section = DOCS.read_text().split("## Multi-host", 1)[1]
    return re.search(r"```python\n(.*?)```", section, re.DOTALL)[1]


def _cli(command: str, check: bool = True) -> subprocess.CompletedProcess:
    """Run ``commflow`` with the words of ``command``."""
    done = subprocess.run(
        [*CLI, *command.split()], capture_output=True, text=True, timeout=180, check=False
    )
    if check:
        assert done.returncode == 0, f"commflow {command}: {done.stdout}{done.stderr}"
    return done


def _out(*argv: str) -> str:
    return subprocess.run(argv, capture_output=True, text=True, check=True).stdout


def test_two_hosts_up_run_the_docs_example_down(tmp_path):
    script = tmp_path / "hosts_allreduce.py"
    script.write_text(docs_example())
    try:
        _cli("cluster up --hosts 3 --bandwidth 200mbit")  # replaced by the next one
        up = _cli("cluster up --hosts 2 --ranks-per-host 2 --bandwidth 1gbit --delay 100us")
        assert "run:  commflow run --hosts h0:2,h1:2 COMMAND" in up.stdout
        names = {line.split()[0] for line in _out("ip", "netns", "list").splitlines()}
        assert {n for n in names if n.startswith("commflow-")} == {
            "commflow-h0",
            "commflow-h1",
            "commflow-sw",
        }
        for i in range(2):
            ns = f"commflow-h{i}"
            assert f"inet 198.18.0.{i + 1}/15" in _out("ip", "-n", ns, "addr", "show", "eth0")
            shaping = _out("tc", "-n", ns, "qdisc", "show", "dev", "eth0")
            assert re.search(r"qdisc tbf .* rate 1Gbit", shaping), shaping
        assert cluster.current() == cluster.ClusterSpec(
            hosts=2, ranks_per_host=2, bandwidth=125e6, delay=100e-6
        )
        probe = "from commflow.runtime.cluster import *; print(link_delay({'COMMFLOW_HOST': '1'}))"
        inside = _out("ip", "netns", "exec", "commflow-h1", sys.executable, "-c", probe)
        assert float(inside) == 100e-6  # the delay of the namespace this probe runs in

        run = _cli(f"run --hosts h0:2,h1:2 {script}")
        lines = re.findall(
            r"\[rank (\d)\] host (\d), local rank (\d) of (\d): (\w+) sum (\S+) "
            r"in (\d+) ms",
            run.stdout,
        )
        assert sorted(line[:6] for line in lines) == sorted(
            (str(r), str(r // 2), str(r % 2), "2", algo, "10")
            for r in range(4)
            for algo in ("hierarchical", "ring")
        ), run.stdout
        # bytes each host sends through its 1 Gbit/s link: 4 MiB (hierarchical), 6 MiB (ring)
        floor = {"hierarchical": (4 << 20) - TBF_BUCKET, "ring": (6 << 20) - TBF_BUCKET}
        for *_, algo, _, ms in lines:
            assert float(ms) * 1e-3 >= 0.9 * floor[algo] / 125e6, (algo, ms)
    finally:
        down = _cli("cluster down")
    assert "removed commflow-h0, commflow-h1, commflow-sw" in down.stdout
    assert not [n for n in _out("ip", "netns", "list").split() if n.startswith("commflow-")]
    assert cluster.current() is None
    assert "no cluster to remove" in _cli("cluster down").stdout


def test_cluster_spec_addresses_and_run_hosts():
    spec = cluster.ClusterSpec(hosts=3, ranks_per_host=2, bandwidth=125e6)
    assert [spec.address(i) for i in range(3)] == ["198.18.0.1", "198.18.0.2", "198.18.0.3"]
    assert cluster.ClusterSpec(hosts=250, bandwidth=1e6).address(249) == "198.18.0.250"
    assert spec.namespace(2) == "commflow-h2" and spec.hosts_arg() == "h0:2,h1:2,h2:2"


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"hosts": 0}, "needs 1 to 250 hosts"),
        ({"hosts": 251}, "needs 1 to 250 hosts"),
        ({"ranks_per_host": 0}, "ranks per host must be >= 1"),
        ({"bandwidth": 100.0}, "at least 1 kbit/s"),
        ({"bandwidth": float("inf")}, "at least 1 kbit/s and finite"),
        ({"delay": 2.0}, "delay must be 0 to 1 s"),
    ],
)
def test_bad_cluster_specs_are_refused(fields, message):
    with pytest.raises(CommflowError, match=message):
        cluster.ClusterSpec(**{"hosts": 2, "bandwidth": 125e6, **fields})


def test_not_root_or_no_iproute2_is_a_clear_error(monkeypatch):
    spec = cluster.ClusterSpec(hosts=2, bandwidth=125e6)
    monkeypatch.setattr(cluster.os, "geteuid", lambda: 1000)
    with pytest.raises(CommflowError, match="cluster up needs root .* run it with sudo"):
        cluster.up(spec)
    monkeypatch.setattr(cluster.os, "geteuid", lambda: 0)
    monkeypatch.setattr(cluster.shutil, "which", lambda tool: None)
    with pytest.raises(CommflowError, match="cluster down needs ip and tc from iproute2"):
        cluster.down()


def test_bad_bandwidth_on_the_command_line_exits_2():
    done = _cli("cluster up --bandwidth fast", check=False)
    assert done.returncode == 2 and "cannot parse bandwidth 'fast'" in done.stderr
