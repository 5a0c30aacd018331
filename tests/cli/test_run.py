"""``commflow run`` as torchrun: -m runs a module, OMP_NUM_THREADS=1 unless set, and the
default rank count is the CPUs this process may use."""

from __future__ import annotations

import os
import sys

import pytest

from commflow.cli import main
from commflow.runtime.launcher import rank_specs
from commflow.runtime.world import usable_cpus

MODULE = "import os, sys; print(os.environ['RANK'], os.environ['OMP_NUM_THREADS'], sys.argv[1:])"


@pytest.fixture
def module(tmp_path, monkeypatch):
    """A module ``cf_hello`` on the ranks' PYTHONPATH that prints rank, threads and args."""
    (tmp_path / "cf_hello.py").write_text(MODULE + "\n")
    monkeypatch.setenv("PYTHONPATH", str(tmp_path))
    return "cf_hello"


def _run(capfd, *args: str) -> tuple[int, list[str]]:
    capfd.readouterr()
    with pytest.raises(SystemExit) as done:
        main(["run", *args])
    return done.value.code, sorted(capfd.readouterr().out.splitlines())


def test_dash_m_runs_a_module_with_its_arguments(capfd, module, monkeypatch):
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    code, lines = _run(capfd, "-n", "2", "-m", module, "--lr", "1")
    assert code == 0
    assert lines == ["[rank 0] 0 1 ['--lr', '1']", "[rank 1] 1 1 ['--lr', '1']"]


def test_omp_num_threads_is_kept_when_set(capfd, module, monkeypatch):
    monkeypatch.setenv("OMP_NUM_THREADS", "3")
    code, lines = _run(capfd, "-n", "1", "-m", module)
    assert (code, lines) == (0, ["[rank 0] 0 3 []"])


def test_default_rank_count_is_the_affinity_not_the_core_count(capfd, module, monkeypatch):
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0, 5, 7})
    monkeypatch.setattr(os, "cpu_count", lambda: 64)
    assert usable_cpus() == 3
    code, lines = _run(capfd, "-m", module)
    assert code == 0 and [line.split()[2] for line in lines] == ["0", "1", "2"]


def test_module_rank_specs_run_python_dash_m():
    specs = rank_specs(["pkg.train", "x.py"], 1, job="j", master_addr="a", master_port=1,
                       module=True)
    assert specs[0].argv == (sys.executable, "-m", "pkg.train", "x.py")


def test_torchrun_spellings_start_the_same_job(capfd, module, monkeypatch):
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    code, lines = _run(capfd, "--standalone", "--nproc_per_node", "2", "-m", module, "--a_b")
    assert code == 0
    assert lines == ["[rank 0] 0 1 ['--a_b']", "[rank 1] 1 1 ['--a_b']"]  # its args untouched
    code, lines = _run(capfd, "--nproc-per-node", "1", "-m", module)
    assert (code, lines) == (0, ["[rank 0] 0 1 []"])


def test_standalone_refuses_several_nodes(capfd):
    with pytest.raises(SystemExit) as done:
        main(["run", "--standalone", "--nnodes", "2", "x.py"])
    assert done.value.code == 2
    assert "--standalone is a one-node job" in capfd.readouterr().err
