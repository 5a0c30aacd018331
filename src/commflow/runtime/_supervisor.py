"""The launcher's event loop: rank processes, their output pipes and forwarded signals, all
watched by one selector in one thread (process exits through Linux pidfds)."""

from __future__ import annotations

import contextlib
import ctypes
import os
import selectors
import signal
import subprocess
import time
from collections.abc import Mapping, Sequence
from functools import partial
from typing import BinaryIO

from commflow.errors import CommflowError

MAX_LINE = 64 << 10
"""Bytes of one output line written at most; a longer line is written in pieces."""

_READ = 64 << 10


def describe_exit(code: int) -> str:
    """``"exited with code 3"`` or ``"was killed by signal 9 (SIGKILL)"`` for a return code as
    :class:`subprocess.Popen` reports it (negative: killed by that signal)."""
    if code >= 0:
        return f"exited with code {code}"
    try:
        name = f" ({signal.Signals(-code).name})"
    except ValueError:
        name = ""
    return f"was killed by signal {-code}{name}"


class LinePrefixer:
    """Cuts a byte stream into lines and writes each whole line to ``sink`` after ``prefix``.

    Lines longer than ``max_line`` bytes are written in pieces of ``max_line`` bytes, each as a
    line of its own; :meth:`close` ends an unterminated last line with a newline.
    """

    def __init__(self, prefix: bytes, sink: BinaryIO, max_line: int = MAX_LINE) -> None:
        self._prefix = prefix
        self._sink = sink
        self._max = max_line
        self._pending = bytearray()

    def _pieces(self, line: bytes | bytearray) -> list[bytes]:
        return [
            self._prefix + line[i : i + self._max] + b"\n"
            for i in range(0, max(len(line), 1), self._max)
        ]

    def _write(self, lines: list[bytes]) -> None:
        if lines:
            self._sink.write(b"".join(lines))
            self._sink.flush()

    def feed(self, data: bytes) -> None:
        """Take ``data`` and write every line it completes."""
        self._pending += data
        out = []
        end = self._pending.rfind(b"\n") + 1
        if end:
            for line in self._pending[: end - 1].split(b"\n"):
                out += self._pieces(line)
            del self._pending[:end]
        while len(self._pending) > self._max:
            out += self._pieces(self._pending[: self._max])
            del self._pending[: self._max]
        self._write(out)

    def close(self) -> None:
        """Write what is left as a last line."""
        if self._pending:
            self._write(self._pieces(self._pending))
            self._pending.clear()


