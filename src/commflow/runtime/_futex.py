"""Blocking waits on 32-bit words in shared memory: Linux futexes through ``syscall(2)``.

Used only by the shared-memory transport, after a short spin, so that ranks outnumbering cores
sleep instead of burning CPU. Waits always carry a timeout, so a lost wake-up costs at most
that timeout, never a hang.
"""

from __future__ import annotations

import ctypes
import os
import platform

from commflow.errors import CommflowError

_SYS_FUTEX = {"x86_64": 202, "aarch64": 98, "arm64": 98, "ppc64le": 221, "s390x": 238}
_FUTEX_WAIT = 0
_FUTEX_WAKE = 1


class _Timespec(ctypes.Structure):
    _fields_ = [("tv_sec", ctypes.c_long), ("tv_nsec", ctypes.c_long)]


def _syscall():
    machine = platform.machine()
    if os.uname().sysname != "Linux" or machine not in _SYS_FUTEX:
        raise CommflowError(
            f"shared-memory transport needs Linux futexes; unsupported platform "
            f"{os.uname().sysname}/{machine}: use the engine transport (torch/mpi) instead")
    libc = ctypes.CDLL(None, use_errno=True)
    fn = libc.syscall
    fn.restype = ctypes.c_long
    return fn, _SYS_FUTEX[machine]


_CALL, _NR = _syscall()


def futex_wait(address: int, expected: int, timeout: float) -> None:
    """Sleep while the int32 at ``address`` equals ``expected``, at most ``timeout`` seconds.

    Returns on a wake-up, a changed value, a signal or the timeout (callers re-check state).
    """
    seconds = int(timeout)
    ts = _Timespec(seconds, int((timeout - seconds) * 1e9))
    _CALL(_NR, ctypes.c_void_p(address), _FUTEX_WAIT, ctypes.c_int(expected), ctypes.byref(ts),
          None, 0)


def futex_wake(address: int, count: int = 1 << 30) -> None:
    """Wake up to ``count`` waiters sleeping on the int32 at ``address``."""
    _CALL(_NR, ctypes.c_void_p(address), _FUTEX_WAKE, ctypes.c_int(count), None, None, 0)
