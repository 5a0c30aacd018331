"""All-reduce time between hosts on the commflow backend and on gloo, with the rank idle and
with a thread computing beside it (as training's backward does): 22 queued 1 MiB all-reduces
(the transformer's layers in benchmarks/sched_live.py), and single blocking ones of 1-15 MiB
(DDP's buckets).

    commflow cluster up --hosts 2 --ranks-per-host 1 --bandwidth 1gbit --delay 100us
    PYTHONPATH=src python benchmarks/allreduce_under_load.py --hosts h0:1,h1:1

Reported: rank 0's median of ``--reps`` timings (ms), per all-reduce for the queued ones.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import threading
import time

import torch
import torch.distributed as dist

import commflow.torch  # noqa: F401  (registers the backend)
from commflow.runtime.launcher import launch

LAYER = 263_168 * 4
"""Bytes of one of the transformer's attention or linear layers' gradients."""


def _compute(stop: threading.Event, size: int) -> None:
    a = torch.randn(size, size)
    while not stop.is_set():
        a = torch.tanh(a @ a)


def _time(group, sizes: list[int], reps: int) -> float:
    """Median seconds to all-reduce tensors of ``sizes`` bytes, issued at once then waited."""
    tensors = [torch.ones(n // 4) for n in sizes]
    out = []
    for _ in range(reps):
        dist.barrier(group=group)
        start = time.perf_counter()
        works = [dist.all_reduce(t, group=group, async_op=True) for t in tensors]
        for w in works:
            w.wait()
        out.append(time.perf_counter() - start)
    return statistics.median(out)


def _rank(reps: int) -> None:
    torch.set_num_threads(1)
    dist.init_process_group("commflow")
    groups = {"gloo": dist.new_group(backend="gloo"), "commflow": None}
    rows = []
    for load, size in (("idle", 0), ("matmul 256", 256), ("matmul 1024", 1024)):
        stop = threading.Event()
        thread = threading.Thread(target=_compute, args=(stop, size), daemon=True)
        if size:
            thread.start()
        for case, sizes, per in (("22 x 1 MiB queued", [LAYER] * 22, 22),
                                 ("1 MiB", [1 << 20], 1), ("4 MiB", [4 << 20], 1),
                                 ("15 MiB", [15 << 20], 1)):
            times = {name: 1e3 * _time(g, sizes, reps) / per for name, g in groups.items()}
            rows.append((load, case, times["commflow"], times["gloo"]))
        stop.set()
        if size:
            thread.join()
    if dist.get_rank() == 0:
        print("| beside the ranks | all-reduces | commflow (ms) | gloo (ms) | commflow / gloo |")
        print("|---|---|---|---|---|")
        for load, case, ours, gloo in rows:
            print(f"| {load} | {case} | {ours:.2f} | {gloo:.2f} | {ours / gloo:.2f} |")
    dist.destroy_process_group()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--hosts", default="h0:1,h1:1", help="emulated hosts, e.g. h0:1,h1:1")
    ap.add_argument("--reps", type=int, default=5)
    args = ap.parse_args()
    if "RANK" in os.environ:
        _rank(args.reps)
        return
    nranks = sum(int(h.split(":")[1]) for h in args.hosts.split(","))
    env = {"OMP_NUM_THREADS": "1", "GLOO_SOCKET_IFNAME": "eth0"}
    sys.exit(launch([sys.executable, *sys.argv], nranks, hosts=args.hosts, prefix_output=False,
                    env=env))


if __name__ == "__main__":
    main()
