"""What per-message checksums (COMMFLOW_CHECKSUM=1) cost.

    PYTHONPATH=src python benchmarks/checksum_cost.py --sizes 64K,1M,8M --batches 7

First the checksum functions alone (zlib's CRC-32, which commflow uses, and Adler-32) in GB/s;
then a ring allreduce of float32 between 2 ranks over shared memory (one host) and over the
gloo engine (two emulated hosts on loopback), checksums off and on alternating batch by batch
in the same world (both ranks switch together). Prints markdown rows: the median time per
call of each setting (ms) and the ratio on/off.
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import time
import uuid
import zlib

import numpy as np

import commflow.runtime as runtime
from commflow.runtime.launcher import free_port

CALLS = 5


def _size(text: str) -> int:
    units = {"K": 1 << 10, "M": 1 << 20}
    return int(text[:-1]) * units[text[-1]] if text[-1] in units else int(text)


def checksum_speeds(nbytes: int, repeat: int = 20) -> dict[str, float]:
    """GB/s of zlib.crc32 and zlib.adler32 over ``nbytes`` (best of ``repeat``)."""
    buf = np.random.default_rng(0).integers(0, 256, nbytes, dtype=np.uint8)
    speeds = {}
    for name, fn in (("crc32", zlib.crc32), ("adler32", zlib.adler32)):
        best = min(_timed(lambda f=fn: f(buf)) for _ in range(repeat))
        speeds[name] = nbytes / best / 1e9
    return speeds


def _timed(fn) -> float:
    t = time.perf_counter()
    fn()
    return time.perf_counter() - t


def _rank(rank: int, job: str, engine: bool, port: int, sizes: list[int], batches: int,
          queue) -> None:
    if engine:
        os.environ.update(COMMFLOW_HOST=str(rank), MASTER_ADDR="127.0.0.1",
                          MASTER_PORT=str(port))
    comm = runtime.init(rank=rank, world_size=2, job=job, timeout=300)
    transport = comm.transport.engine if engine else comm.transport
    for nbytes in sizes:
        x = np.ones(nbytes // 4, np.float32)
        y = np.empty_like(x)
        times: dict[bool, list[float]] = {False: [], True: []}
        for batch in range(2 * batches):
            on = bool(batch % 2)
            transport.checksum = on
            comm.barrier()
            t = time.perf_counter()
            for _ in range(CALLS):
                comm.allreduce(x, algo="ring", out=y)
            times[on].append((time.perf_counter() - t) / CALLS)
        if rank == 0:
            off, on = (float(np.median(times[k])) for k in (False, True))
            queue.put(f"| {'engine (gloo, loopback)' if engine else 'shared memory'} | "
                      f"{nbytes >> 10} KiB | {1e3 * off:.2f} | {1e3 * on:.2f} | "
                      f"{on / off:.2f} |")
    if rank == 0:
        queue.put(None)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--sizes", default="64K,1M,8M")
    ap.add_argument("--batches", type=int, default=7)
    args = ap.parse_args()
    sizes = [_size(s) for s in args.sizes.split(",")]
    print("| buffer | crc32 GB/s | adler32 GB/s |\n|---|---|---|")
    for nbytes in (64 << 10, 1 << 20):
        speed = checksum_speeds(nbytes)
        print(f"| {nbytes >> 10} KiB | {speed['crc32']:.2f} | {speed['adler32']:.2f} |")
    print("\n| transport | size | off (ms) | on (ms) | on/off |\n|---|---|---|---|---|")
    ctx = mp.get_context("fork")
    for engine in (False, True):
        queue = ctx.Queue()
        job, port = f"ck{uuid.uuid4().hex[:8]}", free_port()
        procs = [ctx.Process(target=_rank, args=(r, job, engine, port, sizes, args.batches,
                                                 queue)) for r in range(2)]
        for p in procs:
            p.start()
        while (line := queue.get()) is not None:
            print(line, flush=True)
        for p in procs:
            p.join()


if __name__ == "__main__":
    main()
