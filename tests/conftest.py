"""The suite's temporary files in one folder, removed when the run ends: flight records that
failing ranks dump by design (``<tmp>/commflow-<job>``), torchrun's ``torchelastic_*``
folders and whatever else the ranks a test starts write under their temporary directory."""

from __future__ import annotations

import multiprocessing.util
import os
import shutil
import tempfile

_FOLDER = tempfile.mkdtemp(prefix="commflow-tests-")


def pytest_configure(config) -> None:
    """Before any test: this process and every process it starts write temporary files in
    the suite's folder; multiprocessing's own folder of this process (its forkserver's
    socket) stays where multiprocessing removes it at exit, after this folder is gone."""
    multiprocessing.util.get_temp_dir()
    os.environ["TMPDIR"] = _FOLDER
    tempfile.tempdir = _FOLDER


def pytest_unconfigure(config) -> None:
    """After the last test: the folder goes."""
    shutil.rmtree(_FOLDER, ignore_errors=True)
