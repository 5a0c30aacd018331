"""What one data-parallel training iteration computes and communicates, layer by layer.

A :class:`Workload` lists layers from the input to the output. Each has a forward and a
backward time (seconds, on one worker) and the bytes of its gradient (= its parameters times
the bytes per gradient element). Forward runs layers in order, backward in reverse; a layer's
gradient is ready when its backward ends, and the next iteration's forward of a layer needs
that layer's synchronized parameters.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from commflow.errors import CommflowError


class ScheduleError(CommflowError):
    """A workload, policy or cost model the scheduler cannot use."""


@dataclass(frozen=True)
class Layer:
    """One layer: ``forward``/``backward`` seconds and ``grad_bytes`` of gradient."""

    name: str
    forward: float
    backward: float
    grad_bytes: float

    def __post_init__(self) -> None:
        if min(self.forward, self.backward, self.grad_bytes) < 0:
            raise ScheduleError(
                f"layer {self.name!r}: forward, backward and grad_bytes must be >= 0 "
                f"(got {self.forward}, {self.backward}, {self.grad_bytes})")


@dataclass(frozen=True)
class Workload:
    """The layers of one model on one worker, input first."""

    name: str
    layers: tuple[Layer, ...]

    def __post_init__(self) -> None:
        if not self.layers:
            raise ScheduleError(f"workload {self.name!r} has no layers")

    @classmethod
    def from_lists(cls, name: str, forward: Sequence[float], backward: Sequence[float],
                   grad_bytes: Sequence[float]) -> Workload:
        """Layers ``L0, L1, ...`` from three equally long lists (seconds, seconds, bytes).

        Raises ``ScheduleError`` when the lengths differ.
        """
        if not len(forward) == len(backward) == len(grad_bytes):
            raise ScheduleError(
                f"workload {name!r}: {len(forward)} forward, {len(backward)} backward and "
                f"{len(grad_bytes)} gradient sizes; give one of each per layer")
        return cls(name, tuple(Layer(f"L{i}", f, b, g) for i, (f, b, g) in
                               enumerate(zip(forward, backward, grad_bytes, strict=True))))

    @property
    def forward_time(self) -> float:
        """Seconds of forward compute per iteration."""
        return sum(layer.forward for layer in self.layers)

    @property
    def backward_time(self) -> float:
        """Seconds of backward compute per iteration."""
        return sum(layer.backward for layer in self.layers)

    @property
    def grad_bytes(self) -> float:
        """Bytes of gradient per iteration."""
        return sum(layer.grad_bytes for layer in self.layers)

    def describe(self) -> str:
        """``vgg16: 16 layers, 553.4 MB of gradients, forward 10.1 ms, backward 20.2 ms``."""
        return (f"{self.name}: {len(self.layers)} layers, {self.grad_bytes / 1e6:.1f} MB of "
                f"gradients, forward {self.forward_time * 1e3:.1f} ms, backward "
                f"{self.backward_time * 1e3:.1f} ms")
