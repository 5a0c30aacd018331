"""Every ``commflow`` command shown in docs/tuning.md runs (with small sizes, two ranks and a
short budget so that the test stays quick) and exits 0."""

from __future__ import annotations

import json
import re
import shlex
import shutil
from pathlib import Path

from typer.testing import CliRunner

from commflow.cli import app

ROOT = Path(__file__).resolve().parents[2]
PAGE = ROOT / "docs" / "tuning.md"
SMALLER = {"--live": "2", "-n": "2", "--budget": "4", "-e": "64", "-b": "8", "-f": "8"}
"""Flags whose values the test shrinks (the page's own values take minutes)."""


def commands() -> list[list[str]]:
    found = []
    for block in re.findall(r"```sh\n(.*?)```", PAGE.read_text(), flags=re.DOTALL):
        for line in block.splitlines():
            words = shlex.split(line.strip())
            if words[:1] == ["commflow"] and words not in found:
                found.append(words)
    return found


def shrink(words: list[str]) -> list[str]:
    out = list(words)
    live = words[1] == "bench" or "--live" in words
    for i, word in enumerate(words[:-1]):
        if word in SMALLER and live:
            out[i + 1] = SMALLER[word]
    if words[1] == "bench":
        out += ["-w", "1", "--iters", "3", "--small-iters", "3"]
    return out


def test_every_command_of_the_page_runs(tmp_path, monkeypatch):
    runs = commands()
    assert {w[1] for w in runs} == {"tune", "bench", "calibrate"}
    shutil.copy(ROOT / "tests" / "topology" / "data" / "dgx_a100.xml", tmp_path / "topo.xml")
    monkeypatch.chdir(tmp_path)
    printed = {}
    for words in runs:
        result = CliRunner().invoke(app, shrink(words)[1:], terminal_width=200)
        assert result.exit_code == 0, (words, result.output[-2000:])
        printed[" ".join(words)] = result.output
    for made in ("table.json", "nccl.csv", "live.json", "ar.json", "ar4.json", "eng.json"):
        assert (tmp_path / made).stat().st_size > 0, made
    assert {r["hosts"] for r in json.loads((tmp_path / "eng.json").read_text())} == {2}
    bench = next(out for line, out in printed.items() if "ar4.json" in line and "bench" in line)
    assert re.search(r"# auto out-of-place: at most [\d.]+x the fastest fixed algorithm", bench)
