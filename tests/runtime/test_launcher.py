"""The launcher: environment of every rank, prefixed output, failure handling, signal forwarding,
shared-memory cleanup, emulated-host command lines, and the same script under commflow run,
torchrun and mpirun."""

from __future__ import annotations

import io
import json
import os
import re
import select
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from commflow.errors import CommflowError
from commflow.runtime import launcher
from commflow.runtime._supervisor import LinePrefixer, describe_exit
from commflow.runtime.launcher import Host, free_port, launch, parse_hosts, rank_specs

DOCS = Path(__file__).resolve().parents[2] / "docs" / "runtime.md"
CLI = [sys.executable, "-c", "from commflow.cli import main; main()", "run"]

WORLD_KEYS = [
    "COMMFLOW_RANK",
    "COMMFLOW_WORLD_SIZE",
    "COMMFLOW_LOCAL_RANK",
    "COMMFLOW_LOCAL_SIZE",
    "COMMFLOW_JOB",
    "RANK",
    "WORLD_SIZE",
    "LOCAL_RANK",
    "LOCAL_WORLD_SIZE",
    "MASTER_ADDR",
    "MASTER_PORT",
    "EXTRA",
]

ENV_SCRIPT = f"""
import json, os, sys
print(json.dumps({{k: os.environ.get(k) for k in {WORLD_KEYS!r}}} | {{"python": sys.executable}}))
"""

OUTPUT_SCRIPT = """
import os, sys
rank = os.environ["COMMFLOW_RANK"]
for i in range(3):
    print(f"out {i} of {rank}", flush=True)
    print(f"err {i} of {rank}", file=sys.stderr, flush=True)
sys.stdout.write("x" * 150000 + "\\ntail of " + rank)
"""

# Ranks install their handlers, then meet at a file barrier, so that no signal can arrive
# before a rank is ready for it; the rank named by FAIL then fails as FAIL_HOW says.
STOP_SCRIPT = """
import os, signal, sys, time
from pathlib import Path
rank, size = int(os.environ["COMMFLOW_RANK"]), int(os.environ["COMMFLOW_WORLD_SIZE"])
barrier = Path(sys.argv[1])
def bye(signum, frame):
    print(f"rank {rank} got {signal.Signals(signum).name}", flush=True)
    sys.exit(0)
for signum in (signal.SIGINT, signal.SIGTERM):
    signal.signal(signum, signal.SIG_IGN if os.environ.get("IGNORE") else bye)
print("ready", flush=True)
(barrier / str(rank)).touch()
while len(list(barrier.iterdir())) < size:
    time.sleep(0.01)
if rank == int(os.environ.get("FAIL", -1)):
    print(f"rank {rank} fails", file=sys.stderr, flush=True)
    if os.environ["FAIL_HOW"] == "exit":
        sys.exit(3)
    os.kill(os.getpid(), signal.SIGKILL)
time.sleep(60)
"""


def script(tmp_path: Path, text: str, name: str = "script.py") -> str:
    path = tmp_path / name
    path.write_text(text)
    return str(path)


def run_launch(*args, **kwargs) -> tuple[int, str, str]:
    """``launch(*args, **kwargs)`` with output captured: (status, stdout, stderr)."""
    out, err = io.BytesIO(), io.BytesIO()
    code = launch(*args, stdout=out, stderr=err, **kwargs)
    return code, out.getvalue().decode(), err.getvalue().decode()


def by_rank(text: str) -> dict[int, list[str]]:
    """Lines ``[rank N] ...`` grouped by N; every line must carry a prefix."""
    lines: dict[int, list[str]] = {}
    for line in text.splitlines():
        match = re.fullmatch(r"\[rank (\d+)\] (.*)", line)
        assert match, f"unprefixed line {line!r}"
        lines.setdefault(int(match[1]), []).append(match[2])
    return lines


def read_until(pipe, pattern: str, timeout: float = 30.0) -> str:
    """Read ``pipe`` until its text matches ``pattern`` (regex, multiline)."""
    text = b""
    deadline = time.monotonic() + timeout
    while not re.search(pattern, text.decode(), re.MULTILINE):
        left = deadline - time.monotonic()
        assert left > 0, f"no {pattern!r} in {text.decode()!r}"
        if select.select([pipe], [], [], left)[0]:
            chunk = os.read(pipe.fileno(), 65536)
            assert chunk, f"EOF before {pattern!r} in {text.decode()!r}"
            text += chunk
    return text.decode()


