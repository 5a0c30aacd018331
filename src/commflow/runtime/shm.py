"""Owner-only POSIX shared-memory segments (``/dev/shm``), mapped with ``mmap``.

Segments are named ``commflow.<job>.<suffix>``. The creator unlinks the name as soon as every
rank has attached (the memory then lives only as long as the mappings), and at exit if that
never happened; the launcher removes a crashed job's leftovers with :func:`remove_job`.
"""

from __future__ import annotations

import atexit
import mmap
import os
import re
import stat
import time
from pathlib import Path

import numpy as np

from commflow.errors import CommflowError

SHM_DIR = Path("/dev/shm")
_NAME_RE = re.compile(r"^[A-Za-z0-9_.-]{1,200}$")


def segment_name(job: str, suffix: str) -> str:
    """The segment name for ``job`` and ``suffix``; both must be plain tokens."""
    name = f"commflow.{job}.{suffix}"
    if not _NAME_RE.match(name):
        raise CommflowError(f"bad shared-memory name {name!r}: use letters, digits, '.', '_', '-'")
    return name


def reserve(fd: int, size: int, path: Path) -> None:
    """Size the file ``fd`` to ``size`` bytes and reserve its pages now (``posix_fallocate``):
    a tmpfs only sized by ``ftruncate`` would kill the first rank that touches a page past its
    free space with SIGBUS. Raises ``CommflowError`` naming the space needed and free."""
    try:
        os.ftruncate(fd, size)
        os.posix_fallocate(fd, 0, size)
    except OSError as err:
        info = os.statvfs(path.parent)
        have = info.f_bavail * info.f_frsize
        raise CommflowError(
            f"not enough shared memory in {path.parent} for {path.name}: need {size / 2**20:.1f} "
            f"MiB, have {have / 2**20:.1f} MiB free ({err.strerror}); enlarge it (docker run "
            f"--shm-size=1g, or mount -o remount,size=1G {path.parent}) or run fewer ranks per "
            f"host") from None


class SharedRegion:
    """A shared-memory segment mapped into this process."""

    def __init__(self, name: str, fd: int, size: int, owner: bool) -> None:
        self.name = name
        self.size = size
        self.owner = owner
        self._map = mmap.mmap(fd, size)
        os.close(fd)
        self._base = np.frombuffer(self._map, dtype=np.uint8)
        self._linked = owner
        if owner:
            atexit.register(self.unlink)

    @classmethod
    def create(cls, name: str, size: int) -> SharedRegion:
        """Create ``name`` with ``size`` bytes, readable and writable by this user only.

        Raises ``CommflowError`` if it already exists (a previous job with the same id)."""
        path = SHM_DIR / name
        try:
            fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_RDWR, stat.S_IRUSR | stat.S_IWUSR)
        except FileExistsError:
            raise CommflowError(
                f"shared memory {path} already exists: another job uses the same id, or a "
                f"crashed one left it; remove it or choose another job id") from None
        try:
            reserve(fd, size, path)
        except CommflowError:
            os.close(fd)
            path.unlink(missing_ok=True)
            raise
        return cls(name, fd, size, owner=True)

    @classmethod
    def attach(cls, name: str, size: int, timeout: float) -> SharedRegion:
        """Map the existing segment ``name`` once it exists with ``size`` bytes, waiting up to
        ``timeout`` seconds for its creator. Raises ``CommflowError`` on timeout or when the
        segment belongs to another user."""
        path = SHM_DIR / name
        deadline = time.monotonic() + timeout
        delay = 1e-4
        while True:
            try:
                fd = os.open(path, os.O_RDWR)
                info = os.fstat(fd)
                if info.st_uid != os.getuid() or info.st_mode & 0o077:
                    os.close(fd)
                    raise CommflowError(f"shared memory {path} is not owner-only for this user; "
                                        f"refusing to attach")
                if info.st_size == size:
                    return cls(name, fd, size, owner=False)
                os.close(fd)
            except FileNotFoundError:
                pass
            if time.monotonic() > deadline:
                raise CommflowError(f"timed out after {timeout:.0f} s waiting for shared memory "
                                    f"{path} from its creator (local rank 0); did it start?")
            time.sleep(delay)
            delay = min(delay * 2, 0.05)

    def array(self, dtype: np.dtype | type, offset: int, count: int) -> np.ndarray:
        """A numpy view of ``count`` items of ``dtype`` at byte ``offset``."""
        dt = np.dtype(dtype)
        return self._base[offset:offset + count * dt.itemsize].view(dt)

    def address(self, offset: int) -> int:
        """Virtual address of byte ``offset`` in this process."""
        return self._base.ctypes.data + offset

    def unlink(self) -> None:
        """Remove the name (the memory stays mapped until every process unmaps it)."""
        if self._linked:
            (SHM_DIR / self.name).unlink(missing_ok=True)
            self._linked = False


def remove_job(job: str) -> list[str]:
    """Remove every segment of ``job`` owned by this user; returns the names removed."""
    removed = []
    prefix = f"commflow.{job}."
    for path in SHM_DIR.glob(prefix + "*"):
        try:
            if path.stat().st_uid == os.getuid():
                path.unlink()
                removed.append(path.name)
        except FileNotFoundError:
            continue
    return removed
