"""Run PyTorch's own backend tests (``torch.testing._internal.distributed.distributed_test``,
the suite behind torch's test/distributed/test_distributed_spawn.py) against the ``commflow``
backend at 3 ranks, forking the ranks of each test, with commflow declared a DDP backend as
gloo is; print one JSON line of counts.

Usage: ``python tests/torch/torch_suite.py [NAME_PART ...]`` (only tests whose name contains
one of the parts). Run as a script (the suite reads BACKEND, WORLD_SIZE and TEMP_DIR when
imported); ``tests/torch/test_torch_suite.py`` runs it.
"""

from __future__ import annotations

import json
import multiprocessing
import os
import re
import shutil
import sys
import tempfile
import unittest
from collections import Counter

# The suite's stores and temporary files (one file per test, never removed by torch) go in
# one folder, removed when the run ends.
FOLDER = tempfile.mkdtemp(prefix="cf-torch-suite-")
tempfile.tempdir = FOLDER
os.environ.update(BACKEND="commflow", WORLD_SIZE="3", TEMP_DIR=FOLDER)

from torch.testing._internal.common_distributed import DistTestCases  # noqa: E402

import commflow.torch  # noqa: E402, F401  (registers the backend before the suite imports)

# The suite runs its DDP tests for the backends of this list (nccl, gloo, ucc); commflow
# supports DDP on CPU tensors, so it opts in as gloo is.
DistTestCases.backend_feature["ddp"].add("commflow")
from torch.testing._internal.distributed.distributed_test import (  # noqa: E402
    DistributedTest,
    TestDistBackend,
)


class TestCommflowBackend(TestDistBackend, DistributedTest._DistTestBase):
    """torch's backend tests, ranks forked from this (single-threaded) process."""

    def setUp(self) -> None:
        super().setUp()
        self._start_processes(multiprocessing.get_context("fork").Process)


def _reason(text: str) -> str:
    """torch's skip reason, with a set of backend names in sorted order (sets print in hash
    order, which changes between runs)."""
    return re.sub(
        r"\{([^}]*)\}", lambda m: "{" + ", ".join(sorted(m.group(1).split(", "))) + "}", text
    )


def main(parts: list[str]) -> None:
    names = unittest.TestLoader().getTestCaseNames(TestCommflowBackend)
    chosen = [n for n in names if not parts or any(p in n for p in parts)]
    result = unittest.TextTestRunner(stream=sys.stderr, verbosity=1).run(
        unittest.TestSuite(TestCommflowBackend(n) for n in chosen)
    )
    skips = Counter(_reason(reason) for _, reason in result.skipped)
    bad = [(t.id(), text[-2000:]) for t, text in result.failures + result.errors]
    print(json.dumps({
        "run": result.testsRun,
        "skipped": len(result.skipped),
        "failed": len(result.failures),
        "errors": len(result.errors),
        "passed": result.testsRun - len(result.skipped) - len(bad),
        "skip_reasons": dict(skips),
        "problems": bad,
    }))


if __name__ == "__main__":
    try:
        main(sys.argv[1:])
    finally:
        shutil.rmtree(FOLDER, ignore_errors=True)
