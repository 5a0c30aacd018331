"""2D-torus allreduce: grid neighbours only, closed form, rows validation."""

from __future__ import annotations

from fractions import Fraction

import numpy as np
import pytest

from commflow.algorithms import build
from commflow.errors import AlgorithmError
from commflow.ir import Op

from .alphabeta import alpha_beta_time
from .interpret import check_numerically

ALPHA, BETA, SIZE = Fraction(3), Fraction(1, 7), Fraction(2 * 3 * 5 * 7 * 11 * 13 * 16)


@pytest.mark.parametrize(("p", "rows"), [(6, 2), (6, 3), (12, 3), (16, 4), (15, 5)])
def test_messages_stay_in_a_row_or_a_column(p, rows):
    program = build("allreduce", "torus2d", p, rows=rows, chunks=2, channels=2)
    t = program.table
    send = t.op == Op.SEND
    cols = p // rows
    src, dst = t.part[send], t.peer[send]
    same_row, same_col = src // cols == dst // cols, src % cols == dst % cols
    assert np.all(same_row | same_col)
    # a row ring then a column ring, each to the next rank around its ring
    assert np.all(
        np.where(same_row, dst % cols == (src + 1) % cols, dst // cols == (src // cols + 1) % rows)
    )


@pytest.mark.parametrize(("p", "rows"), [(1, 1), (4, 2), (6, 2), (6, 3), (12, 4), (7, 7)])
def test_alpha_beta_time_is_the_closed_form(p, rows):
    cols = p // rows
    want = 2 * (cols - 1) * (ALPHA + SIZE / cols * BETA) + 2 * (rows - 1) * (
        ALPHA + SIZE / p * BETA
    )
    program = build("allreduce", "torus2d", p, rows=rows)
    assert alpha_beta_time(program, ALPHA, BETA, SIZE) == want


def test_default_grid_and_params():
    assert dict(build("allreduce", "torus2d", 12).params) == {
        "rows": 3,
        "cols": 4,
        "chunks": 1,
        "channels": 1,
    }
    assert dict(build("allreduce", "torus2d", 13).params)["rows"] == 1


def test_bad_rows_are_rejected():
    with pytest.raises(AlgorithmError, match="torus2d: rows=5 does not divide nranks=12"):
        build("allreduce", "torus2d", 12, rows=5)


@pytest.mark.parametrize(("p", "rows"), [(6, 2), (9, 3), (10, 5)])
def test_numeric(p, rows):
    program = build("allreduce", "torus2d", p, rows=rows, chunks=2, channels=2)
    assert set(program.table.chan.tolist()) == {0, 1}
    check_numerically(program)
