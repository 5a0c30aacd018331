"""A software switch's jobs: each job's session record (its granted slots, who joined and
left, held JOINs, agreed first exponents) and the table of grants the compiled kernel reads."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from commflow.ina.protocol import WIRE, Header

Address = tuple[str, int]


@dataclass
class Job:
    """One job's current session on the switch."""

    session: int
    slots: list[int]
    addrs: list[Address | None]
    groups: list[int]
    calls: list[int]
    group: Address | None = None
    joined: int = 0
    left: int = 0
    active: float = 0.0
    waiting: dict[int, tuple[Header, bytes, Address]] = field(default_factory=dict)
    """JOINs of the next session, held until every worker has left this one."""
    exps: dict[int, np.ndarray] = field(default_factory=dict)
    """Per worker whose JOIN carried them: each slot's first block exponent."""
    first: bytes = b""
    """The ``JOINED`` payload: the agreed first exponents, or none (phase 0 runs)."""

    def keep_first_exponents(self, h: Header, payload: bytes, values: int) -> None:
        """Keep the JOIN's first block exponents when they are for the switch's ``values``
        per packet and cover every granted slot (a JOIN of a new call replaces the last
        one's)."""
        grant = len(self.slots)
        self.exps.pop(h.worker, None)
        if grant and h.exp == values and h.count >= grant:
            self.exps[h.worker] = np.frombuffer(payload, WIRE, grant).astype(np.int64)


def grant_table(jobs: dict[int, Job]) -> tuple:
    """The jobs holding slots as arrays for the kernel: job ids, sessions, granted slots (one
    row a job), grant counts, and the job ids as a list."""
    held = [(j, job) for j, job in jobs.items() if job.slots]
    width = max([len(job.slots) for _, job in held], default=1)
    grants = np.zeros((max(1, len(held)), width), np.int64)
    for k, (_, job) in enumerate(held):
        grants[k, :len(job.slots)] = job.slots
    return (np.array([j for j, _ in held], np.int64),
            np.array([job.session for _, job in held], np.int64), grants,
            np.array([len(job.slots) for _, job in held], np.int64),
            [j for j, _ in held])
