"""The engine wire over torch.distributed's gloo: a private ``ProcessGroupGloo`` (the default
process group is left alone) whose rendezvous goes through a TCPStore at
``MASTER_ADDR:MASTER_PORT``.

Gloo's send/recv work objects report completion only from a blocking ``wait()``, so each
``(peer, direction, tag)`` lane has a thread that waits on its requests in order (gloo keeps
each lane in order) and signals every completion; the engine never blocks on gloo itself.

Exit: a lane thread still blocked in gloo's ``wait()`` when the interpreter finalizes (a
request that can no longer complete after a peer died) would be ended by the interpreter,
from inside gloo's C++ frames, as soon as that wait returns (another peer exiting closes the
connection), and that aborts the whole process (SIGABRT, "terminate called without an active
exception") instead of letting it exit with its own error. Nothing in gloo cancels a pending
wait (neither ``abort()``, ``shutdown()`` nor destroying the group), so an exit hook
(:func:`_exit_if_blocked`) ends such a process with ``os._exit`` after flushing the standard
streams: status 1 after an uncaught exception (its traceback already printed), else 0. Exit
handlers registered before this module was imported do not run then.
"""

from __future__ import annotations

import atexit
import ipaddress
import os
import queue
import socket
import sys
import threading
import weakref
from collections.abc import Callable, Mapping
from datetime import timedelta

import numpy as np

from commflow.errors import CommflowError
from commflow.runtime.errors import CommAbortedError

_LONG = timedelta(days=1)
"""Gloo's own deadline for one request; commflow's deadlines come first."""


class GlooRequest:
    """A gloo send or receive watched by a lane thread."""

    __slots__ = ("work", "tensor", "finished", "error")

    def __init__(self, work, tensor) -> None:
        self.work, self.tensor = work, tensor
        self.finished = False
        self.error: str | None = None

    def done(self) -> bool:
        """True once complete; ``CommAbortedError`` with gloo's message when it failed."""
        if self.error is not None:
            raise CommAbortedError(f"gloo: {self.error}")
        return self.finished


class _Lane:
    """A thread that waits on one lane's requests in order and reports each completion."""

    def __init__(self, name: str, notify: Callable[[], None]) -> None:
        self.requests: queue.SimpleQueue[GlooRequest] = queue.SimpleQueue()
        self.notify = notify
        self.waiting = False
        """True while the thread is (about to be) inside gloo's ``wait()``."""
        threading.Thread(target=self.run, name=name, daemon=True).start()

    def blocked(self) -> bool:
        """Whether the thread is in, or has requests to take into, gloo's ``wait()``."""
        return self.waiting or not self.requests.empty()

    def run(self) -> None:
        while True:
            request = self.requests.get()
            self.waiting = True
            try:
                request.work.wait(_LONG)
            except Exception as err:  # a failed request; the lane serves the next one
                request.error = str(err).splitlines()[0]
            self.waiting = False
            request.finished = True
            self.notify()


_WIRES: weakref.WeakSet[GlooWire] = weakref.WeakSet()
"""Every open gloo wire of this process, for :func:`_exit_if_blocked`."""


def _exit_if_blocked() -> None:
    """At interpreter exit: when a lane thread is blocked in gloo's ``wait()``, end the
    process now (see the module docstring) rather than let finalization abort it."""
    if not any(lane.blocked() for wire in list(_WIRES) for lane in list(wire.lanes.values())):
        return
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (AttributeError, OSError, ValueError):
            continue
    os._exit(1 if getattr(sys, "last_value", None) is not None else 0)


atexit.register(_exit_if_blocked)


