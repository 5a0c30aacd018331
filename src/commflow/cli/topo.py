"""``commflow topo``: show a topology, list the presets."""

from __future__ import annotations

from collections import Counter

import typer

from commflow.cli._group import CommflowGroup
from commflow.cli._output import echo_json, gbps, number, out, table, usec
from commflow.topology import NodeKind, Topology, diameter, fingerprint, load, presets

app = typer.Typer(
    help="Inspect topologies (presets or files).", no_args_is_help=True, cls=CommflowGroup
)


@app.command("show")
def show(
    topology: str = typer.Argument(
        ..., metavar="NAME|FILE", help="Preset name (see `commflow topo list`) or topology file."
    ),
    as_json: bool = typer.Option(False, "--json", help="Print the summary as JSON."),
) -> None:
    """Summarize a topology and list its links grouped by bandwidth.

    The summary counts ranks, switches, NICs, boxes and directed links, gives each rank's
    total outgoing bandwidth, the diameter in rank hops and the fingerprint; link groups are
    directed links of equal bandwidth, parallel-link count and latency.

    [bold]Examples[/bold]

      commflow topo show dgx1
      commflow topo show dgx-a100x2 --json
      commflow topo show my_cluster.yaml
    """
    topo = load(topology)
    summary = _summary(topo)
    if as_json:
        echo_json(summary)
        return
    out.print(f"[bold]{topo.name}[/bold]")
    rank_out = summary["rank_out_bandwidth"]
    low, high = min(rank_out), max(rank_out)
    rows = [
        ("ranks", str(topo.nranks)),
        ("switches", str(summary["switches"])),
        ("NICs", str(summary["nics"])),
        ("boxes", str(topo.nboxes)),
        ("links (directed)", str(len(topo.links))),
        ("out GB/s per rank", number(low) if low == high else f"{number(low)} .. {number(high)}"),
        ("diameter (rank hops)", str(summary["diameter"])),
        ("fingerprint", str(summary["fingerprint"])),
    ]
    for label, value in rows:
        out.print(f"  {label:<22}{value}", markup=False)
    out.print()
    links = table(
        "GB/s",
        "parallel",
        "latency(us)",
        "links",
        "between",
        right=("GB/s", "parallel", "latency(us)", "links"),
    )
    for group in summary["link_groups"]:
        links.add_row(
            number(group["bandwidth"]),
            str(group["parallel"]),
            number(group["latency_us"]),
            str(group["links"]),
            ", ".join(f"{k} x{v}" for k, v in group["between"].items()),
        )
    out.print(links)


def _summary(topo: Topology) -> dict:
    """The summary as plain data: bandwidths in GB/s, latencies in microseconds."""
    kinds = Counter(n.kind for n in topo.nodes)
    rank_out = [gbps(sum(lk.bandwidth for lk in topo.out_links(r))) for r in range(topo.nranks)]
    groups: dict[tuple[float, int, float], Counter] = {}
    for link in topo.links:
        key = (link.bandwidth, link.count, link.latency)
        pair = f"{topo.nodes[link.src].kind.value}->{topo.nodes[link.dst].kind.value}"
        groups.setdefault(key, Counter())[pair] += 1
    return {
        "name": topo.name,
        "ranks": topo.nranks,
        "switches": kinds[NodeKind.SWITCH],
        "nics": kinds[NodeKind.NIC],
        "boxes": topo.nboxes,
        "links": len(topo.links),
        "rank_out_bandwidth": rank_out,
        "diameter": diameter(topo),
        "fingerprint": fingerprint(topo),
        "link_groups": [
            {
                "bandwidth": gbps(bw),
                "parallel": count,
                "latency_us": usec(lat),
                "links": sum(pairs.values()),
                "between": dict(sorted(pairs.items())),
            }
            for (bw, count, lat), pairs in sorted(groups.items(), key=lambda g: (-g[0][0], g[0]))
        ],
    }


@app.command("list")
def list_presets(
    as_json: bool = typer.Option(False, "--json", help="Print the patterns as a JSON list."),
) -> None:
    """List the preset name patterns `commflow topo show` and `--topo` accept.

    `<n>` is a number, `[...]` is optional; names are case-insensitive.

    [bold]Examples[/bold]

      commflow topo list
      commflow topo show dgx-h100x4
    """
    patterns = list(presets())
    if as_json:
        echo_json(patterns)
        return
    for pattern in patterns:
        out.print(pattern, markup=False)
