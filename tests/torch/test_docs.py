"""docs/torch.md's switching example runs on commflow, prints what the doc shows, and prints
the same with the one word changed to gloo; importing commflow.torch registers the backend."""

from __future__ import annotations

import contextlib
import io
import re
from pathlib import Path

import torch.distributed as dist

import commflow.torch  # noqa: F401  (registers the backend)

from .harness import run_group

DOC = Path(__file__).resolve().parents[2] / "docs" / "torch.md"


def switching_section() -> str:
    return DOC.read_text().split("## Switching", 1)[1].split("\n## ", 1)[0]


_SCRIPTS: list[dict] = []
"""Namespaces of the scripts run in this rank, kept alive until the rank exits (``os._exit``):
freeing a gloo DDP model can deadlock in torch (the ProcessGroupGloo destructor joins its
worker thread while holding the GIL, and that thread waits for the GIL to drop a Python
object), which hung this test once in a full run."""


def _run_script(code: str) -> str:
    printed = io.StringIO()
    namespace = {"__name__": "__main__"}
    _SCRIPTS.append(namespace)
    with contextlib.redirect_stdout(printed):
        exec(compile(code, "ddp.py", "exec"), namespace)
    return printed.getvalue().strip()


def test_switching_example_prints_what_the_doc_shows_on_commflow_and_on_gloo():
    section = switching_section()
    (code,) = re.findall(r"```python\n(.*?)```", section, flags=re.DOTALL)
    word = 'dist.init_process_group("commflow")'
    assert word in code and "import commflow.torch" in code
    documented = re.findall(r"^\[rank \d\] (.*)$", section, flags=re.MULTILINE)
    assert run_group(_run_script, 2, code, backend=None) == documented
    gloo = code.replace(word, 'dist.init_process_group("gloo")')
    assert run_group(_run_script, 2, gloo, backend=None) == documented


def test_import_registers_the_backend_for_cpu():
    assert dist.is_backend_available("commflow")
    assert dist.Backend.backend_capability["commflow"] == ["cpu"]
