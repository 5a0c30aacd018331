"""Starting a job's ranks: the library behind ``commflow run -n N COMMAND``.

:func:`launch` starts ``nprocs`` processes of one command with the environment that
:func:`commflow.runtime.detect_world` reads (commflow's variables, and torchrun's so that
``torch.distributed`` code runs unchanged), prefixes every line they print with ``[rank N] ``,
forwards SIGINT and SIGTERM to every rank, stops the job when one rank fails, and removes the
job's shared memory afterwards (a reaper process, :mod:`commflow.runtime._reaper`, does it when
the launcher itself is killed). With ``hosts`` the ranks run on emulated hosts, the network
namespaces ``commflow-h<i>`` that ``commflow cluster up`` creates.
"""

from __future__ import annotations

import contextlib
import os
import re
import secrets
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

from commflow.errors import CommflowError
from commflow.runtime._supervisor import Supervisor
from commflow.runtime.shm import remove_job
from commflow.runtime.token import TOKEN_ENV, new_token

GRACE = 5.0
"""Seconds the ranks get to exit after a forwarded signal, before SIGKILL."""

NETNS_DIR = Path("/var/run/netns")
"""Where ``ip netns`` keeps its named network namespaces."""

_HOST_RE = re.compile(r"h(\d+):(\d+)")
_JOB_RE = re.compile(r"[A-Za-z0-9_-]{1,64}")


@dataclass(frozen=True, kw_only=True)
class Host:
    """One emulated host of a multi-host run, made by ``commflow cluster up``."""

    index: int
    """Host number ``i``: its ranks run in the network namespace ``commflow-h<i>``."""
    slots: int
    """Number of ranks started on it."""

    def __post_init__(self) -> None:
        if self.index < 0 or self.slots < 1:
            raise CommflowError(f"bad host h{self.index}:{self.slots}: need index >= 0, slots >= 1")

    @property
    def namespace(self) -> str:
        """The network namespace the host's ranks run in."""
        return f"commflow-h{self.index}"


@dataclass(frozen=True, kw_only=True)
class RankSpec:
    """How one rank is started."""

    rank: int
    """Global rank."""
    argv: tuple[str, ...]
    """The command line, with ``ip netns exec`` in front on an emulated host."""
    env: Mapping[str, str]
    """Variables set for this rank on top of the launcher's environment."""


def parse_hosts(text: str) -> list[Host]:
    """``"h0:2,h1:2"`` as hosts ``h0`` and ``h1`` with 2 ranks each.

    Hosts must be named ``h0, h1, ...`` in this order (the namespaces of ``commflow cluster
    up``). Raises ``CommflowError`` naming the item that does not fit.
    """
    hosts = []
    for i, item in enumerate(part.strip() for part in text.split(",")):
        match = _HOST_RE.fullmatch(item)
        if match is None or int(match[1]) != i:
            raise CommflowError(
                f"bad host {item!r} in --hosts {text!r}: write h0:SLOTS,h1:SLOTS,... in order "
                f"(the emulated hosts of `commflow cluster up`)"
            )
        hosts.append(Host(index=i, slots=int(match[2])))
    return hosts


def new_job_id() -> str:
    """A fresh random job id (names the job's shared memory)."""
    return f"run-{secrets.token_hex(8)}"


