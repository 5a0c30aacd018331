"""Event-driven simulation of a pipeline schedule over micro-batches: GPipe, 1F1B
(PipeDream-Flush), interleaved 1F1B (Narayanan et al. 2021) and zero-bubble ZB-H1 and ZB-H2
(Qi et al. 2024); closed forms for screening and for Chimera (Li & Hoefler 2021).

Each stage runs its ops in the schedule's order; an op starts when its stage is free and its
input has arrived (the neighbour's op done plus the point-to-point time). Forward of virtual
stage ``c·p + s`` follows forward of the virtual stage before it; backward follows the next
virtual stage's backward. ZB-H1 splits backward into B (input gradient, on the critical path)
and W (weight gradient): W passes wait in a queue and run when the next F or B would wait for
its input and the W fits in the gap, before an F that would put more than ``p`` micro-batches
in flight on the stage (ZB-H1's memory limit: 1F1B's peak), and at the end. ZB-H2 warms up
with ``2(p - s - 1)`` forward passes on stage ``s`` and allows ``2p - 1`` micro-batches in
flight; its stages keep their staggered starts from step to step (the paper's parallelogram,
kept by replacing the optimizer's global synchronization with post-validation), so a stage's
step time is its end minus its start (:attr:`PipelineRun.stage_offset`).

Chimera (two pipelines in opposite directions, stage ``s`` of one and ``p - 1 - s`` of the
other on each rank) has no event simulation here: :func:`formula_makespan` times it by the
paper's closed form.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass

from commflow.errors import CommflowError


@dataclass(frozen=True)
class OpTimes:
    """Seconds of one op of one micro-batch, indexed ``[stage][chunk]``."""

    forward: Sequence[Sequence[float]]
    """Forward pass of a model chunk."""
    backward: Sequence[Sequence[float]]
    """Backward pass (for ZB-H1: input gradient only)."""
    weight: Sequence[Sequence[float]]
    """Weight gradient, run as its own op only by ZB-H1 (otherwise part of ``backward``)."""


@dataclass(frozen=True)
class Interval:
    """One op on the timeline."""

    stage: int
    kind: str
    """``"F"``, ``"B"`` or ``"W"``."""
    microbatch: int
    chunk: int
    start: float
    """Seconds from the step start."""
    end: float


@dataclass(frozen=True)
class PipelineRun:
    """Result of :func:`simulate_schedule`."""

    stage_end: tuple[float, ...]
    """When each stage finishes its last op, seconds."""
    stage_busy: tuple[float, ...]
    """Seconds each stage spends running ops."""
    intervals: tuple[Interval, ...]
    """Every op, in execution order per stage."""
    extrapolated: bool = False
    """Whether stage ends were extrapolated (then ``intervals`` cover a shorter run, or none)."""
    stage_offset: tuple[float, ...] = ()
    """When each stage starts its step, seconds, for a schedule whose next step starts as
    staggered (ZB-H2); empty: every stage's step starts at 0."""

    @property
    def stage_time(self) -> tuple[float, ...]:
        """Seconds of each stage's step: its end minus its offset."""
        offsets = self.stage_offset or (0.0,) * len(self.stage_end)
        return tuple(end - start for end, start in zip(self.stage_end, offsets, strict=True))

    @property
    def makespan(self) -> float:
        """The longest stage step, seconds (for all but ZB-H2: when the last stage ends)."""
        return max(self.stage_time)

    def __repr__(self) -> str:
        """One line: stages, makespan and the number of ops, not the ops themselves."""
        return (
            f"PipelineRun(stages={len(self.stage_end)}, makespan={self.makespan:.6g}, "
            f"intervals={len(self.intervals)}, extrapolated={self.extrapolated})"
        )


Op = tuple[str, int, int]  # (kind, microbatch, chunk)

SIMULATED = ("gpipe", "1f1b", "interleaved", "zb-h1", "zb-h2")
"""Schedules :func:`simulate_schedule` runs op by op."""


def _interleaved_ids(k: int, p: int, v: int, backward: bool) -> tuple[int, int]:
    group, within = divmod(k, p * v)
    chunk = within // p
    return group * p + within % p, (v - 1 - chunk) if backward else chunk


def stage_order(schedule: str, stage: int, p: int, m: int, v: int = 1) -> list[Op]:
    """The op order of ``stage`` (of ``p``) for ``m`` micro-batches and ``v`` chunks."""
    if schedule == "gpipe":
        return [("F", i, 0) for i in range(m)] + [("B", i, 0) for i in range(m)]
    total = m * v
    if schedule == "interleaved":
        warm = min((p - stage - 1) * 2 + (v - 1) * p, total)
    elif schedule == "zb-h2":
        warm = min(2 * (p - stage - 1), total)
    else:
        warm = min(p - stage - 1, total)
    fwd = [("F", *_interleaved_ids(k, p, v, False)) for k in range(total)]
    bwd = [("B", *_interleaved_ids(k, p, v, True)) for k in range(total)]
    order: list[Op] = fwd[:warm]
    for i in range(total - warm):
        order += [fwd[warm + i], bwd[i]]
    order += bwd[total - warm :]
    return order


