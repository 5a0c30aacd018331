"""The matrix printed by ``nvidia-smi topo -m``.

A header row of device columns (``GPU0 GPU1 ... NIC0 ...`` followed by ``CPU Affinity`` and
other affinity columns), one row per device, then a blank line and a legend. Entries are ``X``
(self), ``NV#`` (a bonded set of # NVLinks) or a PCIe/system path (``PIX PXB PXN PHB NODE SYS``,
``SOC`` in old drivers). Modelling choices:

- ``NV#`` is # NVLinks of :data:`NVLINK_BANDWIDTH` directly between the two GPUs — unless a
  GPU's NVLinks add up to more than :data:`MAX_NVLINKS_PER_GPU`, which only an NVSwitch can
  show (DGX A100 prints ``NV12`` between every pair): then every pair must show the same ``NV#``
  and each GPU gets # links to one NVSwitch node (never a full mesh);
- every GPU with a non-NVLink entry links to one PCIe host/switch node at
  :data:`PCIE_BANDWIDTH` (so with no NVLink at all, every GPU is on that switch);
- NIC rows and columns are read past: the matrix does not give their speed.

All nodes are box 0; latencies are :data:`~commflow.topology.systems.INTRA_BOX_LATENCY`.
"""

from __future__ import annotations

import re

from commflow.errors import TopologyError
from commflow.topology.graph import Link, Node, NodeKind, Topology, duplex, make_topology
from commflow.topology.systems import INTRA_BOX_LATENCY

NVLINK_BANDWIDTH = 25e9
"""Bytes/s per NVLink per direction assumed for ``NV#`` entries (NVLink2-4 per link)."""

PCIE_BANDWIDTH = 16e9
"""Bytes/s per direction of a GPU's PCIe link (PCIe 3.0/4.0 x16 order of magnitude)."""

MAX_NVLINKS_PER_GPU = 18
"""Most NVLinks one GPU has (H100); a larger total in one row means an NVSwitch."""

PCIE_PATHS = frozenset({"PIX", "PXB", "PXN", "PHB", "NODE", "SYS", "SOC"})
"""Matrix entries that mean a path over PCIe (and maybe the CPU interconnect)."""

_ANSI = re.compile(r"\x1b\[[0-9;]*m")
_GPU = re.compile(r"GPU(\d+)")
_NVLINK = re.compile(r"NV(\d+)")
_AFFINITY_COLUMNS = frozenset({"CPU", "NUMA"})


def _fail(source: str, lineno: int, message: str) -> TopologyError:
    return TopologyError(f"{source}: line {lineno}: {message}")


def _matrix(text: str, source: str) -> tuple[list[int], list[list[str]]]:
    """The GPU x GPU entries and the line number of each GPU row."""
    lines = [_ANSI.sub("", line).split() for line in text.splitlines()]
    header = next((i for i, tokens in enumerate(lines) if tokens[:1] == ["GPU0"]), None)
    if header is None:
        raise TopologyError(f"{source}: no header row starting with GPU0 (nvidia-smi topo -m)")
    columns: list[str] = []
    for token in lines[header]:
        if token in _AFFINITY_COLUMNS:
            break
        columns.append(token)
    ngpus = sum(1 for c in columns if _GPU.fullmatch(c))
    if columns[:ngpus] != [f"GPU{i}" for i in range(ngpus)]:
        raise _fail(source, header + 1, "GPU columns must come first, as GPU0 GPU1 ... in order")
    rows: dict[str, tuple[int, list[str]]] = {}
    for i in range(header + 1, len(lines)):
        tokens = lines[i]
        if not tokens or tokens[0].rstrip(":") == "Legend":
            break
        if len(tokens) < len(columns) + 1:
            raise _fail(source, i + 1, f"row {tokens[0]} has fewer than {len(columns)} entries")
        rows[tokens[0]] = (i + 1, tokens[1 : 1 + ngpus])
    missing = [f"GPU{g}" for g in range(ngpus) if f"GPU{g}" not in rows]
    if missing:
        raise _fail(source, header + 1, f"no matrix row for {', '.join(missing)}")
    return [rows[f"GPU{g}"][0] for g in range(ngpus)], [rows[f"GPU{g}"][1] for g in range(ngpus)]


def _nvlink_counts(linenos: list[int], entries: list[list[str]], source: str) -> list[list[int]]:
    """``[src][dst]`` NVLink count (0 for a PCIe path); checks entries and symmetry."""
    n = len(entries)
    counts = [[0] * n for _ in range(n)]
    for a in range(n):
        for b, entry in enumerate(entries[a]):
            nv = _NVLINK.fullmatch(entry)
            if (entry == "X") != (a == b) or not (nv or entry in PCIE_PATHS or a == b):
                raise _fail(
                    source,
                    linenos[a],
                    f"GPU{a} column GPU{b}: unexpected entry {entry!r} (X only on the diagonal; "
                    f"NV# or one of {sorted(PCIE_PATHS)} elsewhere)",
                )
            counts[a][b] = int(nv.group(1)) if nv else 0
    for a in range(n):
        for b in range(a):
            if counts[a][b] != counts[b][a]:
                raise _fail(
                    source,
                    linenos[a],
                    f"GPU{a} shows NV{counts[a][b]} to GPU{b} but GPU{b} shows NV{counts[b][a]}",
                )
    return counts


def parse(text: str, *, name: str = "nvidia-smi", source: str = "<nvidia-smi>") -> Topology:
    """Parse ``nvidia-smi topo -m`` output into a single-box :class:`Topology`.

    Raises ``TopologyError`` naming the line of a missing header or row, an unknown entry, an
    asymmetric NVLink count, or NVSwitch-like rows whose counts differ.
    """
    linenos, entries = _matrix(text, source)
    counts = _nvlink_counts(linenos, entries, source)
    n = len(counts)
    nodes = [Node(g, NodeKind.RANK, f"gpu{g}", 0) for g in range(n)]
    links: list[Link] = []

    def hub(node_name: str) -> int:
        nodes.append(Node(len(nodes), NodeKind.SWITCH, node_name, 0))
        return len(nodes) - 1

    per_gpu = [sum(row) for row in counts]
    if max(per_gpu) > MAX_NVLINKS_PER_GPU:
        ports = {counts[a][b] for a in range(n) for b in range(n) if a != b}
        if len(ports) != 1:
            worst = per_gpu.index(max(per_gpu))
            raise _fail(
                source,
                linenos[worst],
                f"GPU{worst} shows {per_gpu[worst]} NVLinks (> {MAX_NVLINKS_PER_GPU}, so an "
                "NVSwitch) but the pairs show different NV# counts; describe this machine in "
                "the commflow JSON/YAML schema instead",
            )
        (port,) = ports
        switch = hub("nvswitch")
        for g in range(n):
            links += duplex(g, switch, port * NVLINK_BANDWIDTH, INTRA_BOX_LATENCY, port)
    else:
        for a in range(n):
            for b in range(a + 1, n):
                if counts[a][b]:
                    bandwidth = counts[a][b] * NVLINK_BANDWIDTH
                    links += duplex(a, b, bandwidth, INTRA_BOX_LATENCY, counts[a][b])
    on_pcie = [g for g in range(n) if any(counts[g][b] == 0 for b in range(n) if b != g)]
    if on_pcie:
        switch = hub("pcie")
        for g in on_pcie:
            links += duplex(g, switch, PCIE_BANDWIDTH, INTRA_BOX_LATENCY)
    return make_topology(name, nodes, links)
