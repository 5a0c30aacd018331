"""Compressed allreduce vs float32 allreduce on a local shared-memory world.

    PYTHONPATH=src python benchmarks/compress_bench.py --ranks 2 --sizes 1,16

Prints per codec and size (MiB): median time of 5 calls (ms), bytes sent per rank, relative error.
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import time
import uuid

import numpy as np

import commflow.runtime as runtime
from commflow.compress import Codec, quantized_allreduce, topk_allreduce


def _cases(comm, x: np.ndarray) -> dict:
    """Each case: a call taking ``measure_error`` and returning (result, stats or None)."""
    cases = {"float32": lambda measure_error: (comm.allreduce(x), None)}
    for name in ("bf16", "int8", "int4"):
        cases[name] = (lambda measure_error, c=Codec(name=name):
                       quantized_allreduce(comm, x, codec=c, measure_error=measure_error))
    cases["top1%"] = lambda measure_error: topk_allreduce(comm, x, k=x.size // 100,
                                                          measure_error=measure_error)
    return cases


def _rank(rank: int, nranks: int, job: str, sizes: list[int], queue) -> None:
    comm = runtime.init(rank=rank, world_size=nranks, job=job, timeout=300)
    for mib in sizes:
        x = np.random.default_rng(rank).standard_normal(mib << 18).astype(np.float32)
        for name, call in _cases(comm, x).items():
            times = []
            for _ in range(5):
                comm.barrier()
                t = time.perf_counter()
                call(False)
                times.append(time.perf_counter() - t)
            stats = call(True)[1]
            sent = 2 * (nranks - 1) * x.nbytes // nranks if stats is None else stats.bytes_sent
            err = 0.0 if stats is None else stats.relative_error
            if rank == 0:
                queue.put(f"| {nranks} | {mib} | {name} | {1e3 * float(np.median(times)):.1f} "
                          f"| {sent / 2**20:.2f} | {err:.1e} |")
    if rank == 0:
        queue.put(None)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--ranks", type=int, default=2)
    ap.add_argument("--sizes", default="1,16", help="MiB, comma-separated")
    args = ap.parse_args()
    sizes = [int(s) for s in args.sizes.split(",")]
    ctx = mp.get_context("fork")
    queue = ctx.Queue()
    job = f"b{uuid.uuid4().hex[:12]}"
    procs = [ctx.Process(target=_rank, args=(r, args.ranks, job, sizes, queue))
             for r in range(args.ranks)]
    for p in procs:
        p.start()
    print("| ranks | MiB | codec | time (ms) | MiB sent per rank | relative error |")
    print("|---|---|---|---|---|---|")
    while (line := queue.get()) is not None:
        print(line, flush=True)
    for p in procs:
        p.join()


if __name__ == "__main__":
    main()