class Supervisor:
    """Starts ranks, relays their output, forwards signals and stops the job when one fails.

    ``stdout``/``stderr`` receive the ranks' prefixed lines and, on ``stderr``, the launcher's
    own messages; ``grace`` is the time (s) between a forwarded signal and SIGKILL. With
    ``keep_going`` a rank killed by a signal does not stop the others (they may shrink past
    it) unless it is the last: the job then succeeds when every rank that was not killed exits
    0.
    """

    def __init__(self, *, stdout: BinaryIO, stderr: BinaryIO, grace: float,
                 keep_going: bool = False) -> None:
        self._keep_going = keep_going
        self._stdout = stdout
        self._stderr = stderr
        self._grace = grace
        self._sel = selectors.DefaultSelector()
        self._live: dict[int, subprocess.Popen] = {}
        self._pipes: dict[BinaryIO, LinePrefixer] = {}
        self._status: int | None = None
        self.failed_rank: int | None = None
        """The rank whose failure stopped the job (``None``: none did, or a signal or the
        timeout stopped it first)."""
        self._kill_at: float | None = None
        self._wake_r, self._wake_w = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
        self._sel.register(self._wake_r, selectors.EVENT_READ, self._on_wake)

    def note(self, message: str) -> None:
        """Write a launcher message to ``stderr``."""
        self._stderr.write(f"[commflow run] {message}\n".encode())
        self._stderr.flush()

    def on_signal(self, signum: int, _frame: object = None) -> None:
        """Signal handler: queue ``signum`` for forwarding by :meth:`wait`."""
        with contextlib.suppress(BlockingIOError):
            os.write(self._wake_w, bytes([signum]))

    def start(self, rank: int, argv: Sequence[str], env: Mapping[str, str], prefix: bytes) -> int:
        """Start ``rank`` in a process group of its own, its output prefixed with ``prefix``;
        returns its process id.

        Raises ``CommflowError`` when the command cannot be executed."""
        try:
            proc = subprocess.Popen(
                argv,
                env=dict(env),
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                process_group=0,
                preexec_fn=_die_with_parent,
            )
        except OSError as error:
            raise CommflowError(
                f"cannot start rank {rank}: {argv[0]}: {error.strerror}; check the command's "
                f"name and path"
            ) from None
        self._live[rank] = proc
        self._sel.register(
            os.pidfd_open(proc.pid), selectors.EVENT_READ, partial(self._on_exit, rank)
        )
        for pipe, sink in ((proc.stdout, self._stdout), (proc.stderr, self._stderr)):
            os.set_blocking(pipe.fileno(), False)
            self._pipes[pipe] = LinePrefixer(prefix, sink)
            self._sel.register(pipe, selectors.EVENT_READ, self._on_output)
        return proc.pid

    def wait(self, timeout: float | None) -> int:
        """Run until every rank has exited; stop them all after ``timeout`` seconds. Returns the
        job's exit status (see :func:`commflow.runtime.launcher.launch`)."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while self._live:
            now = time.monotonic()
            if deadline is not None and now >= deadline:
                deadline = None
                if self._status is None:
                    self._status = 124
                    self.note(f"timed out after {timeout:g} s; stopping the ranks")
                    self._stop(signal.SIGTERM)
            if self._kill_at is not None and now >= self._kill_at:
                self._kill_at = None
                self.note(f"ranks {sorted(self._live)} still running; sending SIGKILL")
                self._signal_live(signal.SIGKILL)
            wakes = [t for t in (deadline, self._kill_at) if t is not None]
            self._dispatch(max(0.0, min(wakes) - now) if wakes else None)
        drain_until = time.monotonic() + self._grace
        while self._pipes and (left := drain_until - time.monotonic()) > 0:
            self._dispatch(left)
        return self._status or 0

    def kill_all(self) -> None:
        """SIGKILL every rank still running and reap it."""
        self._signal_live(signal.SIGKILL)
        for proc in self._live.values():
            proc.wait()
        self._live.clear()

    def close(self) -> None:
        """Release pipes, pidfds and the selector (after :meth:`wait` or :meth:`kill_all`)."""
        for pipe, prefixer in self._pipes.items():
            prefixer.close()
            pipe.close()
        self._pipes.clear()
        for key in list(self._sel.get_map().values()):
            if isinstance(key.fileobj, int) and key.fileobj != self._wake_r:
                os.close(key.fileobj)
        self._sel.close()
        os.close(self._wake_r)
        os.close(self._wake_w)

    def _dispatch(self, timeout: float | None) -> None:
        for key, _ in self._sel.select(timeout):
            key.data(key.fileobj)

    def _signal_live(self, signum: int) -> None:
        for proc in self._live.values():
            try:
                os.killpg(proc.pid, signum)
            except (ProcessLookupError, PermissionError):
                continue

    def _stop(self, signum: int) -> None:
        self._signal_live(signum)
        if self._kill_at is None:
            self._kill_at = time.monotonic() + self._grace

    def _on_output(self, pipe: BinaryIO) -> bool:
        """Relay what ``pipe`` holds; False once it is empty for now or closed."""
        try:
            data = os.read(pipe.fileno(), _READ)
        except BlockingIOError:
            return False
        if data:
            self._pipes[pipe].feed(data)
            return True
        self._sel.unregister(pipe)
        self._pipes.pop(pipe).close()
        pipe.close()
        return False

    def _on_exit(self, rank: int, pidfd: int) -> None:
        self._sel.unregister(pidfd)
        os.close(pidfd)
        proc = self._live.pop(rank)
        code = proc.wait()
        for pipe in (proc.stdout, proc.stderr):  # its last words come before our message
            while pipe in self._pipes and self._on_output(pipe):
                pass
        if code == 0 or self._status is not None:
            return
        if self._keep_going and code < 0 and self._live:
            self.note(f"rank {rank} {describe_exit(code)}; ranks {sorted(self._live)} keep "
                      f"running (--keep-going)")
            return
        self._status = code if code > 0 else 128 - code
        self.failed_rank = rank
        others = f"; stopping ranks {sorted(self._live)}" if self._live else ""
        self.note(f"rank {rank} {describe_exit(code)}{others}")
        self._stop(signal.SIGTERM)

    def _on_wake(self, fd: int) -> None:
        for signum in os.read(fd, 64):
            name = signal.Signals(signum).name
            if self._kill_at is not None:
                self.note(f"got {name} again; killing the ranks")
                self._signal_live(signal.SIGKILL)
                continue
            if self._status is None:
                self._status = 128 + signum
            self.note(f"got {name}; forwarding it to ranks {sorted(self._live)}")
            self._stop(signum)


def _die_with_parent() -> None:
    """In the child before exec: get SIGKILL if the launcher dies (even by SIGKILL itself), so
    no rank outlives it."""
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)


_PR_SET_PDEATHSIG = 1
