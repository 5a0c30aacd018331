"""What the switch's workers and the end-host ring share: counters and the adaptive
retransmission timeout."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class WorkerStats:
    """What one ``ina_allreduce`` (or ``udp_ring_allreduce``) call did on this rank."""

    sent: int = 0
    """Datagrams sent (retransmissions included)."""
    retransmits: int = 0
    """Datagrams sent again after a timeout."""
    results: int = 0
    """Switch results used."""
    group_results: int = 0
    """Of those, results the switch sent once to the job's multicast group."""
    duplicates: int = 0
    """Results (or ring packets) already used or for another phase (ignored)."""
    malformed: int = 0
    """Datagrams that failed validation, or were not from the switch or not for this worker
    (ignored)."""
    send_errors: int = 0
    """Sends the kernel refused (counted as lost; the timer resends)."""
    slots: int = 0
    """Slots the switch granted (0: it had none)."""
    fell_back: bool = False
    """Whether the sum was computed by the end-host fallback."""
    rto: float = 0.0
    """Retransmission timeout at the end (seconds)."""


class Rto:
    """Adaptive retransmission timeout (RFC 6298), seconds: starts at ``initial`` held in
    ``[lo, hi]``."""

    def __init__(self, initial: float, lo: float, hi: float) -> None:
        self.value, self.lo, self.hi = min(hi, max(lo, initial)), lo, hi
        self.srtt: float | None = None
        self.var = 0.0
        self._backed_off = 0.0

    def sample(self, rtt: float) -> None:
        if self.srtt is None:
            self.srtt, self.var = rtt, rtt / 2
        else:
            self.var = 0.75 * self.var + 0.25 * abs(self.srtt - rtt)
            self.srtt = 0.875 * self.srtt + 0.125 * rtt
        self.value = min(self.hi, max(self.lo, self.srtt + 4 * self.var))

    def backoff(self, now: float) -> None:
        """Double the timeout, once per timeout interval (a burst of expiries is one loss
        event, not one per slot)."""
        if now - self._backed_off >= self.value:
            self.value = min(self.hi, 2 * self.value)
            self._backed_off = now
