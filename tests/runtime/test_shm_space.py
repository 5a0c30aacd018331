"""A /dev/shm too small for the job is a clear error when the segment is created, not a SIGBUS
in some rank later (issue 15): the pages are reserved up front."""

from __future__ import annotations

import subprocess

import numpy as np
import pytest

from commflow.errors import CommflowError
from commflow.runtime import shm


@pytest.fixture
def small_shm(tmp_path, monkeypatch):
    """A 4 MiB tmpfs standing in for /dev/shm (the tests run as root, as CI does)."""
    mount = tmp_path / "shm"
    mount.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=4m", "tmpfs", str(mount)], check=True)
    monkeypatch.setattr(shm, "SHM_DIR", mount)
    yield mount
    subprocess.run(["umount", "--lazy", str(mount)], check=True)


def test_a_segment_larger_than_shm_is_refused_clearly(small_shm):
    with pytest.raises(CommflowError, match=r"needs 8\.0 MiB .* has 4\.0 MiB free"):
        shm.SharedRegion.create("commflow-test-big", 8 << 20)
    assert not (small_shm / "commflow-test-big").exists()


def test_a_segment_that_fits_is_reserved_and_usable(small_shm):
    region = shm.SharedRegion.create("commflow-test-fits", 2 << 20)
    try:
        region.array(np.uint8, 0, 2 << 20)[:] = 7  # every page: no SIGBUS
        with pytest.raises(CommflowError, match="not enough shared memory"):
            shm.SharedRegion.create("commflow-test-more", 3 << 20)  # 2 MiB are taken
    finally:
        region.unlink()