def free_port(address: str = "127.0.0.1") -> int:
    """A TCP port that is free on ``address`` now (for ``MASTER_PORT``)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((address, 0))
        return sock.getsockname()[1]


def check_namespace(namespace: str) -> None:
    """Raise ``CommflowError`` unless the network namespace ``namespace`` exists."""
    if not (NETNS_DIR / namespace).exists():
        raise CommflowError(
            f"no network namespace {namespace}: create the emulated hosts first with "
            f"`commflow cluster up --hosts N`"
        )


def namespace_address(namespace: str) -> str:
    """The first global IPv4 address inside network namespace ``namespace``.

    Raises ``CommflowError`` when the namespace does not exist or has no address.
    """
    check_namespace(namespace)
    try:
        shown = subprocess.run(
            ["ip", "-n", namespace, "-o", "-4", "addr", "show", "scope", "global"],
            capture_output=True,
            text=True,
            check=False,
        )
    except FileNotFoundError:
        raise CommflowError("--hosts needs the `ip` command (iproute2): install it") from None
    match = re.search(r"\binet (\d+\.\d+\.\d+\.\d+)/", shown.stdout)
    if shown.returncode != 0 or match is None:
        detail = f" ({shown.stderr.strip()})" if shown.stderr.strip() else ""
        raise CommflowError(
            f"network namespace {namespace} has no IPv4 address{detail}; "
            f"recreate it with `commflow cluster down` and `commflow cluster up`"
        )
    return match[1]


def rank_specs(
    command: Sequence[str],
    nprocs: int,
    *,
    job: str,
    master_addr: str,
    master_port: int,
    hosts: Sequence[Host] | None = None,
    module: bool = False,
    node: tuple[int, int] | None = None,
) -> list[RankSpec]:
    """The command line and environment of every rank.

    ``node`` = (this node's index, number of nodes) makes these ``nprocs`` ranks one node
    of a multi-node job (torchrun's ``--node-rank``/``--nnodes``): global ranks
    ``index * nprocs ..``, a world of ``count * nprocs``, ``COMMFLOW_HOST`` the node's index.

    A ``.py`` file as the first word runs with this Python; with ``module`` the first word is
    a module that runs as ``python -m MODULE``. Ranks fill ``hosts`` in order
    (``None``: all on this host). Raises ``CommflowError`` on an empty command, ``nprocs < 1``
    or when the hosts' slots do not add up to ``nprocs``.
    """
    if not command:
        raise CommflowError("no command to run: give one after the options, e.g. `-- train.py`")
    if nprocs < 1:
        raise CommflowError(f"cannot start {nprocs} ranks: give -n 1 or more")
    if module:
        argv: tuple[str, ...] = (sys.executable, "-m", *command)
    elif command[0].endswith(".py"):
        argv = (sys.executable, *command)
    else:
        argv = tuple(command)
    placement = [(None, nprocs)] if hosts is None else [(h, h.slots) for h in hosts]
    if sum(slots for _, slots in placement) != nprocs:
        raise CommflowError(
            f"the hosts have {sum(s for _, s in placement)} slots but -n asks for {nprocs} "
            f"ranks: make them agree"
        )
    index, count = node or (0, 1)
    common = {
        "COMMFLOW_WORLD_SIZE": str(nprocs * count),
        "COMMFLOW_JOB": job,
        "WORLD_SIZE": str(nprocs * count),
        "MASTER_ADDR": master_addr,
        "MASTER_PORT": str(master_port),
    }
    specs = []
    for host, slots in placement:
        prefix = () if host is None else ("ip", "netns", "exec", host.namespace)
        where = (
            {} if host is None and node is None
            else {"COMMFLOW_HOST": str(index), "COMMFLOW_HOSTS": str(count)} if host is None
            else {
                "COMMFLOW_HOST": str(host.index),
                "COMMFLOW_HOSTS": str(len(placement)),
            }
        )
        for local in range(slots):
            rank = index * nprocs + len(specs)
            env = {
                **common,
                **where,
                "COMMFLOW_RANK": str(rank),
                "COMMFLOW_LOCAL_RANK": str(local),
                "COMMFLOW_LOCAL_SIZE": str(slots),
                "RANK": str(rank),
                "LOCAL_RANK": str(local),
                "LOCAL_WORLD_SIZE": str(slots),
            }
            specs.append(RankSpec(rank=rank, argv=(*prefix, *argv), env=env))
    return specs


def launch(
    command: Sequence[str],
    nprocs: int,
    *,
    hosts: str | Sequence[Host] | None = None,
    env: Mapping[str, str] | None = None,
    job: str | None = None,
    prefix_output: bool = True,
    timeout: float | None = None,
    grace: float = GRACE,
    stdout: BinaryIO | None = None,
    stderr: BinaryIO | None = None,
    module: bool = False,
    nodes: tuple[int, int] | None = None,
    master: tuple[str, int] | None = None,
    max_restarts: int = 0,
    keep_going: bool = False,
) -> int:
    """Run ``command`` as ``nprocs`` ranks and return the job's exit status.

    ``nodes`` = (this node's index, number of nodes) runs them as one node of a multi-node
    job (torchrun's ``--node-rank``/``--nnodes``; one launcher per node): every node names
    the same ``master`` = (address, port), where global rank 0 (node 0) serves the
    rendezvous store, and the same ``job`` (default: one derived from ``master``).

    ``command`` is a program and its arguments (a ``.py`` file runs with this Python), or
    with ``module`` a Python module and its arguments (``python -m``). ``OMP_NUM_THREADS`` is
    1 unless this process's environment or ``env`` sets it (as torchrun does: N ranks of
    OpenMP/torch code would otherwise each start a thread per core).

    Every rank gets ``COMMFLOW_RANK``, ``COMMFLOW_WORLD_SIZE``, ``COMMFLOW_LOCAL_RANK``,
    ``COMMFLOW_LOCAL_SIZE``, ``COMMFLOW_JOB`` (``job``, default a fresh random id),
    ``COMMFLOW_SHM_TOKEN`` (a fresh random token in the job's segment names) and torchrun's
    ``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``, ``LOCAL_WORLD_SIZE``, ``MASTER_ADDR``,
    ``MASTER_PORT`` (a free port), on top of this process's environment and ``env``; with
    ``hosts`` (``"h0:2,h1:2"`` or :class:`Host` values) also ``COMMFLOW_HOST`` and
    ``COMMFLOW_HOSTS``, each host's ranks running in its network namespace. Ranks read no
    standard input. Their output goes line by line to ``stdout``/``stderr`` (default this
    process's), each line prefixed with ``[rank N] `` when ``prefix_output``; the launcher's own
    messages go to ``stderr`` prefixed with ``[commflow run] ``.

    SIGINT and SIGTERM (when called from the main thread) are forwarded to every rank; when a
    rank exits non-zero or is killed, or after ``timeout`` seconds, the others get SIGTERM.
    Ranks still running ``grace`` seconds after a signal get SIGKILL (a second SIGINT: at once).
    Finally the job's shared memory is removed (by a reaper process should the launcher be
    killed).

    With ``max_restarts`` N (torchelastic's ``--max-restarts``), a job stopped by a failed rank
    is started again, every rank anew, up to N times; each rank reads the attempt number in
    ``COMMFLOW_RESTART_COUNT`` (0 first; also ``TORCHELASTIC_RESTART_COUNT``) and N in
    ``COMMFLOW_MAX_RESTARTS`` (``TORCHELASTIC_MAX_RESTARTS``). A signal or the timeout (which
    counts over all attempts) is not restarted. One node only: not with ``nodes``.

    With ``keep_going`` a rank killed by a signal does not stop the others, so that they can
    go on without it (``Communicator.shrink``); the job succeeds when every rank that was not
    killed exits 0 (the last rank's death still ends it as a failure).

    Returns 0 when every rank exited 0; else the first failed rank's exit code (128 + signal
    number when it was killed) in the last attempt, 128 + the signal number when the launcher
    was signalled, or 124 on timeout. Raises ``CommflowError`` for a bad request or a command
    that cannot be started.
    """
    if max_restarts < 0:
        raise CommflowError(f"--max-restarts must be 0 or more, got {max_restarts}")
    if max_restarts and nodes is not None:
        raise CommflowError("--max-restarts works on one node: a multi-node job would need "
                            "every node's launcher to restart together; use torchrun's "
                            "elastic agent for that")
    if nodes is not None:
        index, count = nodes
        if not 0 <= index < count or master is None:
            raise CommflowError(
                f"a multi-node job needs 0 <= node rank < nnodes (got {index} of {count}) and "
                f"the master's address and port (--master-addr, --master-port)")
        if hosts:
            raise CommflowError("use either --hosts (emulated hosts) or --nnodes, not both")
        job = job or re.sub(r"[^A-Za-z0-9_-]", "-", f"n{master[0]}-{master[1]}")[:64]
    job = job or new_job_id()
    if not _JOB_RE.fullmatch(job):
        raise CommflowError(f"bad job id {job!r}: use 1-64 letters, digits, '_' or '-'")
    if grace < 0 or (timeout is not None and timeout <= 0):
        raise CommflowError(f"need grace >= 0 and timeout > 0 seconds, got {grace}, {timeout}")
    if isinstance(hosts, str):
        hosts = parse_hosts(hosts)
    if hosts:
        for host in hosts:
            check_namespace(host.namespace)
        master_addr = namespace_address(hosts[0].namespace)
    else:
        master_addr = "127.0.0.1"
    base = {"PYTHONUNBUFFERED": "1", "OMP_NUM_THREADS": "1", **os.environ, **(env or {})}
    current: list[Supervisor] = []
    reaper = _start_reaper(job)
    signalled: list[int] = []

    def forward(signum: int, frame: object) -> None:
        signalled.append(signum)
        if current:
            current[-1].on_signal(signum, frame)

    previous: dict[int, object] = {}
    if threading.current_thread() is threading.main_thread():
        for signum in (signal.SIGINT, signal.SIGTERM):
            previous[signum] = signal.signal(signum, forward)
    deadline = None if timeout is None else time.monotonic() + timeout
    attempt = 0
    try:
        while True:
            addr, port = master or (master_addr, free_port())
            specs = rank_specs(command, nprocs, job=job, master_addr=addr, master_port=port,
                               hosts=hosts or None, module=module, node=nodes)
            restarts = {"COMMFLOW_RESTART_COUNT": str(attempt),
                        "TORCHELASTIC_RESTART_COUNT": str(attempt),
                        "COMMFLOW_MAX_RESTARTS": str(max_restarts),
                        "TORCHELASTIC_MAX_RESTARTS": str(max_restarts)}
            runner = Supervisor(
                stdout=sys.stdout.buffer if stdout is None else stdout,
                stderr=sys.stderr.buffer if stderr is None else stderr,
                grace=grace,
                keep_going=keep_going,
            )
            current.append(runner)
            try:
                left = timeout if deadline is None or not attempt else max(
                    1e-3, deadline - time.monotonic())
                env_now = {**base, **restarts, TOKEN_ENV: new_token()}
                status = _attempt(runner, reaper, specs, env_now, job, prefix_output, left)
                if status == 0 or runner.failed_rank is None or not max_restarts or signalled:
                    return status
                if attempt == max_restarts:
                    runner.note(f"no restart left ({max_restarts} used); exit status {status}")
                    return status
                attempt += 1
                runner.note(f"restarting every rank: restart {attempt} of {max_restarts}")
            finally:
                current.clear()
                runner.close()
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)
        with contextlib.suppress(OSError):
            reaper.stdin.close()
        reaper.wait()


def _attempt(runner: Supervisor, reaper: subprocess.Popen, specs: list[RankSpec],
             base: Mapping[str, str], job: str, prefix_output: bool,
             timeout: float | None) -> int:
    """Run the ranks of ``specs`` once under ``runner`` (telling ``reaper`` their pids);
    returns the exit status once the ranks are gone and the job's shared memory is removed."""
    try:
        for spec in specs:
            prefix = f"[rank {spec.rank}] ".encode() if prefix_output else b""
            pid = runner.start(spec.rank, spec.argv, {**base, **spec.env}, prefix)
            with contextlib.suppress(OSError):  # a reaper killed by someone: go on without
                reaper.stdin.write(f"{pid}\n".encode())
                reaper.stdin.flush()
        return runner.wait(timeout)
    finally:
        runner.kill_all()
        removed = remove_job(job)
        if removed:
            runner.note(f"removed shared memory left by job {job}: {', '.join(removed)}")


def _start_reaper(job: str) -> subprocess.Popen:
    """The process that removes ``job``'s shared memory should this launcher die without
    doing it (SIGKILL during init): :mod:`commflow.runtime._reaper`, in a session of its own,
    fed the ranks' pids on its standard input."""
    return subprocess.Popen(
        [sys.executable, "-I", "-S", str(Path(__file__).with_name("_reaper.py")), job],
        stdin=subprocess.PIPE, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
