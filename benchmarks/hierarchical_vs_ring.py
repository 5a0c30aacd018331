"""Hierarchical vs flat ring allreduce between emulated hosts over a shaped link, measured and
predicted by ``commflow.sim.simulate``.

    commflow cluster up --hosts 2 --ranks-per-host 2 --bandwidth 1gbit --delay 100us
    commflow run --hosts h0:2,h1:2 benchmarks/hierarchical_vs_ring.py --sizes 4M,16M,64M
    commflow cluster down

Every rank first calibrates what the model needs: one-way latency and bandwidth of shared
memory inside a host (local ranks 0 -> 1), one-way latency between hosts (rank 0 -> first rank
of the next host, the injected delay included), and this machine's reduce and copy bandwidths.
The topology has the ranks of each host joined by shared-memory links and to a NIC, each NIC
joined to one switch by the shaped link (the cluster's rate each way, half the delay each
hop). Each timed iteration starts after a barrier; its time is the slowest rank's. Rank 0
prints the median, its 95% confidence interval (Hoefler & Belli) and both models' predictions
for the same programs the runtime executed.
"""

from __future__ import annotations

import argparse
import json
import time

import numpy as np

import commflow.runtime
from commflow import algorithms
from commflow.bench.memory import copy_bandwidth
from commflow.bench.stats import summarize
from commflow.collectives import Collective
from commflow.runtime.cluster import current
from commflow.sim import simulate
from commflow.topology import Link, Node, NodeKind, duplex, make_topology
from commflow.units import format_size, parse_size

ALGOS = ("hierarchical", "ring")


def one_way(comm, src: int, dst: int, nbytes: int, reps: int) -> float:
    """Median one-way time (s) of ``nbytes`` from ``src`` to ``dst`` (half a round trip)."""
    buf = np.zeros(max(nbytes, 1), np.uint8)
    times = []
    for _ in range(reps):
        start = time.perf_counter()
        if comm.rank == src:
            comm.send(buf, dst)
            comm.recv(buf, dst)
        elif comm.rank == dst:
            comm.recv(buf, src)
            comm.send(buf, src)
        times.append((time.perf_counter() - start) / 2)
    return float(np.median(times))


