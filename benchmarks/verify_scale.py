"""The verifier on the synthesizer's programs for the presets: steps, channels, seconds and
peak memory of ``commflow.ir.verify`` (symbolic execution, matching, deadlock and data-race
checks) on each default program.

    .venv/bin/python benchmarks/verify_scale.py dgx-a100x2 mi250x2 mi250x4

One process per program, so the peak resident memory (``resource.getrusage``, of the child)
is the verifier's plus synthesis'.
"""

from __future__ import annotations

import json
import resource
import subprocess
import sys
import time

COLLECTIVES = ("allgather", "reducescatter", "allreduce")


def _one(preset: str, collective: str) -> None:
    from commflow.ir import verify
    from commflow.synth import synthesize
    from commflow.topology import load

    topo = load(preset)
    program = synthesize(collective, topo)
    start = time.perf_counter()
    try:
        verify(program)
        outcome = "OK"
    except Exception as error:  # the row reports it
        outcome = f"{type(error).__name__}: {error}"[:80]
    seconds = time.perf_counter() - start
    print(json.dumps({"steps": program.nsteps, "channels": len(program.table.channel_starts) - 1,
                      "seconds": seconds, "outcome": outcome}))


def main(presets: list[str]) -> None:
    print("| preset | collective | steps | channels | verify s | peak RSS GiB | outcome |")
    print("|---|---|---|---|---|---|---|")
    for preset in presets:
        for collective in COLLECTIVES:
            run = subprocess.run([sys.executable, __file__, "--one", preset, collective],
                                 capture_output=True, text=True, check=False)
            peak = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 2**20
            if run.returncode:
                print(f"| {preset} | {collective} | - | - | - | {peak:.1f} | failed: "
                      f"{run.stderr.strip().splitlines()[-1][:60]} |", flush=True)
                continue
            row = json.loads(run.stdout.strip().splitlines()[-1])
            print(f"| {preset} | {collective} | {row['steps']} | {row['channels']} | "
                  f"{row['seconds']:.1f} | {peak:.1f} | {row['outcome']} |", flush=True)


if __name__ == "__main__":
    if sys.argv[1:2] == ["--one"]:
        _one(sys.argv[2], sys.argv[3])
    else:
        main(sys.argv[1:] or ["dgx1", "dgx-a100x2", "mi250x2", "mi250x4"])
