"""``commflow cluster up`` / ``down`` / ``status``: emulated hosts on this machine."""

from __future__ import annotations

import typer

from commflow.cli._group import CommflowGroup
from commflow.cli._output import echo_json, out, table
from commflow.runtime import cluster
from commflow.units import parse_bandwidth, parse_time

app = typer.Typer(
    help="Emulated hosts on this machine: network namespaces behind a bridge, links shaped "
    "with tc (needs root).",
    no_args_is_help=True,
    cls=CommflowGroup,
)


def _describe(spec: cluster.ClusterSpec, as_json: bool) -> None:
    if as_json:
        echo_json(
            {
                **spec.__dict__,
                "namespaces": [spec.namespace(i) for i in range(spec.hosts)],
                "addresses": [spec.address(i) for i in range(spec.hosts)],
                "hosts_arg": spec.hosts_arg(),
            }
        )
        return
    rows = table("host", "namespace", "address", "ranks")
    for i in range(spec.hosts):
        rows.add_row(f"h{i}", spec.namespace(i), spec.address(i), str(spec.ranks_per_host))
    out.print(rows)
    out.print(
        f"link: {spec.bandwidth * 8 / 1e6:g} Mbit/s each way per host (tc tbf), one-way "
        f"delay {spec.delay * 1e6:g} us (added by commflow's engine transport)"
    )
    out.print(f"run:  commflow run --hosts {spec.hosts_arg()} COMMAND")


def up(
    hosts: int = typer.Option(2, "--hosts", help="Number of emulated hosts."),
    ranks_per_host: int = typer.Option(1, "--ranks-per-host", help="Ranks to place per host."),
    bandwidth: str = typer.Option(
        "1gbit", "--bandwidth", help="Each host's link rate, tc style: 1gbit, 200mbit."
    ),
    delay: str = typer.Option("0", "--delay", help="One-way delay between hosts: 100us, 1ms."),
    as_json: bool = typer.Option(False, "--json", help="Print the cluster as JSON."),
) -> None:
    """Create hosts commflow-h0..h{N-1} (replacing an existing cluster).

    Each host is a network namespace with address 198.18.0.<i+1> on a veth pair to
    a bridge in namespace commflow-sw; tc tbf shapes both directions of each link
    to --bandwidth. The kernel has no netem, so --delay is added by commflow's
    engine transport to each message between hosts.

    [bold]Examples[/bold]

      commflow cluster up --hosts 2 --ranks-per-host 2 --bandwidth 1gbit --delay 100us
      commflow run --hosts h0:2,h1:2 train.py
    """
    spec = cluster.ClusterSpec(
        hosts=hosts,
        ranks_per_host=ranks_per_host,
        bandwidth=parse_bandwidth(bandwidth),
        delay=round(parse_time(delay), 9),  # whole nanoseconds: 100us is 1e-4 s exactly
    )
    _describe(cluster.up(spec), as_json)


def down() -> None:
    """Remove the emulated hosts and the switch (nothing to do when there are none)."""
    removed = cluster.down()
    out.print(f"removed {', '.join(removed)}" if removed else "no cluster to remove")


def status(
    as_json: bool = typer.Option(False, "--json", help="Print the cluster as JSON."),
) -> None:
    """Show the emulated cluster, if there is one."""
    spec = cluster.current()
    if spec is None:
        if as_json:
            echo_json(None)
        else:
            out.print("no cluster (create one with `commflow cluster up`)")
        return
    _describe(spec, as_json)


app.command("up")(up)
app.command("down")(down)
app.command("status")(status)
