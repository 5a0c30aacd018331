"""commflow's own topology schema, written as JSON or YAML.

::

    {"name": "two-gpus",
     "nodes": [{"name": "gpu0", "kind": "rank", "box": 0},
               {"name": "gpu1", "kind": "rank", "box": 0},
               {"name": "sw", "kind": "switch"}],
     "links": [{"src": "gpu0", "dst": "sw", "bandwidth": 25e9, "latency": 1e-6,
                "duplex": true, "count": 1}]}

Nodes are referenced by name. ``kind`` is ``rank``, ``switch`` or ``nic``; ``box`` is optional;
so is a rank's ``accelerator`` (``"h100-sxm"``: what it computes on, read by the planner, which
sizes pipeline stages to their boxes' accelerators).
Ranks may be listed anywhere; they become ids ``0..n-1`` in the order of the rank entries, then
the other nodes follow in file order. A link's ``bandwidth`` is that of *one* link in bytes/s
(a number) or a string with units (``"25GB/s"``, ``"100gbit"``; a bare ``"25"`` means 25 GB/s,
see :func:`commflow.units.parse_bandwidth`); ``count`` parallel links (default 1) carry
``count * bandwidth``. ``latency`` is seconds or a string such as ``"1us"`` (default
:data:`~commflow.topology.synthetic.DEFAULT_LATENCY`); ``duplex`` (default true) adds the
reverse direction with the same figures.
"""

from __future__ import annotations

import json
import math
import os
import re
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from commflow.errors import CommflowError, TopologyError
from commflow.topology.graph import Link, Node, NodeKind, Topology, make_topology
from commflow.topology.synthetic import DEFAULT_LATENCY
from commflow.units import parse_bandwidth, parse_time

_NODE_KEYS = {"name", "kind", "box", "accelerator"}
_LINK_KEYS = {"src", "dst", "bandwidth", "latency", "duplex", "count"}


def _mapping(value: object, where: str, keys: set[str]) -> Mapping[str, Any]:
    if not isinstance(value, Mapping):
        raise TopologyError(f"{where}: expected a mapping, got {type(value).__name__}")
    unknown = set(value) - keys
    if unknown:
        raise TopologyError(
            f"{where}: unknown key(s) {sorted(map(str, unknown))}; allowed: {sorted(keys)}"
        )
    return value


def _list(data: Mapping[str, Any], key: str, source: str) -> list[Any]:
    value = data.get(key)
    if not isinstance(value, list):
        raise TopologyError(f"{source}: '{key}' must be a list (see the commflow topology schema)")
    return value


def _quantity(value: object, where: str, parse: Callable[[str], float], what: str) -> float:
    """A number, or a string with units parsed by ``parse``."""
    if isinstance(value, bool) or not isinstance(value, int | float | str):
        raise TopologyError(f"{where}: {what} must be a number or a string with units")
    if isinstance(value, str):
        try:
            number = parse(value)
        except CommflowError as e:
            raise TopologyError(f"{where}: {e}") from None
    else:
        try:
            number = float(value)
        except OverflowError:
            number = math.inf
    if not math.isfinite(number):
        raise TopologyError(f"{where}: {what} must be finite, got {value!r}")
    return number


def _order(spec: tuple) -> tuple[bool, int]:
    """Ranks first, then file order."""
    return spec[0], spec[1]


def _nodes(entries: list[Any], source: str) -> tuple[list[Node], dict[str, int]]:
    specs = []
    for i, entry in enumerate(entries):
        where = f"{source}: nodes[{i}]"
        entry = _mapping(entry, where, _NODE_KEYS)
        name, box = entry.get("name"), entry.get("box")
        if not isinstance(name, str) or not name:
            raise TopologyError(f"{where}: 'name' must be a non-empty string")
        try:
            kind = NodeKind(entry.get("kind"))
        except ValueError:
            kinds = [k.value for k in NodeKind]
            raise TopologyError(f"{where} ({name}): 'kind' must be one of {kinds}") from None
        if box is not None and (isinstance(box, bool) or not isinstance(box, int)):
            raise TopologyError(f"{where} ({name}): 'box' must be an integer or null")
        accelerator = entry.get("accelerator")
        if accelerator is not None and (not isinstance(accelerator, str) or not accelerator
                                        or kind is not NodeKind.RANK):
            raise TopologyError(
                f"{where} ({name}): 'accelerator' must be a non-empty string on a rank "
                "(e.g. \"h100-sxm\")")
        specs.append((kind is not NodeKind.RANK, i, name, kind, box, accelerator))
    nodes, ids = [], {}
    for node_id, (_, i, name, kind, box, accelerator) in enumerate(sorted(specs, key=_order)):
        if name in ids:
            raise TopologyError(f"{source}: nodes[{i}]: duplicate node name {name!r}")
        ids[name] = node_id
        nodes.append(Node(node_id, kind, name, box, accelerator))
    return nodes, ids


