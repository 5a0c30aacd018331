"""``bind_to_cpus``: each local rank gets its own block of the allowed CPUs, unless the host
has more ranks than CPUs or ``COMMFLOW_BIND=none`` (run in a child process: binding is
process-wide)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

_CHILD = """
import json, os, sys
from commflow.runtime.init import bind_to_cpus
rank, size, env = int(sys.argv[1]), int(sys.argv[2]), json.loads(sys.argv[3])
print(json.dumps([list(bind_to_cpus(rank, size, env)), sorted(os.sched_getaffinity(0))]))
"""


def _bind(rank: int, size: int, env: dict[str, str]) -> tuple[list[int], list[int]]:
    out = subprocess.run(
        [sys.executable, "-c", _CHILD, str(rank), str(size), json.dumps(env)],
        capture_output=True, text=True, check=True, timeout=60,
    ).stdout
    bound, now = json.loads(out)
    return bound, now


ALLOWED = sorted(os.sched_getaffinity(0))


@pytest.mark.parametrize("size", range(1, len(ALLOWED) + 1))
def test_each_rank_gets_its_own_block(size):
    k = len(ALLOWED) // size
    blocks = [_bind(rank, size, {}) for rank in range(size)]
    for rank, (bound, now) in enumerate(blocks):
        assert bound == now == ALLOWED[rank * k:(rank + 1) * k]
    assert len({c for bound, _ in blocks for c in bound}) == size * k


def test_no_binding_when_ranks_outnumber_cpus_or_when_turned_off():
    assert _bind(0, len(ALLOWED) + 1, {}) == ([], ALLOWED)
    assert _bind(0, 1, {"COMMFLOW_BIND": "none"}) == ([], ALLOWED)