# -- pieces ------------------------------------------------------------------------------


@settings(deadline=None)  # wall-clock deadlines flake when ranks load the cores
@given(
    pieces=st.lists(st.sampled_from([b"a", b"xyz", b"\n", b"\n\n", b"\r", b"\xff"]), max_size=40),
    cuts=st.lists(st.integers(0, 80), max_size=8),
)
def test_line_prefixer_writes_whole_prefixed_lines_cut_at_max_line(pieces, cuts):
    data = b"".join(pieces)
    writes: list[bytes] = []
    sink = type("Sink", (), {"write": lambda self, b: writes.append(b), "flush": lambda self: 0})
    prefixer = LinePrefixer(b"[r] ", sink(), max_line=4)
    bounds = sorted({0, len(data), *(c for c in cuts if c < len(data))})
    for lo, hi in zip(bounds, bounds[1:], strict=False):
        prefixer.feed(data[lo:hi])
    prefixer.close()
    lines = data.split(b"\n")
    if lines[-1] == b"":
        lines.pop()
    expected = [
        b"[r] " + line[i : i + 4] + b"\n" for line in lines for i in range(0, max(len(line), 1), 4)
    ]
    assert b"".join(writes) == b"".join(expected)
    assert all(w.endswith(b"\n") and w.startswith(b"[r] ") for w in writes)


def test_describe_exit_names_code_or_signal():
    assert describe_exit(3) == "exited with code 3"
    assert describe_exit(-9) == "was killed by signal 9 (SIGKILL)"
    assert describe_exit(-15) == "was killed by signal 15 (SIGTERM)"


def test_parse_hosts_reads_namespaced_hosts_in_order():
    assert parse_hosts("h0:2, h1:3") == [Host(index=0, slots=2), Host(index=1, slots=3)]
    assert Host(index=1, slots=1).namespace == "commflow-h1"
    for bad in ("h1:2", "h0:2,h0:2", "h0:2,h2:2", "node0:2", "h0", "h0:2,"):
        with pytest.raises(CommflowError, match="bad host"):
            parse_hosts(bad)
    with pytest.raises(CommflowError, match="slots >= 1"):
        parse_hosts("h0:0")


def test_rank_specs_on_this_host():
    specs = rank_specs(["t.py", "--lr", "1"], 2, job="j1", master_addr="127.0.0.1", master_port=7)
    assert [s.argv for s in specs] == [(sys.executable, "t.py", "--lr", "1")] * 2
    assert specs[1].env == {
        "COMMFLOW_RANK": "1",
        "COMMFLOW_WORLD_SIZE": "2",
        "COMMFLOW_LOCAL_RANK": "1",
        "COMMFLOW_LOCAL_SIZE": "2",
        "COMMFLOW_JOB": "j1",
        "RANK": "1",
        "WORLD_SIZE": "2",
        "LOCAL_RANK": "1",
        "LOCAL_WORLD_SIZE": "2",
        "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": "7",
    }
    plain = rank_specs(["./a.out", "x.py"], 1, job="j", master_addr="a", master_port=1)
    assert plain[0].argv == ("./a.out", "x.py")


def test_rank_specs_on_emulated_hosts_run_in_their_namespaces():
    hosts = parse_hosts("h0:1,h1:2")
    specs = rank_specs(
        ["sh", "-c", "x"], 3, job="j", master_addr="198.18.0.1", master_port=9, hosts=hosts
    )
    assert [s.argv for s in specs] == [
        ("ip", "netns", "exec", "commflow-h0", "sh", "-c", "x"),
        ("ip", "netns", "exec", "commflow-h1", "sh", "-c", "x"),
        ("ip", "netns", "exec", "commflow-h1", "sh", "-c", "x"),
    ]
    fields = (
        "COMMFLOW_RANK",
        "COMMFLOW_LOCAL_RANK",
        "COMMFLOW_LOCAL_SIZE",
        "COMMFLOW_HOST",
        "RANK",
        "LOCAL_RANK",
        "LOCAL_WORLD_SIZE",
    )
    assert [tuple(s.env[k] for k in fields) for s in specs] == [
        ("0", "0", "1", "0", "0", "0", "1"),
        ("1", "0", "2", "1", "1", "0", "2"),
        ("2", "1", "2", "1", "2", "1", "2"),
    ]
    assert {
        (s.env["COMMFLOW_HOSTS"], s.env["WORLD_SIZE"], s.env["MASTER_ADDR"]) for s in specs
    } == {("2", "3", "198.18.0.1")}


