"""Event simulation of training iterations: one compute stream, one communication link.

Compute tasks run one at a time in stream order, each once the collectives it waits for are
complete. A collective is released when its compute task ends and the collectives before it
are complete, seen at the next fusion cycle, and served by the policy (:mod:`.policies`):

- **messages** (not preemptive): when fewer than ``credits`` are in flight, the most urgent
  ready collective (ready order or layer priority) sends its next partition, or with fusion
  ready collectives up to the fusion size; a message spends its latency, then holds the link
  for its transfer after the messages before it; it cannot be taken back;
- **preemptive**: the link serves the most urgent ready collective's remaining work (latency
  and transfer, in seconds) at every instant, switching when a more urgent one arrives.

The iteration time is the steady-state period: the time between the starts of the first
forward task of the last two iterations.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from commflow.sched.cost import CommCost
from commflow.sched.policies import Graph, Policy, build, get_policy
from commflow.sched.workload import ScheduleError, Workload

EPS = 1e-12
ITERATIONS = 6
"""Iterations simulated by default (the period settles within a few)."""


@dataclass(frozen=True)
class Span:
    """One interval on a lane (``compute`` or ``comm``), seconds."""

    lane: str
    name: str
    iteration: int
    start: float
    end: float


@dataclass(frozen=True)
class Schedule:
    """The result of :func:`simulate`."""

    workload: Workload
    policy: Policy
    cost: CommCost
    iteration_time: float
    """Steady-state seconds per iteration."""
    iteration_starts: tuple[float, ...]
    """When each iteration's first forward task started."""
    lower_bound: float
    """:func:`lower_bound` of the workload under the policy."""
    spans: tuple[Span, ...]

    @property
    def compute_time(self) -> float:
        """Seconds of compute per iteration."""
        return self.workload.forward_time + self.workload.backward_time

    @property
    def exposed(self) -> float:
        """Seconds per iteration the compute stream waits for communication."""
        return self.iteration_time - self.compute_time


def lower_bound(workload: Workload, cost: CommCost, policy: Policy | str = "fifo") -> float:
    """No schedule beats this, seconds per iteration (the toy's ``max(F + B + c0, C)``,
    generalised).

    Layer ``k``'s gradient is ready when its backward ends and its next forward needs it
    reduced (``c_k``, its allreduce alone on the link); in between, the compute stream runs
    the backward and forward of the layers below it (``R_k``), which may hide ``c_k``: a
    period holds at least ``S_k + max(c_k, R_k)``, with ``S_k`` the forward and backward of
    layers ``k`` and up. The link carries every byte: ``C`` = one latency plus the transfer
    of all gradients. Sharded policies move 1.5 times the bytes (two all-gathers and a
    reduce-scatter per parameter) and are bounded by ``max(F + B, C)`` with that ``C``.
    Layers without gradient bytes send nothing.
    """
    policy = get_policy(policy)
    layers = workload.layers
    compute = workload.forward_time + workload.backward_time
    if policy.sharded:
        moved = sum(2 * cost.transfer("allgather", layer.grad_bytes)
                    + cost.transfer("reducescatter", layer.grad_bytes) for layer in layers)
        return max(compute, cost.latency("allgather") + moved if moved else 0.0)
    bound, below = compute, 0.0
    for layer in layers:
        if layer.grad_bytes > 0:
            reduce = cost.time("allreduce", layer.grad_bytes)
            bound = max(bound, compute - below + max(reduce, below))
        below += layer.forward + layer.backward
    if workload.grad_bytes > 0:
        bound = max(bound, cost.time("allreduce", workload.grad_bytes))
    return bound


def simulate(workload: Workload, policy: Policy | str, cost: CommCost, *,
             iterations: int = ITERATIONS) -> Schedule:
    """``iterations`` iterations of ``workload`` under ``policy`` on a link of ``cost``.

    Raises ``ScheduleError`` for fewer than two iterations or an unknown policy.
    """
    policy = get_policy(policy)
    if iterations < 2:
        raise ScheduleError(f"simulate needs >= 2 iterations for a period (got {iterations})")
    graph = build(workload, policy, iterations)
    spans = _Run(graph, policy, cost).run()
    starts = tuple(s.start for s in spans if s.lane == "compute" and s.name == "F0")
    return Schedule(workload, policy, cost, starts[-1] - starts[-2], starts,
                    lower_bound(workload, cost, policy), tuple(spans))


def drain(workload: Workload, policy: Policy | str, cost: CommCost) -> float:
    """Seconds from the end of one backward pass until its last gradient is reduced (one
    iteration, nothing after it: what an optimizer step that needs every gradient waits).

    Raises ``ScheduleError`` for policies that finish in the next forward (``dear``,
    ``fsdp``).
    """
    policy = get_policy(policy)
    if policy.decompose or policy.sharded:
        raise ScheduleError(f"policy {policy.name!r} finishes its collectives in the next "
                            "forward; drain applies to allreduce policies")
    spans = _Run(build(workload, policy, 1), policy, cost).run(drain=True)
    compute = max(s.end for s in spans if s.lane == "compute")
    return max([0.0, *(s.end - compute for s in spans if s.lane == "comm")])