def _links(entries: list[Any], ids: dict[str, int], source: str) -> list[Link]:
    links = []
    for i, entry in enumerate(entries):
        where = f"{source}: links[{i}]"
        entry = _mapping(entry, where, _LINK_KEYS)
        ends = []
        for key in ("src", "dst"):
            if entry.get(key) not in ids:
                raise TopologyError(f"{where}: '{key}' {entry.get(key)!r} is not a node name")
            ends.append(ids[entry[key]])
        where = f"{where} ({entry['src']} -> {entry['dst']})"
        if "bandwidth" not in entry:
            raise TopologyError(f"{where}: missing 'bandwidth' (bytes/s or e.g. '25GB/s')")
        bandwidth = _quantity(entry["bandwidth"], where, parse_bandwidth, "bandwidth")
        latency = _quantity(entry.get("latency", DEFAULT_LATENCY), where, parse_time, "latency")
        count, both = entry.get("count", 1), entry.get("duplex", True)
        if isinstance(count, bool) or not isinstance(count, int) or count < 1:
            raise TopologyError(f"{where}: 'count' must be an integer >= 1, got {count!r}")
        if not isinstance(both, bool):
            raise TopologyError(f"{where}: 'duplex' must be true or false, got {both!r}")
        if ends[0] == ends[1] or not (bandwidth > 0 and latency >= 0):
            raise TopologyError(
                f"{where}: a link needs two different nodes, bandwidth > 0 and latency >= 0"
            )
        src, dst = ends
        links.append(Link(src, dst, bandwidth * count, latency, count))
        if both:
            links.append(Link(dst, src, bandwidth * count, latency, count))
    return links


def from_dict(data: object, *, name: str = "topology", source: str = "<dict>") -> Topology:
    """Build a topology from the schema above (``name`` unless the data names it).

    Raises ``TopologyError`` naming ``source`` and the offending element (``links[3]``).
    """
    data = _mapping(data, source, {"name", "nodes", "links"})
    nodes, ids = _nodes(_list(data, "nodes", source), source)
    links = _links(_list(data, "links", source), ids, source)
    return make_topology(str(data.get("name") or name), nodes, links)


def dump(topology: Topology) -> dict[str, Any]:
    """The topology in the schema above; a link whose reverse has the same figures is written
    once with ``duplex: true``. Raises ``TopologyError`` when node names are not unique."""
    names = [n.name for n in topology.nodes]
    if len(set(names)) != len(names):
        raise TopologyError(f"{topology.name}: node names must be unique to be saved")
    links = []
    for lk in topology.links:
        back = topology.link(lk.dst, lk.src)
        both = back is not None and (back.bandwidth, back.latency, back.count) == (
            lk.bandwidth,
            lk.latency,
            lk.count,
        )
        if both and lk.src > lk.dst:
            continue
        links.append(
            {
                "src": names[lk.src],
                "dst": names[lk.dst],
                "bandwidth": lk.bandwidth / lk.count,
                "latency": lk.latency,
                "duplex": both,
                "count": lk.count,
            }
        )
    return {
        "name": topology.name,
        "nodes": [
            {"name": n.name, "kind": n.kind.value, "box": n.box}
            | ({"accelerator": n.accelerator} if n.accelerator else {})
            for n in topology.nodes
        ],
        "links": links,
    }


def save(topology: Topology, path: str | os.PathLike) -> Path:
    """Write the topology to ``path`` as YAML (``.yaml``/``.yml``) or else JSON; returns the
    path. Raises ``TopologyError`` when the file cannot be written."""
    path = Path(path)
    data = dump(topology)
    if path.suffix.lower() in (".yaml", ".yml"):
        import yaml

        text = yaml.safe_dump(data, sort_keys=False)
    else:
        text = json.dumps(data, indent=2) + "\n"
    try:
        path.write_text(text)
    except OSError as e:
        raise TopologyError(f"cannot write topology file {path}: {e.strerror}") from None
    return path


def parse_json(text: str, *, name: str = "topology", source: str = "<json>") -> Topology:
    """Parse a JSON document in the schema above; errors name the line or element."""
    try:
        data = json.loads(text)
    except json.JSONDecodeError as e:
        raise TopologyError(
            f"{source}: line {e.lineno}, column {e.colno}: invalid JSON: {e.msg}"
        ) from None
    except RecursionError:
        raise TopologyError(f"{source}: invalid JSON: nested too deeply") from None
    return from_dict(data, name=name, source=source)


_YAML_FLOAT = re.compile(
    r"^[-+]?(?:[0-9][0-9_]*\.[0-9_]*|\.[0-9_]+|[0-9][0-9_]*)(?:[eE][-+]?[0-9]+)?$"
)
"""Floats as YAML 1.2 writes them: PyYAML (YAML 1.1) would read ``25e9`` as a string."""


def parse_yaml(text: str, *, name: str = "topology", source: str = "<yaml>") -> Topology:
    """Parse a YAML document in the schema above; errors name the line or element.

    Numbers in exponent form without a dot or sign (``25e9``) are read as floats.
    """
    import yaml

    class Loader(yaml.SafeLoader):
        pass

    Loader.add_implicit_resolver("tag:yaml.org,2002:float", _YAML_FLOAT, list("-+0123456789."))
    try:
        data = yaml.load(text, Loader=Loader)
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        line = f"line {mark.line + 1}: " if mark is not None else ""
        problem = getattr(e, "problem", None) or e
        raise TopologyError(f"{source}: {line}invalid YAML: {problem}") from None
    except RecursionError:
        raise TopologyError(f"{source}: invalid YAML: nested too deeply") from None
    return from_dict(data, name=name, source=source)
