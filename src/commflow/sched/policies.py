"""Scheduling policies, and the compute tasks and collectives they make of a workload.

A :class:`Policy` says how gradients become collectives (per layer, DDP buckets, Horovod
fusion, reduce-scatter + all-gather, sharded parameters) and how the link serves them (ready
order or layer priority, partitions, credits, preemption). :func:`build` unrolls a workload
into compute tasks (forward in layer order, backward in reverse, iteration after iteration)
and collectives, with the dependencies between them; :mod:`commflow.sched.engine` runs them.

Presets (:data:`POLICIES`) follow the systems they are named after: ``fifo`` (wait-free
backpropagation: one allreduce per layer as its gradient is ready, Poseidon), ``ddp``
(PyTorch DDP: 25 MiB buckets in reverse layer order, the first 1 MiB, reduced in bucket
order), ``horovod`` (tensor fusion: every 1 ms cycle, ready tensors fused up to 128 MiB, the
defaults since Horovod 0.21), ``priority`` (TicTac: the layer nearest the input first, whole
tensors), ``p3`` (priority with slices of 50,000 float32 parameters, 8 in flight, as its
parameter server pipelines them), ``bytescheduler``
(priority, 4 MiB partitions, 4 in flight; :func:`commflow.sched.autotune` searches them),
``pace`` (preemptive priority: the link always serves the most urgent ready bytes), ``dear``
(DeAR: reduce-scatter during backward, all-gather of each layer before its next forward, by
priority) and ``fsdp`` (ZeRO-3/FSDP: parameters all-gathered one layer ahead before forward
and backward, gradients reduce-scattered after backward, in issue order).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from commflow.sched.workload import ScheduleError, Workload

MIB = 1 << 20
ORDERS = ("fifo", "priority")


@dataclass(frozen=True)
class Policy:
    """How gradients become collectives and how the link serves them."""

    name: str
    order: str = "fifo"
    """``fifo``: in the order they become ready; ``priority``: the lowest layer first."""
    bucket_bytes: float = 0.0
    """Static buckets (DDP) of at most this many bytes, in reverse layer order; 0: none."""
    first_bucket_bytes: float = 0.0
    """Cap of the first bucket (DDP: 1 MiB); 0: :attr:`bucket_bytes`."""
    fusion_bytes: float = 0.0
    """Dynamic fusion (Horovod): a message takes ready collectives up to this many bytes."""
    cycle: float = 0.0
    """Seconds between fusion cycles: a collective is seen at the next cycle; 0: at once."""
    partition_bytes: float = 0.0
    """Largest message; a larger collective is sent in partitions; 0: whole."""
    credits: int = 1
    """Messages in flight at once (their latencies overlap, their transfers do not)."""
    preemptive: bool = False
    """The link always serves the most urgent ready collective (fluid, any byte)."""
    decompose: bool = False
    """Reduce-scatter after backward, all-gather before the next forward (DeAR)."""
    sharded: bool = False
    """Parameters sharded (ZeRO-3/FSDP): all-gather before forward and backward (one layer
    ahead), reduce-scatter of gradients after backward."""

    def __post_init__(self) -> None:
        if self.order not in ORDERS:
            raise ScheduleError(f"policy {self.name!r}: order must be one of {ORDERS}")
        if self.credits < 1:
            raise ScheduleError(f"policy {self.name!r}: credits must be >= 1")
        if min(self.bucket_bytes, self.first_bucket_bytes, self.fusion_bytes, self.cycle,
               self.partition_bytes) < 0:
            raise ScheduleError(f"policy {self.name!r}: sizes and cycle must be >= 0")
        if self.decompose and self.sharded:
            raise ScheduleError(f"policy {self.name!r}: decompose and sharded exclude each "
                                "other (sharded already reduce-scatters)")


POLICIES: dict[str, Policy] = {p.name: p for p in (
    Policy("fifo"),
    Policy("ddp", bucket_bytes=25 * MIB, first_bucket_bytes=1 * MIB),
    Policy("horovod", fusion_bytes=128 * MIB, cycle=1e-3),
    Policy("priority", order="priority"),
    Policy("p3", order="priority", partition_bytes=200_000, credits=8),
    Policy("bytescheduler", order="priority", partition_bytes=4 * MIB, credits=4),
    Policy("pace", order="priority", preemptive=True),
    Policy("dear", order="priority", decompose=True),
    Policy("fsdp", sharded=True),
)}
"""Policy presets by name (module docstring)."""


def get_policy(name: str | Policy) -> Policy:
    """The preset ``name`` (a :class:`Policy` is returned as is).

    Raises ``ScheduleError`` naming the presets for an unknown name.
    """
    if isinstance(name, Policy):
        return name
    if name not in POLICIES:
        raise ScheduleError(f"unknown policy {name!r}; use one of {', '.join(POLICIES)}")
    return POLICIES[name]


@dataclass
class Task:
    """One compute task: a layer's forward or backward in one iteration."""

    name: str
    layer: int
    iteration: int
    phase: str
    duration: float
    waits: list[int] = field(default_factory=list)
    """Collectives (indices into :attr:`Graph.ops`) that must be complete before it starts."""