class _Run:
    """The state of one simulation."""

    def __init__(self, graph: Graph, policy: Policy, cost: CommCost) -> None:
        self.graph, self.policy, self.cost = graph, policy, cost
        nops = len(graph.ops)
        self.left = [op.nbytes for op in graph.ops]
        """Bytes not yet sent (messages) or seconds of work left (preemptive)."""
        if policy.preemptive:
            self.left = [cost.time(op.kind, op.nbytes) for op in graph.ops]
        self.tol = [EPS * left for left in self.left]
        """What is left of a collective when it is all sent (rounding)."""
        self.flying = [0] * nops
        self.done = [False] * nops
        self.blockers = [len(op.after_ops) + (op.after_task >= 0) for op in graph.ops]
        self.dependents: list[list[int]] = [[] for _ in range(nops)]
        self.released_by: list[list[int]] = [[] for _ in graph.tasks]
        for j, op in enumerate(graph.ops):
            for k in op.after_ops:
                self.dependents[k].append(j)
            if op.after_task >= 0:
                self.released_by[op.after_task].append(j)
        self.seen = [math.inf] * nops
        self.release_time = [math.inf] * nops
        self.messages: list[tuple[float, list[tuple[int, float]]]] = []
        self.link_free = 0.0
        self.spans: list[Span] = []

    def run(self, *, drain: bool = False) -> list[Span]:
        """Every span until the last compute task ends (``drain``: until every collective
        is complete too)."""
        graph, t = self.graph, 0.0
        for j in range(len(graph.ops)):
            if self.blockers[j] == 0:
                self._release(j, 0.0)
        task, task_end = 0, math.inf
        serving = -1
        while True:
            if task_end <= t + EPS:
                for j in self.released_by[task - 1]:
                    self._unblock(j, task_end)
                task_end = math.inf
            for end, parts in [m for m in self.messages if m[0] <= t + EPS]:
                self.messages.remove((end, parts))
                for j, _ in parts:
                    self.flying[j] -= 1
                    self._finish_if_sent(j, end)
            if task == len(graph.tasks) and task_end == math.inf and (
                    not drain or all(self.done)):
                return self.spans
            if task_end == math.inf and task < len(graph.tasks) and all(
                    self.done[j] for j in graph.tasks[task].waits):
                current = graph.tasks[task]
                task_end = t + current.duration
                self.spans.append(Span("compute", current.name, current.iteration, t,
                                       task_end))
                task += 1
                continue
            if self.policy.preemptive:
                serving = self._most_urgent(t)
            else:
                while len(self.messages) < self.policy.credits and self._send(t):
                    pass
            t = self._advance(t, task_end, serving)

    def _release(self, j: int, when: float) -> None:
        cycle = self.policy.cycle
        self.release_time[j] = when
        self.seen[j] = math.ceil(when / cycle - 1e-9) * cycle if cycle else when
        self._finish_if_sent(j, when)  # nothing to send: complete at once

    def _unblock(self, j: int, when: float) -> None:
        self.blockers[j] -= 1
        if self.blockers[j] == 0:
            self._release(j, when)

    def _finish_if_sent(self, j: int, when: float) -> None:
        if self.left[j] <= self.tol[j] and self.flying[j] == 0 and not self.done[j]:
            self.done[j] = True
            for k in self.dependents[j]:
                self._unblock(k, when)

    def _ready(self, t: float) -> list[int]:
        return [j for j, seen in enumerate(self.seen)
                if seen <= t + EPS and self.left[j] > self.tol[j]]

    def _key(self, j: int) -> tuple[float, float, int]:
        op = self.graph.ops[j]
        first = op.priority if self.policy.order == "priority" else 0.0
        return (first, self.release_time[j], j)

    def _most_urgent(self, t: float) -> int:
        ready = self._ready(t)
        return min(ready, key=self._key) if ready else -1

    def _send(self, t: float) -> bool:
        """Dispatch one message at ``t``; False when nothing is ready."""
        ready = sorted(self._ready(t), key=self._key)
        if not ready:
            return False
        head = ready[0]
        kind = self.graph.ops[head].kind
        limit = self.policy.partition_bytes or math.inf
        parts = [(head, min(self.left[head], limit))]
        if self.policy.fusion_bytes and not self.policy.partition_bytes:
            total = parts[0][1]
            for j in ready[1:]:
                op = self.graph.ops[j]
                if op.kind == kind and total + self.left[j] <= self.policy.fusion_bytes:
                    parts.append((j, self.left[j]))
                    total += self.left[j]
        nbytes = sum(b for _, b in parts)
        start = max(t + self.cost.latency(kind), self.link_free)
        end = start + self.cost.transfer(kind, nbytes)
        self.link_free = end
        for j, b in parts:
            self.left[j] -= b
            self.flying[j] += 1
        self.messages.append((end, parts))
        op = self.graph.ops[head]
        name = op.name if len(parts) == 1 else f"{op.name}+{len(parts) - 1}"
        self.spans.append(Span("comm", name, op.iteration, start, end))
        return True

    def _advance(self, t: float, task_end: float, serving: int) -> float:
        """The next event time after ``t``; serves the preemptive link until then."""
        upcoming = [task_end, *(end for end, _ in self.messages),
                    *(s for j, s in enumerate(self.seen)
                      if s > t + EPS and self.left[j] > self.tol[j])]
        if serving >= 0:
            upcoming.append(t + self.left[serving])
        nxt = min(upcoming)
        if nxt == math.inf:
            raise ScheduleError(
                "the schedule is stuck: a compute task waits for a collective that is never "
                "released; check the policy's dependencies")
        if serving >= 0:
            self.left[serving] -= nxt - t
            op = self.graph.ops[serving]
            self.spans.append(Span("comm", op.name, op.iteration, t, nxt))
            if self.left[serving] <= self.tol[serving] + EPS:
                self.left[serving] = 0.0
                self._finish_if_sent(serving, nxt)
        return nxt
