"""Priority communication scheduling for data-parallel training in plain PyTorch, after P3
(Jayarajan et al., 2019) and ByteScheduler (Peng et al., 2019), without DDP::

    sched = PriorityScheduler(model, optimizer_factory=lambda ps: torch.optim.SGD(ps, lr=0.1))
    for x, y in batches:
        loss_fn(model(x), y).backward()  # no optimizer.step(): the scheduler steps each layer
    sched.finish()  # apply the last step's update

**Layers and priorities.** A layer is a module that owns parameters, with the parameters of
modules it calls functionally instead of through their ``forward`` (``MultiheadAttention``'s
``out_proj``) folded into the nearest called ancestor. A layer's priority is the position at
which its forward starts in the first forward pass: the layer nearest the input goes first,
because the next iteration's forward needs it first.

**Fusion.** With ``fuse_bytes``, consecutive layers (in forward order) whose gradients total
at most that many bytes are reduced together as one layer (DDP's and Horovod's answer to
many small tensors: one allreduce's latency instead of several); such a group is ready when
its first layer, the last in backward, has its gradients, and its first layer's forward
waits for it.

**Partitions and credits.** When the last parameter of a layer gets its gradient in backward
(``register_post_accumulate_grad_hook``), the layer's gradients are packed into one buffer per
dtype, divided by the world size (as DDP does) and cut into partitions of at most
``partition_bytes``, which join a priority queue. A partition is launched (an async SUM
allreduce on ``process_group``) only while fewer than ``credits`` partitions are in flight, so
a large low-priority layer cannot fill the link ahead of the layers the next forward needs.

**Why the scheduler waits instead of polling.** Collectives are matched across ranks by issue
order, so every rank must launch the partitions in the same order and at the same points of
the training loop (relative to the loop's own collectives, such as a loss all-reduce for
logging). Launches therefore happen only at events every rank sees in the same order
(gradients arriving, in autograd's order, and forward pre-hooks), never when an allreduce
happens to finish. A credit comes back when the scheduler waits for the oldest in-flight
partition, which it does at three points: when a layer's gradients are complete in backward (at
most one wait, so backward stalls at most one partition per layer), in a layer's forward
pre-hook (as many as that layer's own partitions need), and in :meth:`finish`.

**In the background.** With ``background=True`` a sender thread makes every launch and
wait instead: the hooks post their events (a layer's gradients are complete; the forward or
:meth:`finish` needs the reductions) to it in the order they happen, so the launch order is the
one above, the same on every rank, but backward never stalls for a credit, and from the first
forward pre-hook on the thread drains the queue by priority without waiting for each layer's
pre-hook. A layer's pre-hook waits only until the thread has its partitions. The price: the
thread's allreduces are issued at times the training loop does not see, so the loop must not
issue collectives of its own (on this group, or on any group of the same commflow world, whose
operations share one progress thread) between ``backward()`` and the end of the next forward
or :meth:`finish`.

**The optimizer.** With ``optimizer_factory``, each layer gets its own optimizer over its
parameters; the layer's forward pre-hook in the next iteration waits for the layer's
partitions, writes the averaged gradients into ``.grad``, steps that optimizer and sets the
gradients to ``None``. Parameters are updated just before they are used, and the forward of
early layers overlaps the communication of later ones. Per-layer optimizers equal one global
optimizer for element-wise rules (SGD, momentum, Adam, AdamW), not for rules that couple layers
(gradient clipping by the global norm, LAMB's trust ratio over all parameters). Call
:meth:`finish` after the last backward (and before evaluating or saving) to apply the pending
updates. Without a factory, call :meth:`finish` after ``backward()`` and before your
``optimizer.step()``: it leaves the averaged gradients in ``.grad``, as DDP does.

**Limits.** Every parameter that gets a gradient must get exactly one per backward, and every
parameter of a layer must get one (no unused parameters, no gradient accumulation across
several backward passes); create the scheduler before the first forward (it learns the layer
order there); the model's parameters and buffers are broadcast from group rank 0 at
construction, buffers are not synchronized afterwards (DDP's ``broadcast_buffers``).
"""

from __future__ import annotations

import heapq
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.distributed as dist

from commflow.errors import CommflowError
from commflow.torch._layers import Layer, Partition, grad_views, layer_groups
from commflow.torch._sender import Sender


@dataclass(frozen=True)
class Launch:
    """One partition's allreduce as the scheduler started it (kept in ``trace``)."""

    layer: int
    """The layer's priority: its position in forward order (0: nearest the input)."""
    part: int
    """The partition's index within its layer."""
    nbytes: int
    in_flight: int
    """Partitions launched and not yet waited for, this one included."""
    phase: str
    """Where it was launched: ``"backward"``, ``"forward"`` or ``"finish"``."""


