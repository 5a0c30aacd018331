"""tune.versus_fixed: auto against the fastest fixed algorithm per size and over a sweep."""

import pytest

from commflow.tune import versus_fixed

ROWS = [("auto", 8, 2.0), ("ring", 8, 3.0), ("shm", 8, 1.9),
        ("auto", 64, 5.0), ("ring", 64, 5.5), ("shm", 64, 6.0),
        ("auto", 512, 9.0), ("ring", 512, 9.0)]  # shm missing at 512: size left out


def test_per_size_and_sweep():
    versus = versus_fixed(ROWS)
    assert [(v.size, v.best) for v in versus.sizes] == [(8, "shm"), (64, "ring")]
    assert versus.worst().size == 8 and versus.worst().ratio == pytest.approx(2.0 / 1.9)
    assert versus.totals == {"auto": 7.0, "ring": 8.5, "shm": 7.9}
    assert versus.beats_every_fixed()
    assert versus.within(0.06) and not versus.within(0.05)


def test_auto_slower_over_the_sweep():
    versus = versus_fixed([("auto", 8, 2.0), ("ring", 8, 1.0), ("auto", 16, 1.0),
                           ("ring", 16, 1.5)])
    assert not versus.beats_every_fixed()


def test_needs_auto_and_a_fixed_one():
    with pytest.raises(ValueError, match="auto"):
        versus_fixed([("ring", 8, 1.0)])