class GlooWire:
    """Tagged point-to-point messages over a gloo process group; see :class:`.wire.Wire`."""

    polled = False
    threaded = True

    def __init__(self, group, store, rank: int, size: int) -> None:
        self.group = group
        self.store = store
        self.rank = rank
        self.size = size
        self.lanes: dict[tuple[int, bool, int], _Lane] = {}
        self._lanes_lock = threading.Lock()
        self.gathers = 0
        self.on_complete: Callable[[], None] = lambda: None
        _WIRES.add(self)

    @classmethod
    def connect(
        cls, *, rank: int, size: int, job: str, timeout: float, env: Mapping[str, str],
        store=None,
    ) -> GlooWire:
        """Join the job's gloo group: rank 0 serves the TCPStore at ``MASTER_ADDR:MASTER_PORT``
        (torchrun's agent serves it when ``TORCHELASTIC_USE_AGENT_STORE`` is set; an
        initialised default process group lends its store, and ``store``, a torch store, is
        used when given: torch's own rendezvous already serves that port). Gloo listens on the
        address that routes to ``MASTER_ADDR``, or on ``GLOO_SOCKET_IFNAME``. Raises
        ``CommflowError`` when the variables are missing or not every rank joins within
        ``timeout`` s."""
        import torch.distributed as dist

        try:
            addr, port = env["MASTER_ADDR"], int(env["MASTER_PORT"])
        except (KeyError, ValueError):
            raise CommflowError(
                f"rank {rank}: ranks on several hosts meet through torch.distributed's "
                f"TCPStore: set MASTER_ADDR and MASTER_PORT (commflow run --hosts, torchrun and "
                f"mpirun -x do), or choose COMMFLOW_ENGINE=mpi under mpirun"
            ) from None
        wait = timedelta(seconds=timeout)
        ifname = env.get("GLOO_SOCKET_IFNAME")
        if ifname and not os.path.exists(f"/sys/class/net/{ifname}"):
            have = ", ".join(sorted(os.listdir("/sys/class/net")))
            raise CommflowError(
                f"rank {rank}: gloo rendezvous at {addr}:{port}: GLOO_SOCKET_IFNAME={ifname} "
                f"names no network interface of this host (it has: {have}); fix or unset it"
            )
        try:
            if store is not None:
                base = store
            elif dist.is_initialized():
                base = dist.distributed_c10d._get_default_store()
            else:
                serve = rank == 0 and env.get("TORCHELASTIC_USE_AGENT_STORE") != "True"
                base = dist.TCPStore(
                    addr, port, size, serve, timeout=wait, wait_for_workers=False,
                    master_listen_fd=_loopback_listener(addr, port) if serve else None,
                )
            store = dist.PrefixStore(f"commflow/{job}/", base)
            device = (
                dist.ProcessGroupGloo.create_device(interface=ifname)
                if ifname
                else dist.ProcessGroupGloo.create_device(hostname=_route_address(addr, port))
            )
            options = dist.ProcessGroupGloo._Options()
            options._timeout = wait
            options._devices = [device]
            group = dist.ProcessGroupGloo(store, rank, size, options)
        except (RuntimeError, OSError) as err:
            raise CommflowError(
                f"rank {rank}: gloo rendezvous at {addr}:{port} failed: "
                f"{str(err).splitlines()[0]}; did all {size} ranks start with the same "
                f"MASTER_ADDR/MASTER_PORT within {timeout:.0f} s?"
            ) from err
        return cls(group, store, rank, size)

    def _watch(self, work, tensor, peer: int, sending: bool, tag: int) -> GlooRequest:
        request = GlooRequest(work, tensor)
        key = (peer, sending, tag)
        with self._lanes_lock:  # operations in flight together post from several threads
            lane = self.lanes.get(key)
            if lane is None:
                lane = _Lane(
                    f"commflow-gloo-{'send' if sending else 'recv'}-{peer}-{tag}",
                    lambda: self.on_complete(),
                )
                self.lanes[key] = lane
        lane.requests.put(request)
        return request

    def _post(self, data: np.ndarray, peer: int, tag: int, sending: bool) -> GlooRequest:
        import torch

        tensor = torch.from_numpy(data)
        try:
            post = self.group.send if sending else self.group.recv
            work = post([tensor], peer, tag)
        except RuntimeError as err:  # the pair to peer has failed already
            raise CommAbortedError(f"gloo: {str(err).splitlines()[0]}") from None
        return self._watch(work, tensor, peer, sending, tag)

    def isend(self, data: np.ndarray, peer: int, tag: int) -> GlooRequest:
        """Start sending ``data``'s bytes to ``peer``."""
        return self._post(data, peer, tag, True)

    def irecv(self, data: np.ndarray, peer: int, tag: int) -> GlooRequest:
        """Start receiving at most ``len(data)`` bytes from ``peer`` into ``data``."""
        return self._post(data, peer, tag, False)

    def allgather(self, data: bytes) -> list[bytes]:
        """Every rank's ``data``, through the store."""
        self.gathers += 1
        key = f"allgather/{self.gathers}"
        self.store.set(f"{key}/{self.rank}", data)
        return [bytes(self.store.get(f"{key}/{r}")) for r in range(self.size)]


def _route_address(addr: str, port: int) -> str:
    """This machine's address on the route to ``addr`` (a UDP connect sends nothing)."""
    family, kind, proto, _, sockaddr = socket.getaddrinfo(addr, port, type=socket.SOCK_DGRAM)[0]
    with socket.socket(family, kind, proto) as probe:
        probe.connect(sockaddr)
        return probe.getsockname()[0]


def _loopback_listener(addr: str, port: int) -> int | None:
    """A socket listening on ``addr:port`` when ``addr`` is a loopback address (its descriptor,
    handed to the TCPStore, which otherwise listens on every interface), else ``None``."""
    family, kind, proto, _, sockaddr = socket.getaddrinfo(addr, port, type=socket.SOCK_STREAM)[0]
    if not ipaddress.ip_address(sockaddr[0]).is_loopback:
        return None
    sock = socket.socket(family, kind, proto)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind(sockaddr)
        sock.listen(128)
    except OSError:
        sock.close()
        raise
    return sock.detach()
