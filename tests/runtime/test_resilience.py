"""Going on after a failure: `commflow run --max-restarts` starts the job again (the docs'
restart.py), `--keep-going` leaves the survivors running, and examples/train_elastic.py
resumes on the survivors of a killed rank with the same state on each."""

from __future__ import annotations

import io
import re
import subprocess
import sys
from pathlib import Path

import pytest

from commflow.errors import CommflowError
from commflow.runtime.launcher import launch

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs" / "runtime.md"
COMMFLOW = str(Path(sys.executable).parent / "commflow")


def docs_block(after: str, kind: str) -> str:
    """The first ``kind`` block of docs/runtime.md after the text ``after``."""
    return re.search(rf"```{kind}\n(.*?)```", DOCS.read_text().split(after, 1)[1], re.DOTALL)[1]


def run_launch(*args, **kwargs) -> tuple[int, str, str]:
    out, err = io.BytesIO(), io.BytesIO()
    code = launch(*args, stdout=out, stderr=err, **kwargs)
    return code, out.getvalue().decode(), err.getvalue().decode()


def test_max_restarts_starts_the_job_again_until_it_succeeds(tmp_path):
    (tmp_path / "restart.py").write_text(docs_block("### Restarting a failed job", "python"))
    console = docs_block("### Restarting a failed job", "console").splitlines()
    command = console[0].removeprefix("$ ").split()
    assert command[:2] == ["commflow", "run"]
    done = subprocess.run([COMMFLOW, *command[1:]], cwd=tmp_path, capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == int(console[-1]) == 0, done.stderr
    shown = console[1:-2]
    assert done.stderr.splitlines() == [line for line in shown if "] attempt" not in line]
    assert sorted(done.stdout.splitlines()) == [line for line in shown if "] attempt" in line]


def test_a_four_rank_world_killed_mid_collective_restarts_and_computes_exactly(tmp_path):
    script = tmp_path / "four.py"
    script.write_text(
        "import os, signal\nimport numpy as np\nimport commflow\n"
        "attempt = int(os.environ['COMMFLOW_RESTART_COUNT'])\ncomm = commflow.init()\n"
        "x = np.arange(1024, dtype=np.float64) * (comm.rank + 1)\n"
        "for step in range(20):\n"
        "    if attempt == 0 and step == 5 and comm.rank == 2:\n"
        "        os.kill(os.getpid(), signal.SIGKILL)\n"
        "    total = comm.allreduce(x, algo='ring')\n"
        "assert np.array_equal(total, np.arange(1024) * 10.0)\n"
        "print('attempt', attempt, 'exact')\n")
    status, out, err = run_launch([str(script)], 4, max_restarts=1, timeout=120)
    assert status == 0, err
    assert sorted(out.splitlines()) == [f"[rank {r}] attempt 1 exact" for r in range(4)]
    assert "[commflow run] restarting every rank: restart 1 of 1" in err.splitlines()


def test_max_restarts_gives_up_with_the_last_attempts_status(tmp_path):
    script = tmp_path / "fail.py"
    script.write_text("import os, sys\nprint(os.environ['COMMFLOW_RESTART_COUNT'], "
                      "os.environ['TORCHELASTIC_MAX_RESTARTS'])\nsys.exit(3 if "
                      "os.environ['RANK'] == '1' else 0)\n")
    status, out, err = run_launch([str(script)], 2, max_restarts=2)
    assert status == 3
    assert sorted(out.splitlines()) == [f"[rank {r}] {a} 2" for r in (0, 1) for a in (0, 1, 2)]
    notes = [line for line in err.splitlines() if "restart" in line]
    assert notes == ["[commflow run] restarting every rank: restart 1 of 2",
                     "[commflow run] restarting every rank: restart 2 of 2",
                     "[commflow run] no restart left (2 used); exit status 3"]


def test_without_restarts_a_failure_ends_the_job_at_once(tmp_path):
    script = tmp_path / "fail.py"
    script.write_text("import os, sys\nprint('attempt', os.environ['COMMFLOW_RESTART_COUNT'])\n"
                      "sys.exit(3)\n")
    status, out, err = run_launch([str(script)], 1)
    assert (status, out, "restart" in err) == (3, "[rank 0] attempt 0\n", False)


def test_max_restarts_needs_one_node():
    with pytest.raises(CommflowError, match="--max-restarts works on one node"):
        launch(["true"], 1, nodes=(0, 2), master=("127.0.0.1", 1), max_restarts=1)
    with pytest.raises(CommflowError, match="0 or more"):
        launch(["true"], 1, max_restarts=-1)


def test_keep_going_leaves_the_survivors_running(tmp_path):
    script = tmp_path / "die.py"
    script.write_text("import os, signal, time\nif os.environ['RANK'] == '1':\n"
                      "    os.kill(os.getpid(), signal.SIGKILL)\ntime.sleep(0.5)\nprint('done')\n")
    status, out, err = run_launch([str(script)], 3, keep_going=True)
    assert status == 0
    assert sorted(out.splitlines()) == ["[rank 0] done", "[rank 2] done"]
    assert err == ("[commflow run] rank 1 was killed by signal 9 (SIGKILL); ranks [0, 2] keep "
                   "running (--keep-going)\n")
    status, _, err = run_launch([str(script)], 3)
    assert status == 137 and "stopping ranks [0, 2]" in err


def test_the_docs_excerpt_is_the_elastic_example():
    example = {line.strip() for line in (ROOT / "examples" / "train_elastic.py").open()}
    excerpt = docs_block("## Surviving a dead rank", "python").splitlines()
    assert all(line.split("  #")[0].strip() in example for line in excerpt)


def test_the_elastic_example_resumes_on_the_survivors():
    console = docs_block("## Surviving a dead rank", "console").splitlines()
    command = console[0].removeprefix("$ ").split()
    done = subprocess.run([COMMFLOW, *command[1:]], cwd=ROOT, capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stderr
    assert done.stderr.splitlines()[-1] == console[-1]
    finals = re.findall(r"^\[rank (\d)\] finished 20 steps on 3 ranks; state sha256 (\w+)$",
                        done.stdout, re.MULTILINE)
    assert sorted(r for r, _ in finals) == ["0", "1", "3"]
    assert len({digest for _, digest in finals}) == 1
    recovered = re.search(r"^\[rank 0\] step 6: allreduce #6: rank 2 .*has exited.*; 3 of 4 "
                          r"ranks go on \(ranks \[0, 1, 3\]\); recovered in (\d+) ms$",
                          done.stdout, re.MULTILINE)
    assert recovered and int(recovered[1]) < 10_000
    losses = [float(x) for x in re.findall(r"loss ([\d.]+)", done.stdout)]
    assert losses[-1] < losses[0] / 4
