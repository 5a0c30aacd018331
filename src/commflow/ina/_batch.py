"""Preallocated receive buffers for the switch's batches: what ``recvmmsg`` would fill,
read with ``recvfrom_into`` without blocking."""

from __future__ import annotations

import socket

import numpy as np

Address = tuple[str, int]


class Batch:
    """Preallocated receive buffers for :meth:`Switch.handle_batch`: ``size`` datagrams of up
    to 64 KiB, their lengths and senders, and the kernel's per-datagram outputs."""

    def __init__(self, size: int = 64) -> None:
        self.buf = np.zeros((size, 65536), np.uint8)
        self.lens = np.zeros(size, np.int64)
        self.addrs: list[Address] = [("", 0)] * size
        self.views = [memoryview(self.buf[i]) for i in range(size)]
        self.code = np.zeros(size, np.int64)
        self.where = np.zeros(size, np.int64)
        self.counters = np.zeros(5, np.int64)

    def receive(self, sock: socket.socket, start: int = 0) -> int:
        """Read the datagrams waiting on ``sock`` without blocking into rows ``start`` and on
        (up to the batch size); returns the rows filled, ``start`` included."""
        n = start
        while n < len(self.views):
            try:
                size, addr = sock.recvfrom_into(self.views[n], 0, socket.MSG_DONTWAIT)
            except (BlockingIOError, InterruptedError):
                break
            except ConnectionError:
                continue
            self.lens[n], self.addrs[n] = size, addr
            n += 1
        return n