@dataclass
class Op:
    """One collective of one iteration."""

    name: str
    kind: str
    nbytes: float
    priority: float
    iteration: int
    after_task: int = -1
    """Compute task whose end releases it (-1: none)."""
    after_ops: list[int] = field(default_factory=list)
    """Collectives that must be complete before it is released."""


@dataclass
class Graph:
    """Compute tasks in stream order and the collectives of every iteration."""

    tasks: list[Task]
    ops: list[Op]


def build(workload: Workload, policy: Policy, iterations: int) -> Graph:
    """The tasks and collectives of ``iterations`` iterations of ``workload`` under
    ``policy`` (see the module docstring)."""
    if iterations < 1:
        raise ScheduleError(f"iterations must be >= 1 (got {iterations})")
    layers = workload.layers
    n = len(layers)
    graph = Graph([], [])
    ready_for: list[list[int]] = [[] for _ in range(n)]  # ops each layer's next forward waits
    for it in range(iterations):
        forward = [_task(graph, i, it, "forward", layers[i].forward) for i in range(n)]
        backward = {i: _task(graph, i, it, "backward", layers[i].backward)
                    for i in reversed(range(n))}
        if policy.sharded:
            ready_for = _sharded(graph, workload, it, forward, backward, ready_for)
            continue
        for i in range(n):
            graph.tasks[forward[i]].waits.extend(ready_for[i])
        if policy.decompose:
            ready_for = _decomposed(graph, workload, it, backward)
        else:
            ready_for = _allreduced(graph, workload, policy, it, backward)
    return graph


def _task(graph: Graph, layer: int, it: int, phase: str, duration: float) -> int:
    graph.tasks.append(Task(f"{phase[0].upper()}{layer}", layer, it, phase, duration))
    return len(graph.tasks) - 1


def _op(graph: Graph, op: Op) -> int:
    graph.ops.append(op)
    return len(graph.ops) - 1


def _allreduced(graph: Graph, workload: Workload, policy: Policy, it: int,
                backward: dict[int, int]) -> list[list[int]]:
    """One allreduce per bucket (per layer without buckets); each layer's next forward waits
    for the bucket holding it."""
    ready_for: list[list[int]] = [[] for _ in workload.layers]
    for bucket in _buckets(workload, policy):
        first = min(bucket)
        nbytes = sum(workload.layers[i].grad_bytes for i in bucket)
        name = f"AR{first}" if len(bucket) == 1 else f"AR{first}-{max(bucket)}"
        op = _op(graph, Op(name, "allreduce", nbytes, first, it, after_task=backward[first]))
        for i in bucket:
            ready_for[i].append(op)
    return ready_for


def _buckets(workload: Workload, policy: Policy) -> list[list[int]]:
    """Layers grouped as DDP does: in reverse order, a bucket closes once it reaches its cap
    (the first at :attr:`Policy.first_bucket_bytes`); one layer each without buckets."""
    order = list(reversed(range(len(workload.layers))))
    if not policy.bucket_bytes:
        return [[i] for i in order]
    buckets: list[list[int]] = [[]]
    cap = policy.first_bucket_bytes or policy.bucket_bytes
    size = 0.0
    for i in order:
        buckets[-1].append(i)
        size += workload.layers[i].grad_bytes
        if size >= cap:
            buckets.append([])
            cap, size = policy.bucket_bytes, 0.0
    return [b for b in buckets if b]


def _decomposed(graph: Graph, workload: Workload, it: int,
                backward: dict[int, int]) -> list[list[int]]:
    """DeAR: reduce-scatter each gradient after its backward, all-gather it after that."""
    ready_for = []
    for i, layer in enumerate(workload.layers):
        rs = _op(graph, Op(f"RS{i}", "reducescatter", layer.grad_bytes, i, it,
                           after_task=backward[i]))
        ready_for.append([_op(graph, Op(f"AG{i}", "allgather", layer.grad_bytes, i, it,
                                        after_ops=[rs]))])
    return ready_for


def _sharded(graph: Graph, workload: Workload, it: int, forward: list[int],
             backward: dict[int, int], reduced: list[list[int]]) -> list[list[int]]:
    """ZeRO-3/FSDP: all-gather layer ``i``'s parameters once forward of layer ``i - 2`` ends
    (one layer of prefetch) and after the previous iteration's reduce-scatter of its
    gradient; again for backward once backward of layer ``i + 2`` ends; reduce-scatter each
    gradient after its backward."""
    n = len(workload.layers)
    last_forward = forward[-1]
    for i, layer in enumerate(workload.layers):
        after = forward[i - 2] if i >= 2 else -1
        ag = _op(graph, Op(f"AGf{i}", "allgather", layer.grad_bytes, i, it, after_task=after,
                           after_ops=list(reduced[i])))
        graph.tasks[forward[i]].waits.append(ag)
    for i in reversed(range(n)):
        after = backward[i + 2] if i + 2 < n else last_forward
        ag = _op(graph, Op(f"AGb{i}", "allgather", workload.layers[i].grad_bytes, i, it,
                           after_task=after))
        graph.tasks[backward[i]].waits.append(ag)
    return [[_op(graph, Op(f"RS{i}", "reducescatter", workload.layers[i].grad_bytes, i, it,
                           after_task=backward[i]))] for i in range(n)]
