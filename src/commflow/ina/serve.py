"""The software aggregation switch on UDP: :func:`run_switch` serves a
:class:`~commflow.ina.switch.Switch` (``commflow ina switch`` runs it)."""

from __future__ import annotations

import select
import threading
import time
from collections.abc import Callable

from commflow.ina._batch import Batch
from commflow.ina._sockets import open_socket
from commflow.ina.faults import Faults
from commflow.ina.switch import Switch, SwitchStats

Address = tuple[str, int]


def run_switch(host: str = "127.0.0.1", port: int = 0, nranks: int = 2, slots: int = 64, *,
               values: int = 256, faults: Faults | None = None, lease: float = 30.0,
               stop: threading.Event | None = None,
               ready: Callable[[Address], None] | None = None) -> SwitchStats:
    """Serve a :class:`Switch` on UDP ``host:port`` (loopback by default; port 0: any free
    one) until ``stop`` is set; ``ready`` is called with the bound address first. Reads the
    datagrams waiting in batches and aggregates each batch with the compiled kernel
    (:meth:`Switch.handle_batch`). Every send goes through ``faults``. Returns the switch's
    statistics."""
    switch = Switch(nranks, slots, values=values, lease=lease)
    faults = faults or Faults()
    stop = stop or threading.Event()
    sock = open_socket(host, port, 32 << 20)
    poller = select.poll()
    poller.register(sock, select.POLLIN)
    batch = Batch()
    try:
        if ready is not None:
            ready(sock.getsockname())
        checked = time.monotonic()
        while not stop.is_set():
            count = batch.receive(sock)
            now = time.monotonic()
            if not count:
                poller.poll(200)
            for out, dst in switch.handle_batch(batch, count, now):
                try:
                    faults.sendto(sock, out, dst)
                except OSError:
                    switch.stats.last_error = f"send to {dst[0]}:{dst[1]} failed"
            if now - checked > 1.0:
                switch.expire(now)
                checked = now
    finally:
        sock.close()
    return switch.stats
