"""Load a topology by preset name (``dgx-a100x4``, ``ring8``, ...) or from a file.

Preset names are case-insensitive and accept ``_`` for ``-``; rail-optimized systems joined by
``+`` (``dgx-a100x2+dgx-h100``) make one heterogeneous cluster (:func:`systems.mixed`). Files
are read by extension
(``.json``, ``.yaml``/``.yml``, ``.xml``) or, failing that, by content: ``<`` opens NCCL XML,
``{`` JSON, a row starting ``GPU0`` the ``nvidia-smi topo -m`` matrix.
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from commflow.errors import TopologyError
from commflow.topology import synthetic, systems
from commflow.topology.formats import json_yaml, nccl_xml, nvidia_smi
from commflow.topology.graph import Topology


@dataclass(frozen=True)
class _Preset:
    pattern: str
    regex: re.Pattern[str]
    build: Callable[[re.Match[str]], Topology]


def _boxes(match: re.Match[str]) -> int:
    return int(match["boxes"] or 1)


_BOXES = r"(?:x(?P<boxes>\d+))?"
_SYSTEMS: dict[str, Callable[..., Topology]] = {
    "ndv2": systems.ndv2,
    "dgx2": systems.dgx2,
    "dgx-a100": systems.dgx_a100,
    "dgx-h100": systems.dgx_h100,
    "mi250": systems.mi250,
}
_PRESETS = (
    _Preset("dgx1", re.compile("dgx1"), lambda m: systems.dgx1()),
    *(
        _Preset(
            f"{key}[x<boxes>]",
            re.compile(key.replace("-", "-?") + _BOXES),
            lambda m, build=build: build(_boxes(m)),
        )
        for key, build in _SYSTEMS.items()
    ),
    _Preset("ring<n>", re.compile(r"ring(\d+)"), lambda m: synthetic.ring(int(m[1]))),
    _Preset("line<n>", re.compile(r"line(\d+)"), lambda m: synthetic.line(int(m[1]))),
    _Preset(
        "fully-connected<n> (fc<n>)",
        re.compile(r"(?:fully-connected|fc)(\d+)"),
        lambda m: synthetic.fully_connected(int(m[1])),
    ),
    _Preset("switch<n>", re.compile(r"switch(\d+)"), lambda m: synthetic.switch(int(m[1]))),
    _Preset("fat-tree<k>", re.compile(r"fat-?tree(\d+)"), lambda m: synthetic.fat_tree(int(m[1]))),
    _Preset(
        "torus<d1>x<d2>[x<d3>...]",
        re.compile(r"torus(\d+(?:x\d+)*)"),
        lambda m: synthetic.torus(tuple(int(d) for d in m[1].split("x"))),
    ),
)

_PARSERS: dict[str, Callable[..., Topology]] = {
    ".json": json_yaml.parse_json,
    ".yaml": json_yaml.parse_yaml,
    ".yml": json_yaml.parse_yaml,
    ".xml": nccl_xml.parse,
}


def presets() -> tuple[str, ...]:
    """The preset name patterns :func:`load` accepts (``<n>``: a number, ``[...]``: optional)."""
    return (*(p.pattern for p in _PRESETS), "dgx-a100[x<boxes>]+dgx-h100[x<boxes>]+...")


_MIXED_PART = re.compile("(?P<system>" + "|".join(systems.RAIL_SYSTEMS) + ")" + _BOXES)


def _mixed(key: str) -> Topology | None:
    """``dgx-a100x2+dgx-h100``: :func:`systems.mixed`; ``None`` unless every part matches."""
    parts = []
    for text in key.split("+"):
        match = _MIXED_PART.fullmatch(text.strip())
        if match is None:
            return None
        parts.append((match["system"], _boxes(match)))
    return systems.mixed(parts)


def _preset(name: str) -> Topology | None:
    key = name.strip().lower().replace("_", "-")
    if "+" in key:
        return _mixed(key)
    for preset in _PRESETS:
        match = preset.regex.fullmatch(key)
        if match:
            return preset.build(match)
    return None


def _sniff(text: str, source: str) -> Callable[..., Topology]:
    start = text.lstrip()[:1]
    if start == "<":
        return nccl_xml.parse
    if start == "{":
        return json_yaml.parse_json
    if re.search(r"^\s*(?:\x1b\[[0-9;]*m)?\s*GPU0\s", text, re.MULTILINE):
        return nvidia_smi.parse
    raise TopologyError(
        f"{source}: unknown topology file format; use .json, .yaml, .xml (NCCL topology) or "
        "the output of `nvidia-smi topo -m`"
    )


def _load_file(path: Path) -> Topology:
    try:
        text = path.read_text()
    except (OSError, UnicodeDecodeError) as e:
        raise TopologyError(f"cannot read topology file {path}: {e}") from None
    parser = _PARSERS.get(path.suffix.lower()) or _sniff(text, str(path))
    return parser(text, name=path.stem, source=str(path))


def load(name_or_path: str | os.PathLike) -> Topology:
    """A topology from a preset name (see :func:`presets`) or a file path; a string that
    matches a preset is the preset even if a file of that name exists.

    Raises ``TopologyError`` for an unknown name (listing the presets), an unreadable file, or
    a malformed file (naming its line or element).
    """
    if isinstance(name_or_path, str):
        topology = _preset(name_or_path)
        if topology is not None:
            return topology
    path = Path(name_or_path)
    if path.is_file():
        return _load_file(path)
    raise TopologyError(
        f"unknown topology {str(name_or_path)!r}: not a preset ({', '.join(presets())}) and "
        "not an existing file; give a preset name or the path of a JSON/YAML, NCCL topology "
        "XML or `nvidia-smi topo -m` file"
    )
