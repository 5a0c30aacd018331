"""Linux cross-memory attach through ctypes: ``process_vm_readv(2)`` and the ptrace permission
it needs (``prctl(PR_SET_PTRACER)`` where the Yama LSM restricts ptrace to ancestors).

A rank may read another process's memory when it may ptrace it: the same user and, under
Yama's ``ptrace_scope`` 1, only if the target named it (or any process) its ptracer, as Open
MPI's shared-memory transport does for its single-copy path. Scope 2 needs ``CAP_SYS_PTRACE``,
scope 3 forbids it.
"""

from __future__ import annotations

import ctypes
import errno
import os

_PR_SET_PTRACER = 0x59616D61
_PR_SET_PTRACER_ANY = ctypes.c_ulong(-1).value


class _Iovec(ctypes.Structure):
    _fields_ = [("base", ctypes.c_void_p), ("len", ctypes.c_size_t)]


_libc = ctypes.CDLL(None, use_errno=True)
_readv = _libc.process_vm_readv
_writev = _libc.process_vm_writev
for _fn in (_readv, _writev):
    _fn.restype = ctypes.c_ssize_t
    _fn.argtypes = [ctypes.c_int, ctypes.POINTER(_Iovec), ctypes.c_ulong,
                    ctypes.POINTER(_Iovec), ctypes.c_ulong, ctypes.c_ulong]
_prctl = _libc.prctl
_prctl.restype = ctypes.c_int
_prctl.argtypes = [ctypes.c_int, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong,
                   ctypes.c_ulong]
_allowed = False


def allow_readers() -> None:
    """Let processes of this user read this process's memory where Yama's ``ptrace_scope`` is
    1 (``PR_SET_PTRACER_ANY``); nothing where Yama is absent. Once per process."""
    global _allowed
    if not _allowed:
        _prctl(_PR_SET_PTRACER, _PR_SET_PTRACER_ANY, 0, 0, 0)  # EINVAL without Yama: fine
        _allowed = True


def ptrace_scope() -> int | None:
    """Yama's ``kernel.yama.ptrace_scope`` (0-3), or ``None`` where Yama is absent."""
    try:
        with open("/proc/sys/kernel/yama/ptrace_scope") as f:
            return int(f.read().strip())
    except (OSError, ValueError):
        return None


def read(pid: int, local: int, remote: int, nbytes: int, *, write: bool = False) -> int:
    """Copy ``nbytes`` from address ``remote`` of process ``pid`` to address ``local`` of this
    one (``write``: from ``local`` to ``remote``); returns 0, or the ``errno`` of the first
    failed call (``EPERM``: not permitted)."""
    here, there = _Iovec(local, nbytes), _Iovec(remote, nbytes)
    call = _writev if write else _readv
    while nbytes > 0:
        done = call(pid, here, 1, there, 1, 0)
        if done <= 0:
            return ctypes.get_errno() if done < 0 else errno.EIO
        nbytes -= done
        here.base += done
        there.base += done
        here.len = there.len = nbytes
    return 0


def probe(pid: int) -> int:
    """Whether this process may read process ``pid``: 0 if so, else the ``errno`` (``EPERM``,
    ``ESRCH``). Reads one byte at address 0, which fails with ``EFAULT`` once permitted."""
    if pid == os.getpid():
        return 0
    buf = ctypes.c_char()
    code = read(pid, ctypes.addressof(buf), 0, 1)
    return 0 if code == errno.EFAULT else code


def describe(code: int) -> str:
    """``"EPERM (Operation not permitted)"`` for an ``errno``."""
    return f"{errno.errorcode.get(code, str(code))} ({os.strerror(code)})"