def test_bad_requests_raise_before_anything_starts(tmp_path, monkeypatch):
    with pytest.raises(CommflowError, match="no command"):
        rank_specs([], 2, job="j", master_addr="a", master_port=1)
    with pytest.raises(CommflowError, match="cannot start 0 ranks"):
        rank_specs(["x"], 0, job="j", master_addr="a", master_port=1)
    with pytest.raises(CommflowError, match="3 slots but -n asks for 4"):
        rank_specs(["x"], 4, job="j", master_addr="a", master_port=1, hosts=parse_hosts("h0:3"))
    with pytest.raises(CommflowError, match="bad job id"):
        launch(["true"], 1, job="a/b")
    with pytest.raises(CommflowError, match="need grace >= 0 and timeout > 0"):
        launch(["true"], 1, timeout=0)
    monkeypatch.setattr(launcher, "NETNS_DIR", tmp_path)
    with pytest.raises(CommflowError, match="no network namespace commflow-h0.*cluster up"):
        launch(["true"], 2, hosts="h0:2")
    with pytest.raises(CommflowError, match="cannot start rank 0: no-such-command-here"):
        launch(["no-such-command-here"], 2)


def test_free_port_can_be_bound():
    port = launcher.free_port()
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", port))


# -- launching for real (in-process) -----------------------------------------------------------


def test_every_rank_gets_its_world(tmp_path):
    path = script(tmp_path, ENV_SCRIPT)
    code, out, err = run_launch([path], 3, env={"EXTRA": "x", "COMMFLOW_RANK": "99"})
    assert (code, err) == (0, "")
    worlds = {r: json.loads(lines[0]) for r, lines in by_rank(out).items()}
    assert sorted(worlds) == [0, 1, 2]
    job, port = worlds[0]["COMMFLOW_JOB"], worlds[0]["MASTER_PORT"]
    assert re.fullmatch(r"run-[0-9a-f]{16}", job) and int(port) > 0
    for r, world in worlds.items():
        assert world == {
            "COMMFLOW_RANK": str(r),
            "COMMFLOW_WORLD_SIZE": "3",
            "COMMFLOW_LOCAL_RANK": str(r),
            "COMMFLOW_LOCAL_SIZE": "3",
            "COMMFLOW_JOB": job,
            "RANK": str(r),
            "WORLD_SIZE": "3",
            "LOCAL_RANK": str(r),
            "LOCAL_WORLD_SIZE": "3",
            "MASTER_ADDR": "127.0.0.1",
            "MASTER_PORT": port,
            "EXTRA": "x",
            "python": sys.executable,
        }
    _, again, _ = run_launch([path], 1, job="given-job")
    assert json.loads(by_rank(again)[0][0])["COMMFLOW_JOB"] == "given-job"


def test_output_is_prefixed_line_by_line_and_streams_kept_apart(tmp_path):
    code, out, err = run_launch([script(tmp_path, OUTPUT_SCRIPT)], 3)
    assert code == 0
    long = ["x" * 65536, "x" * 65536, "x" * (150000 - 2 * 65536)]
    for r, lines in by_rank(out).items():
        assert lines == [f"out {i} of {r}" for i in range(3)] + long + [f"tail of {r}"]
    assert by_rank(err) == {r: [f"err {i} of {r}" for i in range(3)] for r in range(3)}
    _, raw, _ = run_launch([script(tmp_path, OUTPUT_SCRIPT)], 1, prefix_output=False)
    assert raw.splitlines()[:3] == ["out 0 of 0", "out 1 of 0", "out 2 of 0"]


