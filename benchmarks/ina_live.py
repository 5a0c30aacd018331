"""Live in-network aggregation vs ring allreduces, 4 workers on one machine.

    PYTHONPATH=src python benchmarks/ina_live.py --ranks 4 --sizes 1,16,64 --loss 0,0.05

INA: ``ina_allreduce`` through a ``commflow ina switch`` process on UDP loopback, with the
drop probability injected on every worker's and the switch's sends. UDP ring: the end-host
ring of :mod:`commflow.ina.ring` between the same processes over UDP loopback, with the same
loss on every send, the same packet size (float32 values) and as many packets in flight as the
switch has slots. shm ring: the runtime's ``ring`` allreduce over commflow's shared-memory
communicator (no loss: shared memory cannot drop). Prints per size (MiB, float32) and loss the
slowest rank's median time of ``--reps`` calls, algbw (GB/s), retransmissions per call (all
ranks) and the largest INA error found relative to the protocol's bound (must stay <= 1).
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
from commflow.ina.ring import udp_ring_allreduce
from commflow.ina.switch import open_socket


def _rank(rank: int, nranks: int, job: str, addr: tuple[str, int], sizes: list[int],
          loss: float, reps: int, slots: int, values: int, queue) -> None:
    comm = runtime.init(rank=rank, world_size=nranks, job=job, timeout=600)
    faults = Faults(drop=loss, seed=1000 + rank)
    sock = open_socket("127.0.0.1", 0)
    ports = comm.allgather(np.array([sock.getsockname()[1]], np.int64))
    peers = [("127.0.0.1", int(p)) for p in ports]
    call = 0
    for mib in sizes:
        xs = [np.random.default_rng(r).standard_normal(mib << 18).astype(np.float32)
              for r in range(nranks)]
        times: dict[str, list[float]] = {"ina": [], "udp": [], "shm": []}
        retx = np.zeros(2, np.int64)
        comm.allreduce(xs[rank], algo="ring")
        for _ in range(reps):
            ina, udp = WorkerStats(), WorkerStats()
            comm.barrier()
            t = time.perf_counter()
            y = ina_allreduce(xs[rank], switch=addr, rank=rank, nranks=nranks, slots=slots,
                              faults=faults, stats=ina, timeout=120)
            times["ina"].append(time.perf_counter() - t)
            comm.barrier()
            t = time.perf_counter()
            udp_ring_allreduce(xs[rank], sock, peers, rank=rank, call=call, values=values,
                               window=slots, faults=faults, stats=udp, timeout=120)
            times["udp"].append(time.perf_counter() - t)
            call += 1
            comm.barrier()
            t = time.perf_counter()
            comm.allreduce(xs[rank], algo="ring")
            times["shm"].append(time.perf_counter() - t)
            retx += [ina.retransmits, udp.retransmits]
        exact = np.sum([x.astype(np.float64) for x in xs], axis=0)
        bound = error_bound(xs, values) + np.spacing(np.abs(exact).astype(np.float32))
        worst = float(np.max(np.abs(y.astype(np.float64) - exact) / bound))
        slowest = comm.allreduce(np.array([np.median(times[k]) for k in ("ina", "udp", "shm")]),
                                 "max")
        retx = comm.allreduce(retx, "sum") / reps
        worst = float(comm.allreduce(np.array([worst]), "max")[0])
        if rank == 0:
            gbs = [(mib << 20) / t / 1e9 for t in slowest]
            queue.put(f"| {mib} | {loss:.0%} | {1e3 * slowest[0]:.0f} | {gbs[0]:.3f} | "
                      f"{retx[0]:.0f} | {worst:.2f} | {1e3 * slowest[1]:.0f} | {gbs[1]:.3f} | "
                      f"{retx[1]:.0f} | {1e3 * slowest[2]:.1f} | {gbs[2]:.2f} |")
    sock.close()
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
    print("| MiB | loss | INA ms | INA GB/s | INA retx | err/bound | UDP ring ms | UDP ring GB/s "
          "| ring retx | shm ring ms | shm ring GB/s |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
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
