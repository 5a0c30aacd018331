"""Loss and duplication injected into a UDP send path (this kernel has no netem).

``Faults(drop=p, duplicate=q, seed=s)`` drops each datagram with probability ``p`` and sends a
surviving one twice with probability ``q``, from its own seeded generator, so a run is
repeatable. ``Faults.from_env()`` reads ``COMMFLOW_INA_DROP``, ``COMMFLOW_INA_DUP`` and
``COMMFLOW_INA_SEED``; workers and the switch both send through :meth:`Faults.sendto`.
"""

from __future__ import annotations

import os
import socket
from collections.abc import Mapping
from dataclasses import dataclass, field

import numpy as np

from commflow.ina.protocol import InaError


@dataclass(kw_only=True)
class Faults:
    """Seeded loss and duplication on one sender."""

    drop: float = 0.0
    """Probability that a datagram is not sent."""
    duplicate: float = 0.0
    """Probability that a datagram that is sent goes out twice."""
    seed: int = 0
    """Seed of this sender's generator (give each sender its own)."""
    dropped: int = field(default=0, init=False)
    """Datagrams dropped so far."""
    duplicated: int = field(default=0, init=False)
    """Datagrams sent twice so far."""

    def __post_init__(self) -> None:
        for name, p in (("drop", self.drop), ("duplicate", self.duplicate)):
            if not 0.0 <= p < 1.0:
                raise InaError(f"ina faults: {name} probability {p} must be in [0, 1)")
        self._rng = np.random.default_rng(self.seed)

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None, *, salt: int = 0) -> Faults:
        """Faults from ``COMMFLOW_INA_DROP``/``_DUP``/``_SEED`` (default none); ``salt`` (a
        rank) is added to the seed so that senders differ."""
        env = os.environ if env is None else env
        try:
            return cls(drop=float(env.get("COMMFLOW_INA_DROP", 0)),
                       duplicate=float(env.get("COMMFLOW_INA_DUP", 0)),
                       seed=int(env.get("COMMFLOW_INA_SEED", 0)) + salt)
        except ValueError as e:
            raise InaError(f"ina faults: bad COMMFLOW_INA_DROP/DUP/SEED value ({e})") from None

    @property
    def active(self) -> bool:
        """Whether any fault is injected."""
        return self.drop > 0 or self.duplicate > 0

    def sendto(self, sock: socket.socket, data: bytes, addr: tuple[str, int]) -> None:
        """Send ``data`` to ``addr`` through the faults (a plain ``sendto`` when none)."""
        if self.drop and self._rng.random() < self.drop:
            self.dropped += 1
            return
        sock.sendto(data, addr)
        if self.duplicate and self._rng.random() < self.duplicate:
            self.duplicated += 1
            sock.sendto(data, addr)