@pytest.mark.parametrize(
    ("how", "code", "message"),
    [("exit", 3, "exited with code 3"), ("kill", 137, "was killed by signal 9 (SIGKILL)")],
)
def test_a_failed_rank_stops_the_others(tmp_path, how, code, message):
    barrier = tmp_path / "barrier"
    barrier.mkdir()
    start = time.monotonic()
    status, out, err = run_launch(
        [script(tmp_path, STOP_SCRIPT), str(barrier)], 3, env={"FAIL": "1", "FAIL_HOW": how}
    )
    assert time.monotonic() - start < 20
    assert status == code
    # the failed rank's last words come before the launcher's message
    assert err.startswith(
        f"[rank 1] rank 1 fails\n[commflow run] rank 1 {message}; stopping ranks [0, 2]\n"
    )
    lines = by_rank(out)
    assert lines[0] == ["ready", "rank 0 got SIGTERM"]
    assert lines[2] == ["ready", "rank 2 got SIGTERM"]


def test_ranks_ignoring_sigterm_are_killed_after_the_grace_period(tmp_path):
    barrier = tmp_path / "barrier"
    barrier.mkdir()
    start = time.monotonic()
    status, _, err = run_launch(
        [script(tmp_path, STOP_SCRIPT), str(barrier)],
        2,
        env={"FAIL": "0", "FAIL_HOW": "exit", "IGNORE": "1"},
        grace=0.5,
    )
    assert time.monotonic() - start < 20
    assert status == 3
    assert "ranks [1] still running; sending SIGKILL" in err


def test_timeout_stops_the_job_with_status_124():
    status, _, err = run_launch(["sleep", "60"], 2, timeout=0.3, grace=0.5)
    assert status == 124
    assert "timed out after 0.3 s; stopping the ranks" in err


def test_launch_works_outside_the_main_thread(tmp_path):
    results = []
    thread = threading.Thread(
        target=lambda: results.append(run_launch([script(tmp_path, ENV_SCRIPT)], 2))
    )
    thread.start()
    thread.join(30)
    assert results[0][0] == 0 and sorted(by_rank(results[0][1])) == [0, 1]


# -- the command line, signals and shared memory ------------------------------------------


def test_cli_options_end_at_the_command(capfd):
    from commflow.cli import main

    with pytest.raises(SystemExit) as done:
        main(
            ["run", "-n", "2", "--", sys.executable, "-c", "import sys; print(sys.argv)", "-n", "5"]
        )
    assert done.value.code == 0
    assert by_rank(capfd.readouterr().out) == {r: ["['-c', '-n', '5']"] for r in range(2)}