class PriorityScheduler:
    """Average the gradients of ``model`` over ``process_group`` (default: the default group)
    with prioritized, partitioned, credit-limited allreduces; see the module docstring.

    Raises ``ValueError`` for ``partition_bytes`` < 1 or smaller than a parameter element, or
    ``credits`` < 1. With ``background=True`` a sender thread launches and waits (see the
    module docstring); with ``trace=True``, :attr:`trace` lists every :class:`Launch`.
    """

    def __init__(
        self,
        model: torch.nn.Module,
        process_group: dist.ProcessGroup | None = None,
        partition_bytes: int = 4 << 20,
        credits: int = 2,
        optimizer_factory: Callable[[list[torch.nn.Parameter]], torch.optim.Optimizer]
        | None = None,
        *,
        fuse_bytes: int = 0,
        background: bool = False,
        trace: bool = False,
    ) -> None:
        if not isinstance(partition_bytes, int) or partition_bytes < 1:
            raise ValueError(
                f"PriorityScheduler: partition_bytes must be a positive number of bytes, got "
                f"{partition_bytes!r}"
            )
        if not isinstance(fuse_bytes, int) or fuse_bytes < 0:
            raise ValueError(
                f"PriorityScheduler: fuse_bytes must be a number of bytes >= 0, got "
                f"{fuse_bytes!r}"
            )
        if not isinstance(credits, int) or credits < 1:
            raise ValueError(
                f"PriorityScheduler: credits (partitions in flight) must be at least 1, got "
                f"{credits!r}"
            )
        params = [p for p in model.parameters() if p.requires_grad]
        widest = max((p.element_size() for p in params), default=1)
        if partition_bytes < widest:
            raise ValueError(
                f"PriorityScheduler: partition_bytes ({partition_bytes}) is smaller than one "
                f"parameter element ({widest} bytes); use at least {widest}"
            )
        if not dist.is_initialized():
            raise CommflowError(
                "PriorityScheduler: torch.distributed is not initialized; call "
                "dist.init_process_group (e.g. 'commflow') before creating the scheduler"
            )
        self.model, self.group = model, process_group
        self.partition_bytes, self.credits = partition_bytes, credits
        self.fuse_bytes = fuse_bytes
        self.optimizer_factory = optimizer_factory
        self.trace: list[Launch] | None = [] if trace else None
        self._size = dist.get_world_size(process_group)
        self._layers: list[Layer] | None = None
        self._layer_of: dict[int, Layer] = {}
        self._by_module: dict[int, Layer] = {}
        self._called: dict[int, int] = {}
        self._queue: list[tuple[int, int, Partition]] = []
        self._in_flight: deque[Partition] = deque()
        self._sender = (Sender(lambda: [layer.done for layer in self._layers or []])
                        if background else None)
        self._drain_posted = False
        self.wait_time = 0.0
        """Seconds the training thread has spent in forward pre-hooks and :meth:`finish`
        launching and waiting for reductions: the communication that was not hidden."""
        self._sync_replicas()
        self._handles = {
            id(m): m.register_forward_pre_hook(self._make_pre_hook(m)) for m in model.modules()
        }
        self._grad_handles = [p.register_post_accumulate_grad_hook(self._grad_ready)
                              for p in params]

    @property
    def layers(self) -> list[tuple[str, list[torch.nn.Parameter]]]:
        """``(module name, parameters)`` of each layer in priority order (empty before the
        first backward, when the layers are formed)."""
        return [(layer.name, layer.params) for layer in self._layers or []]

    @property
    def optimizers(self) -> list[torch.optim.Optimizer]:
        """The per-layer optimizers in priority order, made by ``optimizer_factory`` at the
        first backward (empty without a factory)."""
        return [layer.optimizer for layer in self._layers or [] if layer.optimizer is not None]

    def finish(self) -> None:
        """Wait for every reduction, write the averaged gradients into ``.grad`` and, with
        an ``optimizer_factory``, apply every pending layer's step. Raises ``CommflowError``
        when some layer got only part of its gradients in the last backward."""
        for layer in self._layers or []:
            if layer.arrived:
                ids = {id(p) for p in layer.params}
                missing = [n for n, p in self.model.named_parameters()
                           if id(p) in ids and id(p) not in layer.arrived]
                raise CommflowError(
                    f"PriorityScheduler: layer {layer.name!r} on rank {dist.get_rank()} got no "
                    f"gradient for {', '.join(missing)} in the last backward; every parameter "
                    f"of a layer must get one (freeze unused parameters with "
                    f"requires_grad_(False) before creating the scheduler)"
                )
        for layer in self._layers or []:
            if layer.pending:
                self._complete(layer, "finish")

    def close(self) -> None:
        """:meth:`finish`, then remove every hook the scheduler installed and stop the
        sender thread."""
        self.finish()
        for handle in [*self._handles.values(), *self._grad_handles]:
            handle.remove()
        self._handles, self._grad_handles = {}, []
        if self._sender is not None:
            self._sender.stop()
            self._sender = None

    # -- hooks ------------------------------------------------------------------------------
    def _make_pre_hook(self, module: torch.nn.Module) -> Callable:
        def pre_hook(_module: torch.nn.Module, _args: tuple) -> None:
            if self._layers is None:
                self._called.setdefault(id(module), len(self._called))
                return
            layer = self._by_module.get(id(module))
            if layer is not None and layer.pending:
                self._complete(layer, "forward")
                if self._sender is None:
                    self._pump("forward", waits=0)

        return pre_hook

    def _grad_ready(self, param: torch.nn.Parameter) -> None:
        if self._layers is None:
            self._form_layers()
        layer = self._layer_of[id(param)]
        if layer.pending or id(param) in layer.arrived:
            raise CommflowError(
                f"PriorityScheduler: a parameter of layer {layer.name!r} on rank "
                f"{dist.get_rank()} got a second gradient before the layer's reduction was "
                f"applied; call backward once per step, run every layer's forward, and call "
                f"finish() before a backward that follows no forward"
            )
        layer.arrived.add(id(param))
        if len(layer.arrived) < len(layer.params):
            return
        layer.arrived.clear()
        layer.pending = True
        for flat, params in layer.buffers:
            if not all(p.grad.data_ptr() == view.data_ptr()
                       for p, view in zip(params, grad_views(flat, params), strict=True)):
                torch.cat([p.grad.reshape(-1) for p in params], out=flat)
            flat.div_(self._size)
        layer.left = len(layer.parts)
        layer.done.clear()
        if self._sender is not None:
            self._drain_posted = False
            self._sender.post(self._ready, layer)
        else:
            self._ready(layer)

    def _ready(self, layer: Layer) -> None:
        """Queue ``layer``'s partitions and launch with at most one wait for a credit."""
        for part in layer.parts:
            heapq.heappush(self._queue, (layer.index, part.part, part))
        self._pump("backward", waits=1)

    # -- scheduling -------------------------------------------------------------------------
    def _pump(self, phase: str, waits: int) -> None:
        """Launch queued partitions by priority while credits are free, waiting for the
        oldest in-flight partition at most ``waits`` times to free one."""
        while self._queue:
            if len(self._in_flight) >= self.credits:
                if waits == 0:
                    return
                self._retire()
                waits -= 1
            self._launch(phase)

    def _launch(self, phase: str) -> None:
        _, _, part = heapq.heappop(self._queue)
        part.work = dist.all_reduce(part.view, group=self.group, async_op=True)
        self._in_flight.append(part)
        if self.trace is not None:
            self.trace.append(Launch(part.layer.index, part.part,
                                     part.view.numel() * part.view.element_size(),
                                     len(self._in_flight), phase))

    def _retire(self) -> None:
        part = self._in_flight.popleft()
        part.work.wait()
        part.work = None
        part.layer.left -= 1
        if part.layer.left == 0:
            part.layer.done.set()

    def _drain(self, phase: str) -> None:
        """Launch every queued partition by priority, waiting for credits, then wait for
        all (the sender thread's answer once no gradient can join the queue)."""
        while self._queue or self._in_flight:
            if self._queue and len(self._in_flight) < self.credits:
                self._launch(phase)
            else:
                self._retire()

    def _complete(self, layer: Layer, phase: str) -> None:
        """Have ``layer``'s partitions reduced (launched in priority order), then apply the
        averaged gradients and the layer's optimizer step.

        ``.grad`` becomes a view of the layer's buffer (no copy, as DDP's
        ``gradient_as_bucket_view``); a backward that accumulates into those views (after
        ``zero_grad(set_to_none=False)``) finds its gradients packed already."""
        start = time.perf_counter()
        if self._sender is not None:
            if not self._drain_posted:
                self._drain_posted = True
                self._sender.post(self._drain, phase)
            self._sender.wait(layer.done)
        else:
            while any(entry[2].layer is layer for entry in self._queue):
                if len(self._in_flight) >= self.credits:
                    self._retire()
                self._launch(phase)
            while layer.left:
                self._retire()
        self.wait_time += time.perf_counter() - start
        layer.pending = False
        for flat, params in layer.buffers:
            for p, view in zip(params, grad_views(flat, params), strict=True):
                p.grad = view
        if layer.optimizer is not None:
            layer.optimizer.step()
            layer.optimizer.zero_grad(set_to_none=True)

    # -- set-up -----------------------------------------------------------------------------
    def _sync_replicas(self) -> None:
        with torch.no_grad():
            for t in [*self.model.parameters(), *self.model.buffers()]:
                dist.broadcast(t.data, group_src=0, group=self.group)

    def _form_layers(self) -> None:
        """Group the parameters into layers ordered by forward start (first backward)."""
        self._layers = []
        for index, (name, modules, params) in enumerate(
                layer_groups(self.model, self._called, self.fuse_bytes)):
            layer = Layer(index, name, params, self.partition_bytes)
            if self.optimizer_factory is not None:
                layer.optimizer = self.optimizer_factory(params)
            self._layers.append(layer)
            self._by_module.update((id(m), layer) for m in modules)
            self._layer_of.update((id(p), layer) for p in params)
        for key in [k for k in self._handles if k not in self._by_module]:
            self._handles.pop(key).remove()
