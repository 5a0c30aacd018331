"""Verifier at scale: ``commflow.ir.verify`` on the programs ``commflow.synth.synthesize``
produces for the presets (default objective, default pieces).

Run: ``.venv/bin/python benchmarks/verify_scale.py [--collectives allgather,...]
[--timeout S] [topology ...]`` (topology names as ``commflow topo list`` spells them;
default: the presets of the synthesis benchmark). Each (topology, collective) runs in a fresh
process: synthesis, then one verification timed on its own (the compiled kernels are loaded
from numba's cache first, on a small program). Prints one markdown row each: steps,
channels, verify seconds, the process's resident memory before verification and its peak
after (GiB; the peak includes synthesis), and OK or the error.
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import time

GOALS = ("dgx1", "mi250", "ndv2x2", "torus4x4", "dgx-a100", "fat-tree4", "dgx-h100x2",
         "dgx-a100x2", "ndv2x4", "dgx2x2", "dgx-a100x4", "mi250x2", "mi250x4")
"""The presets of ``benchmarks/synth_bench.py``, small first."""
COLLECTIVES = ("allgather", "reducescatter", "allreduce", "alltoall", "broadcast")


def _rss_gib() -> float:
    """Resident memory of this process now (GiB), from /proc."""
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * resource.getpagesize() / 2**30


def _one(topology: str, collective: str) -> dict:
    """Synthesize and verify one program in this process; the record of the row."""
    from commflow.algorithms import build
    from commflow.errors import CommflowError
    from commflow.ir import verify
    from commflow.synth import synthesize
    from commflow.topology import load

    verify(build("allgather", "ring", 4))
    record = {"topology": topology, "collective": collective}
    start = time.perf_counter()
    try:
        program = synthesize(collective, load(topology))
    except CommflowError as err:
        return {**record, "result": f"synth: {err}"}
    record["synth_s"] = time.perf_counter() - start
    record["steps"] = program.nsteps
    record["channels"] = len(program.table.channel_starts) - 1
    record["rss_before"] = _rss_gib()
    start = time.perf_counter()
    try:
        verify(program)
        record["result"] = "OK"
    except CommflowError as err:
        record["result"] = f"{type(err).__name__}: {err}"
    record["verify_s"] = time.perf_counter() - start
    record["peak"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20
    return record


def _row(topology: str, collective: str, timeout: float) -> str:
    try:
        done = subprocess.run([sys.executable, __file__, "--one", topology, collective],
                              capture_output=True, text=True, timeout=timeout, check=False)
    except subprocess.TimeoutExpired:
        return f"| {topology} | {collective} | - | - | - | - | - | - | timeout {timeout:.0f} s |"
    lines = done.stdout.strip().splitlines()
    if done.returncode != 0 or not lines:
        return f"| {topology} | {collective} | - | - | - | - | - | - | crashed: " \
               f"{done.stderr.strip().splitlines()[-1:]} |"
    r = json.loads(lines[-1])
    if "steps" not in r:
        return f"| {topology} | {collective} | - | - | - | - | - | - | {r['result']} |"
    return (f"| {topology} | {collective} | {r['synth_s']:.1f} | {r['steps']} | "
            f"{r['channels']} | {r['verify_s']:.2f} | {r['rss_before']:.2f} | "
            f"{r['peak']:.2f} | {r['result']} |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("topologies", nargs="*", default=list(GOALS))
    parser.add_argument("--collectives", default=",".join(COLLECTIVES))
    parser.add_argument("--timeout", type=float, default=900.0,
                        help="seconds per (topology, collective), synthesis included")
    parser.add_argument("--one", nargs=2, metavar=("TOPOLOGY", "COLLECTIVE"),
                        help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.one:
        print(json.dumps(_one(*args.one)))
        return
    print("| topology | collective | synth s | steps | channels | verify s | RSS before GiB "
          "| peak RSS GiB | result |")
    print("|---|---|---|---|---|---|---|---|---|")
    for topology in args.topologies:
        for collective in args.collectives.split(","):
            print(_row(topology, collective, args.timeout), flush=True)


if __name__ == "__main__":
    main()