_KIND = {"F": 0, "B": 1, "W": 2}


def simulate_schedule(schedule: str, times: OpTimes, microbatches: int, p2p: float) -> PipelineRun:
    """Run ``schedule`` (``gpipe``, ``1f1b``, ``interleaved``, ``zb-h1``, ``zb-h2``) on
    ``len(times.forward)`` stages for ``microbatches`` micro-batches; ``p2p`` is the seconds an
    activation or gradient takes to reach the next stage.

    GPipe and 1F1B send blocking (Megatron-LM's ``send_forward_recv_backward``, DeepSpeed's
    pipeline engine): the sending stage waits ``p2p`` after each op whose output goes to
    another stage. Interleaved and ZB-H1 overlap their sends with compute (Megatron-Core's
    ``overlap_p2p_comm``). Raises ``CommflowError`` for an unknown schedule or one that
    deadlocks."""
    p, v, m = len(times.forward), len(times.forward[0]), microbatches
    if schedule == "chimera":
        raise CommflowError(
            "pipeline schedule chimera has no event simulation: time it with formula_makespan "
            "(evaluate does)")
    if schedule not in SIMULATED:
        raise CommflowError(
            f"unknown pipeline schedule {schedule!r}; simulated: {', '.join(SIMULATED)}")
    split = schedule in ("zb-h1", "zb-h2")
    limit = 2 * p - 1 if schedule == "zb-h2" else p
    blocking = p2p if schedule in ("gpipe", "1f1b") and p > 1 else 0.0
    orders = [stage_order(schedule, s, p, m, v) for s in range(p)]
    duration = (times.forward, times.backward, times.weight)
    # finish[kind][stage][chunk * m + mb]; -1 while not run
    finish = [[[-1.0] * (v * m) for _ in range(p)] for _ in range(3)]
    free, busy, pos = [0.0] * p, [0.0] * p, [0] * p
    intervals: list[Interval] = []
    pending: list[deque[tuple[int, int]]] = [deque() for _ in range(p)]
    inflight = [0] * p

    def run(s: int, kind: str, mb: int, chunk: int, start: float, length: float,
            send: float = 0.0) -> None:
        finish[_KIND[kind]][s][chunk * m + mb] = start + length
        free[s] = start + length + send
        busy[s] += length
        intervals.append(Interval(s, kind, mb, chunk, start, start + length))

    def run_w(s: int) -> None:
        mb, chunk = pending[s].popleft()
        inflight[s] -= 1
        run(s, "W", mb, chunk, free[s], times.weight[s][chunk])

    remaining = sum(len(o) for o in orders)
    while remaining:
        progressed = False
        for s in range(p):
            order = orders[s]
            while pos[s] < len(order):
                kind, mb, chunk = order[pos[s]]
                # the op's input: neighbour stage (or the chunk before/after), or nothing
                if kind == "F":
                    src, dep = (s - 1, chunk) if s > 0 else (p - 1, chunk - 1)
                    if dep < 0:
                        src, ready = s, 0.0
                    else:
                        ready = finish[0][src][dep * m + mb]
                elif s == p - 1 and chunk == v - 1:
                    src, ready = s, finish[0][s][chunk * m + mb]
                else:
                    src, dep = (s + 1, chunk) if s < p - 1 else (0, chunk + 1)
                    ready = finish[1][src][dep * m + mb]
                if ready < 0:
                    break
                if src != s:
                    ready += p2p
                inflight[s] += kind == "F"
                while pending[s] and (
                    kind == "F"
                    and inflight[s] >= limit
                    or free[s] + times.weight[s][pending[s][0][1]] <= ready
                ):
                    run_w(s)
                length = duration[_KIND[kind]][s][chunk]
                if kind == "B":
                    if split:
                        pending[s].append((mb, chunk))
                    else:
                        inflight[s] -= 1
                        length += times.weight[s][chunk]
                sends = s < p - 1 if kind == "F" else s > 0
                run(s, kind, mb, chunk, max(free[s], ready), length, blocking * sends)
                pos[s] += 1
                remaining -= 1
                progressed = True
            if pos[s] == len(order):
                while pending[s]:
                    run_w(s)
        if not progressed:
            raise CommflowError(f"pipeline schedule {schedule} deadlocks with p={p}, v={v}")
    offsets = ()
    if schedule == "zb-h2":
        offsets = tuple(min(i.start for i in intervals if i.stage == s) for s in range(p))
    return PipelineRun(tuple(free), tuple(busy), tuple(intervals), stage_offset=offsets)


