"""What every command shares: consoles, JSON output, unit conversions for display, and the
small parsers of command-line values (``key=value`` parameters, data types)."""

from __future__ import annotations

import json
import math
from enum import Enum

from rich.console import Console, ConsoleDimensions
from rich.table import Table

from commflow.errors import CommflowError
from commflow.ir.target import PROTOCOLS, TARGETS
from commflow.runtime import OPS
from commflow.sim import MODELS
from commflow.units import GB

PIPE_WIDTH = 10_000
"""Width of standard output when it is not a terminal: wide enough that no table column is
wrapped or cut (a pipe or a file gets whole headers and cells)."""


class _Stdout(Console):
    """A console as wide as the terminal it writes to, or :data:`PIPE_WIDTH` elsewhere."""

    @property
    def size(self) -> ConsoleDimensions:
        dims = super().size
        return dims if self.is_terminal else ConsoleDimensions(PIPE_WIDTH, dims.height)


out = _Stdout(highlight=False, soft_wrap=True)
"""Standard output (tables, summaries)."""

err = Console(stderr=True, highlight=False, soft_wrap=True)
"""Standard error (errors, progress bars)."""

DTYPES = {
    "int8": 1,
    "uint8": 1,
    "float16": 2,
    "bfloat16": 2,
    "int32": 4,
    "uint32": 4,
    "float32": 4,
    "int64": 8,
    "uint64": 8,
    "float64": 8,
}
"""Element size in bytes of each data type ``-d`` accepts."""

_DTYPE_ALIASES = {
    "half": "float16",
    "float": "float32",
    "double": "float64",
    "char": "int8",
    "int": "int32",
}


def choices(name: str, values: tuple[str, ...] | list[str]) -> type[Enum]:
    """An enumeration of the fixed ``values`` an option takes, so that ``--help`` lists them
    and the parser refuses others (the option's value is the member: use ``.value``)."""
    return Enum(name, [(value, value) for value in values], type=str)


Model = choices("Model", MODELS)
"""``--model``: the simulator's cost models."""

Target = choices("Target", TARGETS)
"""``--target`` of sim and verify: where a program runs (``live`` is commflow's runtime)."""

Runtime = choices("Runtime", [t for t in TARGETS if t != "live"])
"""``--target`` of export and synth: the runtimes that load MSCCL XML."""

Codec = choices("Codec", ("none", "fp16", "bf16", "int8", "int4"))
"""``--codec`` of sim: compression of the data on the wire (``commflow.compress.CODECS``;
not imported here, which would load numba on every command)."""

Protocol = choices("Protocol", PROTOCOLS)
"""``--proto``: NCCL's protocols."""

Op = choices("Op", OPS)
"""``-o``/``--op``: the reductions of the runtime."""


def dtype_size(name: str) -> tuple[str, int]:
    """Canonical name and size in bytes of a data type (nccl-tests names accepted too).

    Raises ``CommflowError`` listing the known types.
    """
    canonical = _DTYPE_ALIASES.get(name.lower(), name.lower())
    if canonical not in DTYPES:
        raise CommflowError(f"unknown data type {name!r}; use one of {', '.join(DTYPES)}")
    return canonical, DTYPES[canonical]


def parse_params(items: list[str]) -> dict[str, object]:
    """``["box=8", "mode=fast"]`` as ``{"box": 8, "mode": "fast"}`` (ints and floats converted).

    Raises ``CommflowError`` naming an item without ``=``.
    """
    params: dict[str, object] = {}
    for item in items:
        key, sep, text = item.partition("=")
        if not sep or not key:
            raise CommflowError(f"--param {item!r}: write key=value, e.g. --param box=8")
        params[key] = _number(text)
    return params


def _number(text: str) -> object:
    for kind in (int, float):
        try:
            return kind(text)
        except ValueError:
            continue
    return text


def gbps(bandwidth: float) -> float:
    """Bytes/s as GB/s (GB = 1e9 bytes, as nccl-tests prints)."""
    return bandwidth / GB


def usec(seconds: float) -> float:
    """Seconds as microseconds."""
    return seconds * 1e6


def number(value: float, digits: int = 2) -> str:
    """A float with ``digits`` decimals, ``inf`` written as such."""
    return "inf" if math.isinf(value) else f"{value:.{digits}f}"


def echo_json(value: object) -> None:
    """Print ``value`` as indented JSON on standard output (``inf`` becomes ``null``)."""
    print(json.dumps(_finite(value), indent=2))


def _finite(value: object) -> object:
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_finite(v) for v in value]
    return value


def table(*columns: str, right: tuple[str, ...] = ()) -> Table:
    """A plain table (no box) whose ``right`` columns are right-aligned."""
    t = Table(box=None, pad_edge=False, show_edge=False, header_style="bold")
    for name in columns:
        t.add_column(name, justify="right" if name in right else "left")
    return t