def test_sigint_to_the_launcher_reaches_every_rank(tmp_path):
    barrier = tmp_path / "barrier"
    barrier.mkdir()
    proc = subprocess.Popen(
        [*CLI, "-n", "3", script(tmp_path, STOP_SCRIPT), str(barrier)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    try:
        seen = read_until(proc.stdout, r"(^\[rank \d\] ready\n(.|\n)*){3}")
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=30)
    finally:
        proc.kill()
    assert proc.returncode == 128 + signal.SIGINT
    assert "got SIGINT; forwarding it to ranks [0, 1, 2]" in err.decode()
    assert {r: lines for r, lines in by_rank(seen + out.decode()).items()} == {
        r: ["ready", f"rank {r} got SIGINT"] for r in range(3)
    }


def test_kill_9_of_a_rank_leaves_no_shared_memory(tmp_path):
    body = """
import os, time
print(f"pid {os.getpid()} job {os.environ['COMMFLOW_JOB']}", flush=True)
if os.environ["COMMFLOW_RANK"] == "0":
    import commflow.runtime
    commflow.runtime.init(timeout=60)  # creates the host's segment, waits for rank 1
time.sleep(60)
"""
    proc = subprocess.Popen(
        [*CLI, "-n", "2", script(tmp_path, body)], stdout=subprocess.PIPE, stderr=subprocess.PIPE
    )
    try:
        match = re.search(r"\[rank 0\] pid (\d+) job (\S+)", read_until(proc.stdout, r"rank 0.*\n"))
        pid, job = int(match[1]), match[2]
        deadline = time.monotonic() + 30
        while not list(Path("/dev/shm").glob(f"commflow.{job}.*")):
            assert time.monotonic() < deadline, "rank 0 never created its shared memory"
            time.sleep(0.02)
        os.kill(pid, signal.SIGKILL)
        _, err = proc.communicate(timeout=30)
    finally:
        proc.kill()
    assert proc.returncode == 128 + signal.SIGKILL
    assert "rank 0 was killed by signal 9 (SIGKILL); stopping ranks [1]" in err.decode()
    assert f"removed shared memory left by job {job}: commflow.{job}." in err.decode()
    assert not list(Path("/dev/shm").glob(f"commflow.{job}.*"))


# -- one script, three launchers ------------------------------------------------------------


def docs_example() -> str:
    """The Python block of the "Launching" section of docs/runtime.md."""
    section = DOCS.read_text().split("## Launching", 1)[1]
    return re.search(r"```python\n(.*?)```", section, re.DOTALL)[1]


def expected_allreduce(nranks: int) -> list[int]:
    return [sum(i * (r + 1) + r for r in range(nranks)) for i in range(6)]


@pytest.mark.parametrize(
    ("source", "starter"),
    [
        ("commflow", CLI + ["-n", "2"]),
        (
            "torchrun",
            [
                sys.executable,
                "-m",
                "torch.distributed.run",
                "--standalone",
                "--nproc_per_node",
                "2",
            ],
        ),
        (
            "mpi",
            [
                shutil.which("mpirun") or "mpirun",
                "--allow-run-as-root",
                "--oversubscribe",
                "-n",
                "2",
                sys.executable,
            ],
        ),
    ],
)
def test_the_docs_example_runs_the_same_under_every_launcher(tmp_path, source, starter):
    done = subprocess.run(
        [*starter, script(tmp_path, docs_example(), "allreduce.py")],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    # torchrun and mpirun may split a line between two ranks' writes: find the records anywhere
    lines = sorted(re.findall(r"rank \d of 2 \(\w+\): \[[-\d, ]*\]", done.stdout))
    assert lines == [f"rank {r} of 2 ({source}): {expected_allreduce(2)}" for r in range(2)]


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, IndexError):
        return False
    return state not in ("Z", "X")


def test_ranks_die_with_a_killed_launcher():
    script = "import os, time; print(os.getpid(), flush=True); time.sleep(60)"
    proc = subprocess.Popen(
        [sys.executable, "-m", "commflow.cli", "run", "-n", "2", "--", sys.executable, "-c",
         script], stdout=subprocess.PIPE, text=True)
    pids = [int(proc.stdout.readline().split()[-1]) for _ in range(2)]
    assert all(_alive(p) for p in pids)
    proc.kill()
    proc.wait()
    deadline = time.monotonic() + 10
    while any(_alive(p) for p in pids) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not any(_alive(p) for p in pids)


def test_two_nodes_of_a_multi_node_job_make_one_world(tmp_path):
    script = tmp_path / "sum.py"
    script.write_text("import numpy as np, commflow\n"
                      "comm = commflow.init()\n"
                      "x = np.full(4, comm.rank + 1, np.float32)\n"
                      "print(comm.rank, comm.size, comm.allreduce(x).tolist())\n")
    port = free_port()
    outs, codes = [io.BytesIO(), io.BytesIO()], [None, None]

    def node(i: int) -> None:
        codes[i] = launch([str(script)], 2, nodes=(i, 2), master=("127.0.0.1", port),
                          stdout=outs[i], timeout=60)

    threads = [threading.Thread(target=node, args=(i,)) for i in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert codes == [0, 0]
    lines = sorted(line for out in outs for line in out.getvalue().decode().splitlines())
    assert lines == [f"[rank {r}] {r} 4 [10.0, 10.0, 10.0, 10.0]" for r in range(4)]


@pytest.mark.parametrize(("kwargs", "message"), [
    ({"nodes": (2, 2), "master": ("127.0.0.1", 29500)}, "0 <= node rank < nnodes"),
    ({"nodes": (0, 2)}, "the master's address and port"),
    ({"nodes": (0, 2), "master": ("127.0.0.1", 29500), "hosts": "h0:1"}, "not both"),
])
def test_bad_multi_node_requests_are_refused(kwargs, message):
    with pytest.raises(CommflowError, match=message):
        launch(["x.py"], 1, **kwargs)
