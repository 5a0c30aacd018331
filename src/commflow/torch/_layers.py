"""The layers of :class:`commflow.torch.PriorityScheduler`: the model's parameters grouped by
the module that owns them, ordered by forward start and fused while small (the scheduling
priorities), and each layer's gradient buffers (one per dtype) cut into partitions."""

from __future__ import annotations

import threading

import torch
import torch.distributed as dist

Owner = tuple[torch.nn.Module, list[torch.nn.Parameter]]


def grad_views(flat: torch.Tensor, params: list[torch.nn.Parameter]) -> list[torch.Tensor]:
    """Each parameter's slice of its layer's gradient buffer, shaped like the parameter."""
    views, start = [], 0
    for p in params:
        views.append(flat[start : start + p.numel()].view_as(p))
        start += p.numel()
    return views


class Partition:
    """One slice of a layer's gradient buffer, reduced by one allreduce."""

    __slots__ = ("layer", "part", "view", "work")

    def __init__(self, layer: Layer, part: int, view: torch.Tensor) -> None:
        self.layer, self.part, self.view = layer, part, view
        self.work: dist.Work | None = None


class Layer:
    """A layer's parameters, its gradient buffers (one per dtype) cut into partitions, and
    the state of its current reduction."""

    def __init__(self, index: int, name: str, params: list[torch.nn.Parameter],
                 partition_bytes: int) -> None:
        self.index, self.name, self.params = index, name, params
        self.buffers: list[tuple[torch.Tensor, list[torch.nn.Parameter]]] = []
        for dtype in dict.fromkeys(p.dtype for p in params):
            same = [p for p in params if p.dtype == dtype]
            self.buffers.append((torch.empty(sum(p.numel() for p in same), dtype=dtype), same))
        self.parts: list[Partition] = []
        for flat, _ in self.buffers:
            step = partition_bytes // flat.element_size()
            for start in range(0, flat.numel(), step):
                self.parts.append(Partition(self, len(self.parts), flat[start : start + step]))
        self.arrived: set[int] = set()
        self.pending = False
        self.left = 0
        """Partitions not yet reduced in the current reduction."""
        self.done = threading.Event()
        """Set once every partition of the current reduction is reduced."""
        self.optimizer: torch.optim.Optimizer | None = None


def _fused(order: list[Owner], fuse_bytes: int) -> list[list[Owner]]:
    """Consecutive owners (in forward order) joined while their gradients total at most
    ``fuse_bytes`` (each owner alone with 0): one reduction for several small layers, ready
    when the first of them (the last in backward) has its gradients."""
    groups: list[list[Owner]] = []
    size = 0
    for owner in order:
        nbytes = sum(p.numel() * p.element_size() for p in owner[1])
        if groups and size + nbytes <= fuse_bytes:
            groups[-1].append(owner)
            size += nbytes
        else:
            groups.append([owner])
            size = nbytes
    return groups


def layer_groups(model: torch.nn.Module, called: dict[int, int], fuse_bytes: int
                 ) -> list[tuple[str, list[torch.nn.Module], list[torch.nn.Parameter]]]:
    """``(name, modules, parameters)`` of each layer in priority order: the trainable
    parameters grouped by owning module, a module never called (``called`` maps ``id`` of each
    module whose forward ran to its start position) folded into its nearest called ancestor,
    ordered by forward start (owners never called last, in module order), fused by
    ``fuse_bytes``."""
    parent: dict[int, torch.nn.Module] = {}
    names: dict[int, str] = {}
    for name, module in model.named_modules():
        names[id(module)] = name or type(module).__name__
        for child in module.children():
            parent.setdefault(id(child), module)
    owners: dict[int, Owner] = {}
    seen: set[int] = set()
    for module in model.modules():
        own = [p for p in module.parameters(recurse=False)
               if p.requires_grad and id(p) not in seen]
        if not own:
            continue
        seen.update(id(p) for p in own)
        owner = module
        while id(owner) not in called and id(owner) in parent:
            owner = parent[id(owner)]
        owners.setdefault(id(owner), (owner, []))[1].extend(own)
    unseen = len(called)  # owners never called: after the others, in module order
    order = sorted(owners.values(), key=lambda o: called.get(id(o[0]), unseen))
    return [("+".join(names[id(m)] for m, _ in group), [m for m, _ in group],
             [p for _, ps in group for p in ps]) for group in _fused(order, fuse_bytes)]
