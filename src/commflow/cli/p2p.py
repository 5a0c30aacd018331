"""``commflow p2p``: OSU-style point-to-point latency and bandwidth between two local ranks."""

from __future__ import annotations

import typer

from commflow.bench.p2p import KINDS, P2PSpec, run_p2p
from commflow.cli._output import choices, echo_json, out
from commflow.errors import CommflowError
from commflow.runtime import DEFAULT_TIMEOUT
from commflow.units import parse_size, size_range

Kind = choices("Kind", KINDS)

TITLES = {
    "latency": ("OSU-style latency test (ping-pong, half round trip)", "Latency (us)"),
    "bw": ("OSU-style bandwidth test (window of non-blocking sends)", "Bandwidth (MB/s)"),
    "bibw": ("OSU-style bidirectional bandwidth test", "Bandwidth (MB/s)"),
}


def _range(text: str) -> list[int]:
    low, sep, high = text.partition(":")
    sizes = (low, high) if sep else ("1", low)
    try:
        return size_range(parse_size(sizes[0]), parse_size(sizes[1]), 2)
    except CommflowError as error:
        raise CommflowError(f"-m {text}: {error}; write MIN:MAX, e.g. -m 1:4M") from None


def p2p(
    kind: Kind = typer.Argument("latency", help="The benchmark."),  # type: ignore[valid-type]
    message_size: str = typer.Option(
        "1:4M", "-m", "--message-size", help="Sizes MIN:MAX in bytes (powers of 2), or MAX."
    ),
    iters: int = typer.Option(
        None, "-i", "--iterations", help="Timed iterations (latency 1000, bw 100; /10 above 8K)."
    ),
    warmup: int = typer.Option(
        None, "-x", "--warmup", help="Untimed iterations (latency 100, bw 10; /10 above 8K)."
    ),
    window: int = typer.Option(64, "-W", "--window-size", help="bw/bibw: messages in flight."),
    timeout: float = typer.Option(DEFAULT_TIMEOUT, "--timeout", help="Seconds any wait may take."),
    as_json: bool = typer.Option(False, "--json", help="Print the rows as JSON."),
) -> None:
    """Point-to-point latency or bandwidth between two local ranks, as OSU's benchmarks.

    Two ranks of commflow's shared-memory runtime, printed as the OSU micro-benchmarks print
    them.

    latency: ping-pong, half the round trip in microseconds. bw: rank 0 sends
    a window of -W messages, rank 1 answers with one byte; MB/s (1e6 bytes/s)
    = window x size / time. bibw: both ranks send a window at once; both
    directions count. Messages above 8 KiB run a tenth of the iterations.

    [bold]Examples[/bold]

      commflow p2p latency
      commflow p2p bw -m 1K:4M
      commflow p2p bibw -m 4M -i 20 --json
    """
    name = kind.value
    large = name == "latency"
    spec = P2PSpec(
        kind=name,
        sizes=tuple(_range(message_size)),
        iters=(1000 if large else 100) if iters is None else iters,
        warmup=(100 if large else 10) if warmup is None else warmup,
        window=window,
        timeout=timeout,
    )
    rows = run_p2p(spec)
    scale = 1e6 if name == "latency" else 1e-6
    if as_json:
        unit = "latency_us" if name == "latency" else "bandwidth_mbs"
        echo_json([{"size": r.size, unit: r.value * scale} for r in rows])
        return
    title, column = TITLES[name]
    out.print(f"# {title}, commflow shared memory, 2 ranks", markup=False)
    out.print(f"# {'Size':<10}{column:>20}", markup=False)
    for r in rows:
        out.print(f"{r.size:<12}{r.value * scale:>20.2f}", markup=False)
