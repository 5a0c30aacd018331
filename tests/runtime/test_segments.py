"""Shared-memory segment names: a random token (unguessable names, so another user cannot
squat them), owner-only attach, and no segment left when the launcher is killed during init."""

from __future__ import annotations

import os
import re
import signal
import stat
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch.distributed as dist

from commflow.errors import CommflowError
from commflow.runtime import token
from commflow.runtime.shm import SharedRegion
from commflow.runtime.token import TOKEN_ENV, shm_token

from .harness import run_world
from .test_engine import place  # noqa: F401  (the fixture)

CLI = [sys.executable, "-c", "from commflow.cli import main; main()", "run"]
SHM = Path("/dev/shm")

NAME_SCRIPT = """
import commflow, numpy as np
comm = commflow.init(timeout=30)
print(comm.transport.host.region.name, comm.allreduce(np.ones(2)).tolist(), flush=True)
"""


def test_launched_jobs_name_segments_with_a_token_so_a_squatted_name_is_harmless(tmp_path):
    job = f"squat-{os.getpid()}"
    squatted = SHM / f"commflow.{job}.host0"  # the name a job id alone would give
    fd = os.open(squatted, os.O_CREAT | os.O_EXCL | os.O_RDWR, 0o644)
    os.close(fd)
    try:
        path = tmp_path / "name.py"
        path.write_text(NAME_SCRIPT)
        done = subprocess.run([*CLI, "-n", "2", "--job", job, str(path)], capture_output=True,
                              text=True, timeout=120, check=False)
    finally:
        squatted.unlink(missing_ok=True)
    assert done.returncode == 0, done.stderr
    names = set(re.findall(rf"\] (commflow\.{job}\.host0\.[0-9a-f]{{16}}) \[2\.0, 2\.0\]",
                           done.stdout))
    assert len(names) == 1, done.stdout  # both ranks, one segment, named with a token


def _segment(comm):
    return comm.transport.shm.host.region.name


def test_ranks_across_hosts_agree_on_a_token_through_the_engine(place):  # noqa: F811
    place([0, 0, 1, 1])
    names = run_world(_segment, 4, timeout=60)
    assert names[0] == names[1] and names[2] == names[3], names
    assert re.fullmatch(r"commflow\.t[0-9a-f]{12}\.host0\.[0-9a-f]{16}", names[0]), names
    assert names[2] == names[0].replace(".host0.", ".host1."), names


def test_ranks_agree_on_a_token_through_a_torch_store(monkeypatch):
    store = dist.HashStore()

    def as_rank(rank: int, job: str, rounds: dict) -> str:  # each rank counts its own inits
        monkeypatch.setattr(token, "_ROUNDS", rounds)
        return shm_token(rank=rank, job=job, env={}, source="torchrun", timeout=5, store=store)

    counts: list[dict] = [{}, {}]
    first = as_rank(0, "j", counts[0])
    assert re.fullmatch(r"[0-9a-f]{16}", first) and as_rank(1, "j", counts[1]) == first
    again = as_rank(0, "j", counts[0])  # a second world of the same job: a new token
    assert again != first and as_rank(1, "j", counts[1]) == again


def test_tokens_from_the_environment_are_checked_and_explicit_worlds_have_none():
    assert shm_token(rank=1, job="j", env={TOKEN_ENV: "0123456789abcdef"}, source="commflow",
                     timeout=5) == "0123456789abcdef"
    with pytest.raises(CommflowError, match="not 16 hex digits"):
        shm_token(rank=0, job="j", env={TOKEN_ENV: "../../etc"}, source="commflow", timeout=5)
    assert shm_token(rank=0, job="j", env={}, source="explicit", timeout=5) == ""


def test_attach_refuses_a_segment_that_is_not_owner_only():
    path = SHM / f"commflow.perm-{os.getpid()}.host0"
    fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_RDWR, 0o600)
    try:
        os.ftruncate(fd, 4096)
        os.fchmod(fd, stat.S_IRUSR | stat.S_IWUSR | stat.S_IRGRP)
        with pytest.raises(CommflowError, match="not owner-only for this user; refusing"):
            SharedRegion.attach(path.name, 4096, timeout=1)
    finally:
        os.close(fd)
        path.unlink()


INIT_WINDOW_SCRIPT = """
import os, time
print(f"job {os.environ['COMMFLOW_JOB']}", flush=True)
if os.environ["COMMFLOW_RANK"] == "1":
    time.sleep(60)  # rank 0 waits in init, its segment created and not yet unlinked
import commflow.runtime
commflow.runtime.init(timeout=60)
"""


def test_a_launcher_killed_during_init_leaves_no_shared_memory(tmp_path):
    path = tmp_path / "init.py"
    path.write_text(INIT_WINDOW_SCRIPT)
    proc = subprocess.Popen([*CLI, "-n", "2", str(path)], stdout=subprocess.PIPE,
                            stderr=subprocess.DEVNULL, text=True)
    try:
        job = re.search(r"job (\S+)", proc.stdout.readline())[1]
        deadline = time.monotonic() + 30
        while not list(SHM.glob(f"commflow.{job}.*")):
            assert time.monotonic() < deadline, "rank 0 never created its shared memory"
            time.sleep(0.02)
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=10)
    finally:
        proc.kill()
    deadline = time.monotonic() + 15
    while list(SHM.glob(f"commflow.{job}.*")) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not list(SHM.glob(f"commflow.{job}.*"))
