"""The shared PNG writer: a clear error for a path that cannot be written."""

from __future__ import annotations

import pytest

from commflow.errors import CommflowError
from commflow.plotting import pyplot, save


def test_save_writes_a_png_and_names_an_unwritable_path(tmp_path):
    plt = pyplot("this test")
    fig, ax = plt.subplots()
    ax.plot([0, 1], [1, 0])
    save(fig, tmp_path / "ok.png")
    assert (tmp_path / "ok.png").read_bytes()[:4] == b"\x89PNG"
    fig, _ = plt.subplots()
    with pytest.raises(CommflowError, match="cannot write .*missing/x.png"):
        save(fig, tmp_path / "missing" / "x.png")
