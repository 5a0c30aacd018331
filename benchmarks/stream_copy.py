"""Plain against streaming (non-temporal) stores for the fast path's copy out of a staging
segment into a large output, in one process (``commflow.runtime._stream_kernels``).

Run: ``.venv/bin/python benchmarks/stream_copy.py [--mib 64] [--segment-kib 512]
[--repeats 7]``. Each pass copies the source into a staging buffer of one segment and from
there into the output, a segment at a time, as a fast-path allgather does; it prints the
best pass's output bytes per second for each kind of store, and their ratio, measured in
turns.
"""

from __future__ import annotations

import argparse
import time

import numpy as np

from commflow.runtime._stream_kernels import AVAILABLE, stream_copy


def _pass(src: np.ndarray, dst: np.ndarray, stage: np.ndarray, stream: bool) -> float:
    seg = len(stage)
    start = time.perf_counter()
    for lo in range(0, len(src), seg):
        piece = stage[:min(seg, len(src) - lo)]
        piece[...] = src[lo:lo + len(piece)]
        out = dst[lo:lo + len(piece)]
        if stream:
            stream_copy(out, piece)
        else:
            out[...] = piece
    return time.perf_counter() - start


def main() -> None:
    """Print the table (see the module docstring)."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mib", type=int, default=64, help="bytes copied per pass, MiB")
    parser.add_argument("--segment-kib", type=int, default=512, help="staging segment, KiB")
    parser.add_argument("--repeats", type=int, default=7, help="passes of each kind")
    args = parser.parse_args()
    src = np.ones(args.mib << 20, np.uint8)
    dst = np.zeros_like(src)
    stage = np.zeros(args.segment_kib << 10, np.uint8)
    _pass(src, dst, stage, True)  # compiles the kernel, touches every page
    best = {False: float("inf"), True: float("inf")}
    for _ in range(args.repeats):
        for stream in (False, True):
            best[stream] = min(best[stream], _pass(src, dst, stage, stream))
    print(f"# {args.mib} MiB through a {args.segment_kib} KiB staging segment, best of "
          f"{args.repeats} (streaming {'available' if AVAILABLE else 'unavailable: plain'})")
    print("store    GB/s")
    for stream in (False, True):
        print(f"{'stream' if stream else 'plain':8s} {len(src) / best[stream] / 1e9:5.2f}")
    print(f"# streamed / plain time: {best[True] / best[False]:.2f}")


if __name__ == "__main__":
    main()
