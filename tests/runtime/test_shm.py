"""Shared-memory segments: a too-small /dev/shm is a clear error, not a SIGBUS."""

from __future__ import annotations

import subprocess

import pytest

from commflow.errors import CommflowError
from commflow.runtime import shm


@pytest.fixture
def small_tmpfs(tmp_path, monkeypatch):
    """An 8 MiB tmpfs (needs root, like the emulated-host tests) in place of /dev/shm."""
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=8m", "tmpfs", str(tmp_path)],
                   check=True)
    monkeypatch.setattr(shm, "SHM_DIR", tmp_path)
    try:
        yield tmp_path
    finally:
        subprocess.run(["umount", "--lazy", str(tmp_path)], check=True)


def test_segment_larger_than_free_shm_is_refused_clearly(small_tmpfs):
    with pytest.raises(CommflowError, match=r"need 32\.0 MiB, have 8\.0 MiB free"):
        shm.SharedRegion.create("commflow.t.host0", 32 << 20)
    assert not list(small_tmpfs.iterdir())
    region = shm.SharedRegion.create("commflow.t.host1", 4 << 20)
    region.array("u1", 0, 4 << 20)[:] = 7  # every page is backed: no SIGBUS
    assert int(region.array("u1", 0, 4 << 20).sum()) == 7 * (4 << 20)
    region.unlink()
