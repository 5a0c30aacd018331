"""Removes a job's shared memory once its launcher is gone, however it went (SIGKILL too).

:mod:`commflow.runtime.launcher` runs this file as a script in a session of its own (the
standard library only: nothing of commflow is imported, so it starts in milliseconds). It reads
the ranks' process ids from standard input, one per line. End of input means the launcher has
exited or closed the pipe: the reaper then waits up to :data:`WAIT` seconds for those ranks to
exit (they get SIGKILL with their launcher) and removes every ``/dev/shm/commflow.<job>.*``
owned by this user, e.g. the segment a rank had created but not yet unlinked during init.
"""

import os
import sys
import time
from pathlib import Path

WAIT = 10.0
"""Seconds to wait for the ranks to exit before removing their segments anyway."""


def alive(pid: int) -> bool:
    """Whether process ``pid`` runs (a zombie does not)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, ProcessLookupError, IndexError):
        return False
    return state not in ("Z", "X")


def reap(job: str, pids: list[int]) -> None:
    """Wait for ``pids`` to exit (at most :data:`WAIT` s), then remove ``job``'s segments."""
    deadline = time.monotonic() + WAIT
    while any(alive(p) for p in pids) and time.monotonic() < deadline:
        time.sleep(0.02)
    for path in Path("/dev/shm").glob(f"commflow.{job}.*"):
        try:
            if path.stat().st_uid == os.getuid():
                path.unlink()
        except FileNotFoundError:
            continue


if __name__ == "__main__":
    reap(sys.argv[1], [int(line) for line in sys.stdin if line.strip()])
