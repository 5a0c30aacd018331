"""How long the planner's search takes: the 1T-parameter GPT of Megatron SC'21 on 3072 A100s.

Usage::

    python benchmarks/plan_search.py            # 1T on 3072 GPUs, top 5, 3 runs
    python benchmarks/plan_search.py --repeat 1 --model megatron-145b --gpus 1536 --batch 2304
    python benchmarks/plan_search.py --cluster dgx-a100x192+dgx-h100x192   # heterogeneous

Prints the candidate count, wall-clock and CPU seconds of each run (the first pays for the
collective simulations, which are cached afterwards; the later runs clear the cache so every
run does the same work), then the best plans. CPU time is what to compare on a busy machine.
"""

from __future__ import annotations

import argparse
import statistics
import time

from commflow.plan import get_model, search
from commflow.plan.comm import cluster_links, collective_line
from commflow.plan.evaluate import resolve_cluster
from commflow.plan.search import SearchSpace, candidates


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="megatron-1t")
    parser.add_argument("--cluster", default="dgx-a100")
    parser.add_argument("--gpus", type=int, default=3072)
    parser.add_argument("--batch", type=int, default=3072)
    parser.add_argument("--precision", default="fp16")
    parser.add_argument("--top", type=int, default=5)
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    spec = get_model(args.model)
    links = cluster_links(resolve_cluster(args.cluster, args.gpus))
    count = sum(
        1
        for _ in candidates(
            spec, args.gpus, links.gpus_per_box, args.batch, args.precision, SearchSpace(),
            heterogeneous=links.heterogeneous,
        )
    )
    print(
        f"# {spec.name} on {args.gpus} GPUs ({args.cluster}), global batch {args.batch}: "
        f"{count} candidate plans"
    )
    walls, cpus = [], []
    for _ in range(args.repeat):
        collective_line.cache_clear()
        wall, cpu = time.perf_counter(), time.process_time()
        results = search(
            spec,
            args.cluster,
            gpus=args.gpus,
            global_batch=args.batch,
            precision=args.precision,
            top=args.top,
        )
        walls.append(time.perf_counter() - wall)
        cpus.append(time.process_time() - cpu)
    print(
        f"search: median wall {statistics.median(walls):.2f} s, median CPU "
        f"{statistics.median(cpus):.2f} s over {args.repeat} runs "
        f"(wall {', '.join(f'{w:.2f}' for w in walls)})"
    )
    for e in results:
        print(
            f"{e.step_time:9.2f} s  {e.tflops_per_gpu_hw:6.1f} TFLOP/s  "
            f"{e.memory.to_dict()['total']:5.1f} GiB  {e.plan.describe()}"
        )


if __name__ == "__main__":
    main()
