"""Emulated hosts: ``commflow cluster up`` makes network namespaces with shaped links, ``commflow
run --hosts`` runs a job across them (shared memory inside a host, gloo between hosts), and
``commflow cluster down`` removes everything. Needs root, as CI runs; a machine where the
namespaces cannot be made fails here with the reason."""

from __future__ import annotations

import re
import subprocess
import sys
import textwrap

import pytest

from commflow.errors import CommflowError
from commflow.runtime import cluster

CLI = [sys.executable, "-c", "from commflow.cli import main; main()"]

JOB = """
import os
import time

import numpy as np

import commflow.runtime
from commflow.runtime.cluster import link_delay

comm = commflow.runtime.init(timeout=60)
x = np.arange(1000, dtype=np.int64) * (comm.rank + 1)
for algo in ("hierarchical", "ring"):
    assert np.array_equal(comm.allreduce(x, algo=algo), np.arange(1000) * 10), algo
big = np.zeros(8 << 20, np.uint8)
comm.barrier()
start = time.perf_counter()
if comm.rank == 0:
    comm.send(big, 2)
    comm.recv(big[:1], 2)
elif comm.rank == 2:
    comm.recv(big, 0)
    comm.send(big[:1], 0)
seconds = time.perf_counter() - start
print(f"host {os.environ['COMMFLOW_HOST']} local {comm.local_rank}/{comm.local_size} "
      f"{type(comm.transport).__name__} delay {link_delay(os.environ) * 1e6:.0f}us "
      f"8MiB {seconds:.3f}s", flush=True)
"""


def _cli(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    done = subprocess.run([*CLI, *args], capture_output=True, text=True, timeout=180, check=False)
    if check:
        assert done.returncode == 0, f"commflow {' '.join(args)}: {done.stdout}{done.stderr}"
    return done


def _ip(*args: str) -> str:
    return subprocess.run(["ip", *args], capture_output=True, text=True, check=True).stdout


def test_two_hosts_up_run_allreduce_down(tmp_path):
    script = tmp_path / "job.py"
    script.write_text(textwrap.dedent(JOB))
    try:
        _cli("cluster", "up", "--hosts", "3", "--bandwidth", "200mbit")  # replaced below
        up = _cli(
            "cluster",
            "up",
            "--hosts",
            "2",
            "--ranks-per-host",
            "2",
            "--bandwidth",
            "1gbit",
            "--delay",
            "100us",
        )
        assert "run:  commflow run --hosts h0:2,h1:2 COMMAND" in up.stdout
        names = sorted(line.split()[0] for line in _ip("netns", "list").splitlines())
        assert [n for n in names if n.startswith("commflow-")] == [
            "commflow-h0",
            "commflow-h1",
            "commflow-sw",
        ]
        for i in range(2):
            assert f"inet 198.18.0.{i + 1}/15" in _ip(
                "-n", f"commflow-h{i}", "addr", "show", "eth0"
            )
            shaping = subprocess.run(
                ["tc", "-n", f"commflow-h{i}", "qdisc", "show", "dev", "eth0"],
                capture_output=True,
                text=True,
                check=True,
            )
            assert re.search(r"qdisc tbf .* rate 1Gbit", shaping.stdout), shaping.stdout
        assert cluster.current() == cluster.ClusterSpec(
            hosts=2, ranks_per_host=2, bandwidth=125e6, delay=100e-6
        )

        run = _cli("run", "--hosts", "h0:2,h1:2", str(script))
        lines = sorted(
            re.findall(
                r"\[rank (\d)\] host (\d) local (\d)/(\d) (\w+) delay (\d+)us "
                r"8MiB ([\d.]+)s",
                run.stdout,
            )
        )
        assert [line[:6] for line in lines] == [
            ("0", "0", "0", "2", "RoutedTransport", "100"),
            ("1", "0", "1", "2", "RoutedTransport", "100"),
            ("2", "1", "0", "2", "RoutedTransport", "100"),
            ("3", "1", "1", "2", "RoutedTransport", "100"),
        ], run.stdout
        # 8 MiB through a 1 Gbit/s link (tbf lets its 250 kB bucket through at once)
        assert float(lines[0][6]) >= ((8 << 20) - 250_000) / 125e6, lines
    finally:
        down = _cli("cluster", "down")
    assert "removed commflow-h0, commflow-h1, commflow-sw" in down.stdout
    assert not [n for n in _ip("netns", "list").split() if n.startswith("commflow-")]
    assert cluster.current() is None
    assert "no cluster to remove" in _cli("cluster", "down").stdout


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
    done = _cli("cluster", "up", "--bandwidth", "fast", check=False)
    assert done.returncode == 2 and "cannot parse bandwidth 'fast'" in done.stderr
