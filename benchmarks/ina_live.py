"""Live in-network aggregation vs a ring allreduce, 4 workers on one machine.

    PYTHONPATH=src python benchmarks/ina_live.py --ranks 4 --sizes 1,16,64 --loss 0,0.05

INA: ``ina_allreduce`` through a ``commflow ina switch`` process on UDP loopback, with the
drop probability injected on every worker's and the switch's sends. Ring: the runtime's
``ring`` allreduce over commflow's shared-memory communicator (the same processes; no loss,
shared memory cannot drop). Prints per size (MiB, float32) and loss: the slowest rank's median
time of ``--reps`` calls, algbw (GB/s), retransmissions per call and the largest error found
relative to the protocol's bound (must stay <= 1).
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import re
import subprocess
import sys
import time
import uuid

import numpy as np

import commflow.runtime as runtime
from commflow.ina import Faults, WorkerStats, error_bound, ina_allreduce


def _rank(rank: int, nranks: int, job: str, addr: tuple[str, int], sizes: list[int],
          loss: float, reps: int, slots: int, values: int, queue) -> None:
    comm = runtime.init(rank=rank, world_size=nranks, job=job, timeout=600)
    faults = Faults(drop=loss, seed=1000 + rank)
    for mib in sizes:
        xs = [np.random.default_rng(r).standard_normal(mib << 18).astype(np.float32)
              for r in range(nranks)]
        ina, ring, retx, worst = [], [], 0, 0.0
        comm.allreduce(xs[rank], algo="ring")
        for _ in range(reps):
            stats = WorkerStats()
            comm.barrier()
            t = time.perf_counter()
            y = ina_allreduce(xs[rank], switch=addr, rank=rank, nranks=nranks, slots=slots,
                              faults=faults, stats=stats, timeout=120)
            ina.append(time.perf_counter() - t)
            retx += stats.retransmits
            comm.barrier()
            t = time.perf_counter()
            comm.allreduce(xs[rank], algo="ring")
            ring.append(time.perf_counter() - t)
        exact = np.sum([x.astype(np.float64) for x in xs], axis=0)
        bound = error_bound(xs, values) + np.spacing(np.abs(exact).astype(np.float32))
        worst = float(np.max(np.abs(y.astype(np.float64) - exact) / bound))
        times = comm.allreduce(np.array([np.median(ina), np.median(ring)]), "max")
        retx_all = int(comm.allreduce(np.array([retx]), "sum")[0])
        worst = float(comm.allreduce(np.array([worst]), "max")[0])
        if rank == 0:
            nbytes = mib << 20
            queue.put(f"| {mib} | {loss:.0%} | {1e3 * times[0]:.0f} | {nbytes / times[0] / 1e9:.3f}"
                      f" | {retx_all / reps:.0f} | {worst:.2f} | {1e3 * times[1]:.1f} | "
                      f"{nbytes / times[1] / 1e9:.2f} |")
    if rank == 0:
        queue.put(None)


def _switch(nranks: int, slots: int, values: int, loss: float) -> tuple[subprocess.Popen, tuple]:
    proc = subprocess.Popen([sys.executable, "-m", "commflow.cli", "ina", "switch", "--port",
                             "0", "-n", str(nranks), "--slots", str(slots), "--values",
                             str(values), "--loss", str(loss), "--seed", "7"],
                            stdout=subprocess.PIPE, text=True)
    found = re.match(r"listening on ([\d.]+):(\d+) ", proc.stdout.readline())
    if not found:
        proc.kill()
        raise SystemExit("the switch did not start")
    return proc, (found.group(1), int(found.group(2)))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ranks", type=int, default=4)
    parser.add_argument("--sizes", default="1,16,64", help="MiB, comma-separated")
    parser.add_argument("--loss", default="0,0.05", help="drop probabilities")
    parser.add_argument("--reps", type=int, default=1)
    parser.add_argument("--slots", type=int, default=64)
    parser.add_argument("--values", type=int, default=256, help="values per packet")
    args = parser.parse_args()
    sizes = [int(s) for s in args.sizes.split(",")]
    print(f"{args.ranks} workers, switch: {args.slots} slots x {args.values} values per packet")
    print("| MiB | loss | INA ms | INA GB/s | retransmits | err/bound | ring ms | ring GB/s |")
    print("|---|---|---|---|---|---|---|---|")
    for loss in (float(p) for p in args.loss.split(",")):
        proc, addr = _switch(args.ranks, args.slots, args.values, loss)
        queue = mp.Queue()
        job = f"ina-{uuid.uuid4().hex[:8]}"
        procs = [mp.Process(target=_rank, args=(r, args.ranks, job, addr, sizes, loss,
                                                args.reps, args.slots, args.values, queue))
                 for r in range(args.ranks)]
        for p in procs:
            p.start()
        while (line := queue.get()) is not None:
            print(line, flush=True)
        for p in procs:
            p.join()
        proc.terminate()
        proc.wait()


if __name__ == "__main__":
    main()