def calibrate(comm, per_host: int) -> dict[str, float]:
    """Latencies (s) and bandwidths (bytes/s) the model needs, measured by rank 0 and its
    peers and broadcast to every rank."""
    big = 16 << 20
    values = np.array(
        [
            one_way(comm, 0, 1, 8, 200),
            big / one_way(comm, 0, 1, big, 5),
            one_way(comm, 0, per_host, 8, 50),
            0.0,
            0.0,
        ]
    )
    if comm.rank == 0:
        a = np.ones(big // 4, np.float32)
        start = time.perf_counter()
        for _ in range(5):
            np.add(a, a, out=a)
        values[3] = 5 * big / (time.perf_counter() - start)
        values[4] = copy_bandwidth(big)
    comm.broadcast(values, root=0)
    keys = ("shm_latency", "shm_bandwidth", "engine_latency", "reduce_bandwidth", "copy_bandwidth")
    return dict(zip(keys, values.tolist(), strict=True))


def cluster_topology(hosts: int, per_host: int, link: float, delay: float, cal: dict):
    """Ranks host-major; shared memory inside a host; a NIC per host; one switch."""
    n = hosts * per_host
    nodes = [Node(r, NodeKind.RANK, f"rank{r}", r // per_host) for r in range(n)]
    nodes += [Node(n + h, NodeKind.NIC, f"nic{h}", h) for h in range(hosts)]
    nodes.append(Node(n + hosts, NodeKind.SWITCH, "switch"))
    software = max(cal["engine_latency"] - delay, 0.0) / 2
    links: list[Link] = []
    for r in range(n):
        host = r // per_host
        links += duplex(r, n + host, cal["shm_bandwidth"], software)
        for peer in range(r + 1, (host + 1) * per_host):
            links += duplex(r, peer, cal["shm_bandwidth"], cal["shm_latency"])
    for h in range(hosts):
        links += duplex(n + h, n + hosts, link, delay / 2)
    return make_topology(f"cluster-{hosts}x{per_host}", nodes, links)


def timed(comm, algo: str, nbytes: int, warmup: int, iters: int) -> list[float]:
    """Slowest rank's time (s) of each timed allreduce of ``nbytes`` float32 bytes."""
    x = np.ones(nbytes // 4, np.float32)
    out = np.empty_like(x)
    times = []
    for i in range(warmup + iters):
        comm.barrier()
        start = time.perf_counter()
        comm.allreduce(x, algo=algo, out=out)
        elapsed = np.array([time.perf_counter() - start])
        comm.allreduce(elapsed, op="max", out=elapsed)
        if i >= warmup:
            times.append(float(elapsed[0]))
    if not np.all(out == comm.size):
        raise SystemExit(f"rank {comm.rank}: wrong {algo} allreduce result")
    return times


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="4M,16M,64M", help="Allreduce sizes (bytes).")
    parser.add_argument("--warmup", type=int, default=2, help="Untimed iterations per case.")
    parser.add_argument("--iters", type=int, default=10, help="Timed iterations per case.")
    parser.add_argument("--json", help="Also write the records to this file (rank 0).")
    args = parser.parse_args()
    spec = current()
    if spec is None:
        raise SystemExit("no emulated cluster: run `commflow cluster up` first")
    comm = commflow.runtime.init()
    per_host = comm.local_size
    cal = calibrate(comm, per_host)
    topo = cluster_topology(comm.size // per_host, per_host, spec.bandwidth, spec.delay, cal)
    records = []
    for size in (parse_size(s) for s in args.sizes.split(",")):
        for algo in ALGOS:
            summary = summarize(timed(comm, algo, size, args.warmup, args.iters))
            program = algorithms.build(Collective.ALLREDUCE, algo, comm.size)
            predicted = {
                model: simulate(
                    program,
                    topo,
                    size,
                    model=model,
                    reduce_bandwidth=cal["reduce_bandwidth"],
                    copy_bandwidth=cal["copy_bandwidth"],
                ).time
                for model in ("alphabeta", "flow")
            }
            records.append(
                {
                    "size": size,
                    "algo": algo,
                    "median_s": summary.median,
                    "ci95_s": summary.ci,
                    "runs": summary.runs,
                    "predicted_s": predicted,
                }
            )
    if comm.rank == 0:
        report(records, spec, cal, args)


def report(records: list[dict], spec, cal: dict, args) -> None:
    """Print the calibration and a markdown table; write JSON when asked."""
    print(
        f"link {spec.bandwidth * 8 / 1e6:g} Mbit/s each way, delay {spec.delay * 1e6:g} us; "
        f"shm {cal['shm_bandwidth'] / 1e9:.2f} GB/s, {cal['shm_latency'] * 1e6:.1f} us; "
        f"engine one-way latency {cal['engine_latency'] * 1e6:.0f} us; reduce "
        f"{cal['reduce_bandwidth'] / 1e9:.2f} GB/s, copy {cal['copy_bandwidth'] / 1e9:.2f} GB/s"
    )
    print(
        "| size | algorithm | measured median (ms) | 95% CI (ms) | runs | alpha-beta (ms) "
        "| flow (ms) |"
    )
    print("|---|---|---|---|---|---|---|")
    for r in records:
        ci = "-" if r["ci95_s"] is None else "{:.1f}-{:.1f}".format(*(t * 1e3 for t in r["ci95_s"]))
        print(
            f"| {format_size(r['size'])} | {r['algo']} | {r['median_s'] * 1e3:.1f} | {ci} | "
            f"{r['runs']} | {r['predicted_s']['alphabeta'] * 1e3:.1f} | "
            f"{r['predicted_s']['flow'] * 1e3:.1f} |"
        )
    if args.json:
        with open(args.json, "w") as f:
            json.dump(
                {"calibration": cal, "cluster": spec.__dict__, "records": records}, f, indent=2
            )


if __name__ == "__main__":
    main()