def schedule_makespan(
    schedule: str, times: OpTimes, microbatches: int, p2p: float, *, exact: bool = False
) -> PipelineRun:
    """Like :func:`simulate_schedule`; unless ``exact``, a long run is extrapolated: once
    every stage is in its steady state (``p + 2`` micro-batches, ``2p`` for interleaved) each
    further micro-batch adds the same time to every stage, so two short runs give the line
    (``intervals`` then holds the longer short run). Chimera is always its closed form."""
    p = len(times.forward)
    if schedule == "chimera":
        return formula_makespan(schedule, times, microbatches, p2p)
    step = p if schedule == "interleaved" else 1
    m2 = {"interleaved": 2 * p, "zb-h2": 2 * p + 2}.get(schedule, p + 2)
    if exact or microbatches <= m2:
        return simulate_schedule(schedule, times, microbatches, p2p)
    run1 = simulate_schedule(schedule, times, m2 - step, p2p)
    run2 = simulate_schedule(schedule, times, m2, p2p)
    scale = (microbatches - m2) / step

    def line(a: tuple[float, ...], b: tuple[float, ...]) -> tuple[float, ...]:
        return tuple(y + (y - x) * scale for x, y in zip(a, b, strict=True))

    return PipelineRun(
        line(run1.stage_end, run2.stage_end),
        line(run1.stage_busy, run2.stage_busy),
        run2.intervals,
        extrapolated=True,
        stage_offset=run2.stage_offset,
    )


def bubble_formula(schedule: str, p: int, f: float, b: float, w: float) -> float:
    """The papers' closed-form bubble of ``schedule`` on ``p`` stages, seconds per step, for
    a stage's forward ``f``, input-gradient ``b`` and weight-gradient ``w`` seconds per
    micro-batch (no communication):

    - GPipe, 1F1B: ``(p-1)(f+b+w)`` (Huang et al. 2019; Narayanan et al. 2021); interleaved
      the same of a chunk (``f, b, w`` of one of the ``v`` chunks);
    - ZB-H1: ``(p-1)(f+b-w)``; ZB-H2: ``(p-1)(f+b-2w)`` (Qi et al. 2024, Table 1 — 0 for
      equal passes), neither below 0;
    - Chimera: ``(p-2)/2 · (f+b+w)`` (Li & Hoefler 2021, Table 2: bubble ratio
      ``(D-2)/(2N+D-2)`` of ``N`` micro-batches on ``D`` stages).
    """
    if p <= 1:
        return 0.0
    if schedule == "zb-h1":
        return (p - 1) * max(f + b - w, 0.0)
    if schedule == "zb-h2":
        return (p - 1) * max(f + b - 2 * w, 0.0)
    if schedule == "chimera":
        return (p - 2) / 2 * (f + b + w)
    return (p - 1) * (f + b + w)


def formula_makespan(schedule: str, times: OpTimes, microbatches: int, p2p: float) -> PipelineRun:
    """Closed-form step of ``schedule``: every stage busy ``m·Σ(F+B+W)`` plus
    :func:`bubble_formula` of one chunk's ``F, B, W`` of the slowest stage, plus ``2·p2p``
    per stage boundary (the fill and drain cross ``p - 1`` of them each way). GPipe and 1F1B
    also wait ``2·p2p`` per micro-batch for their blocking sends. Chimera: rank ``s`` runs
    half the micro-batches on stage ``s`` and half on stage ``p - 1 - s``, so it is busy
    ``m/2·(t_s + t_{p-1-s})``. No intervals."""
    p = len(times.forward)
    per_stage = [
        sum(f + b + w for f, b, w in zip(fs, bs, ws, strict=True))
        for fs, bs, ws in zip(times.forward, times.backward, times.weight, strict=True)
    ]
    f = max(max(row) for row in times.forward)
    b = max(max(row) for row in times.backward)
    w = max(max(row) for row in times.weight)
    bubble = bubble_formula(schedule, p, f, b, w) + (p - 1) * 2 * p2p
    if schedule == "chimera":
        busy = tuple(microbatches * (t + per_stage[p - 1 - s]) / 2
                     for s, t in enumerate(per_stage))
    else:
        busy = tuple(microbatches * t for t in per_stage)
    if p > 1 and schedule in ("gpipe", "1f1b"):
        bubble += 2 * p2p * microbatches
    end = max(busy) + (bubble if p > 1 else 0.0)
    return PipelineRun(tuple(end for _ in busy), busy, (), extrapolated=True)
