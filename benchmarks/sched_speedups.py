"""Predicted speed-ups of communication scheduling policies over FIFO (one allreduce per
layer as gradients become ready), for data-parallel training on 8 workers in a ring at 10,
25 and 100 Gbit/s (25 us per ring step), V100 compute (commflow.sched.profiles).

    .venv/bin/python benchmarks/sched_speedups.py [model ...]
"""

from __future__ import annotations

import sys

from commflow.sched import lower_bound, ring_cost, simulate
from commflow.sched.autotune import autotune
from commflow.sched.profiles import PROFILES, profile

POLICIES = ("ddp", "horovod", "priority", "p3", "bytescheduler", "pace", "dear")
RATES = (10, 25, 100)


def main(models: list[str]) -> None:
    print(f"| model | Gbit/s | fifo ms | {' | '.join(POLICIES)} | tuned | bound |")
    print("|---|---|---|" + "---|" * (len(POLICIES) + 2))
    for name in models:
        work = profile(name)
        for rate in RATES:
            cost = ring_cost(8, rate)
            fifo = simulate(work, "fifo", cost).iteration_time
            ratios = [fifo / simulate(work, p, cost).iteration_time for p in POLICIES]
            tuned = autotune(work, cost)
            label = (f"{fifo / tuned.iteration_time:.2f} "
                     f"({tuned.policy.partition_bytes / (1 << 20):g} MiB x "
                     f"{tuned.policy.credits})")
            print(f"| {name} | {rate} | {fifo * 1e3:.1f} | "
                  + " | ".join(f"{r:.2f}" for r in ratios)
                  + f" | {label} | {fifo / lower_bound(work, cost):.2f} |", flush=True)


if __name__ == "__main__":
    main(sys.argv[1:] or list(PROFILES))
