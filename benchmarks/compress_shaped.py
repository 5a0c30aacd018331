"""Compressed allreduces against the float32 allreduce between emulated hosts over shaped
links (each rank its own host).

    commflow cluster up --hosts 4 --ranks-per-host 1 --bandwidth 1gbit --delay 100us
    commflow run --hosts h0:1,h1:1,h2:1,h3:1 benchmarks/compress_shaped.py --sizes 16M,64M
    commflow cluster down

Every case: one untimed, then ``--iters`` timed calls, each after a barrier, timed as the
slowest rank's; the cases take turns (one call of each per round), so that a slow spell of
the shared machine hits all of them. Rank 0 prints the median (ms), its speed-up over
float32 (the ``out=`` cases, which write into a buffer the caller keeps, over float32 with
``out=``), the bytes each rank sent and the relative error against the float32 sum.
Inputs: normal float32 values; the block-sparse case keeps 1% of its 256-element blocks
non-zero on each rank.
"""

from __future__ import annotations

import argparse
import time

import numpy as np

import commflow.runtime
from commflow.compress import Codec, block_sparse_allreduce, quantized_allreduce, topk_allreduce
from commflow.units import format_size, parse_size


def _sparse(rank: int, n: int) -> np.ndarray:
    rng = np.random.default_rng(1000 + rank)
    x = np.zeros(n, np.float32)
    blocks = n // 256
    for b in rng.choice(blocks, max(1, blocks // 100), replace=False):
        x[b * 256:(b + 1) * 256] = rng.standard_normal(256)
    return x


def _cases(comm, x: np.ndarray, sparse: np.ndarray) -> dict:
    into = np.empty_like(x)
    cases = {"float32": lambda: (comm.allreduce(x), None),
             "float32 (out=)": lambda: (comm.allreduce(x, out=into), None),
             "int8 (out=)": lambda: quantized_allreduce(comm, x, codec=Codec(), out=into)}
    cases["int8 (1 piece)"] = lambda: quantized_allreduce(comm, x, codec=Codec(), pieces=1)
    cases["int8 (2 pieces)"] = lambda: quantized_allreduce(comm, x, codec=Codec(), pieces=2)
    for name in ("bf16", "int8", "int4"):
        cases[name] = lambda c=Codec(name=name): quantized_allreduce(comm, x, codec=c)
    cases["top-1%"] = lambda: topk_allreduce(comm, x, k=x.size // 100)
    cases["float32 (1% blocks)"] = lambda: (comm.allreduce(sparse), None)
    cases["block-sparse (1% blocks)"] = lambda: block_sparse_allreduce(comm, sparse)
    return cases


def _slowest(comm, seconds: float) -> float:
    return float(comm.allreduce(np.array([seconds]), op="max")[0])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="16M,64M")
    parser.add_argument("--iters", type=int, default=3)
    parser.add_argument("--cases", default="",
                        help="only these cases, comma-separated (default: all)")
    args = parser.parse_args()
    comm = commflow.runtime.init()
    if comm.rank == 0:
        print(f"# {comm.size} ranks; median of {args.iters} calls; time = slowest rank")
        print("| size | case | median ms | speed-up vs float32 | bytes sent per rank | "
              "relative error |")
        print("|---|---|---|---|---|---|")
    for size in (parse_size(s) for s in args.sizes.split(",")):
        n = size // 4
        x = np.random.default_rng(comm.rank).standard_normal(n).astype(np.float32)
        sparse = _sparse(comm.rank, n)
        exact = {"dense": comm.allreduce(x), "sparse": comm.allreduce(sparse)}
        only = set(args.cases.split(",")) - {""}
        cases = {k: c for k, c in _cases(comm, x, sparse).items() if not only or k in only}
        times: dict[str, list[float]] = {k: [] for k in cases}
        results = {}
        for it in range(args.iters + 1):  # round-robin: a slow spell hits every case
            for name, call in cases.items():
                comm.barrier()
                start = time.perf_counter()
                out, stats = call()
                if it:
                    times[name].append(_slowest(comm, time.perf_counter() - start))
                ref = exact["sparse" if "blocks" in name else "dense"]
                err = float(np.linalg.norm(out - ref) / np.linalg.norm(ref))
                results[name] = (err, stats)
        base = {}
        for name, (err, stats) in results.items():
            median = float(np.median(times[name]))
            key = "sparse" if "blocks" in name else "out" if "out=" in name else "dense"
            base.setdefault(key, median)
            sent = (stats.bytes_sent if stats else 2 * (comm.size - 1) * 4 * -(-n // comm.size))
            if comm.rank == 0:
                print(f"| {format_size(size)} | {name} | {median * 1e3:.1f} | "
                      f"{base[key] / median:.2f} | {sent:,} | {err:.2e} |", flush=True)

if __name__ == "__main__":
    main()
