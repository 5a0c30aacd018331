"""``commflow sched``: a training iteration's communication schedule under each policy."""

from __future__ import annotations

from pathlib import Path

import typer
from rich.markup import escape

from commflow.cli._output import echo_json, err, number, out, table
from commflow.errors import CommflowError


def sched(
    model: str = typer.Argument(
        ..., help="Profile: resnet50, vgg16, bert-large, gpt2, gpt2-xl."),
    policies: str = typer.Option(
        "fifo,ddp,horovod,priority,p3,bytescheduler,pace,dear,fsdp", "--policy", "-p",
        help="Policies, comma-separated (see `commflow.sched.POLICIES`); `tuned` adds "
        "ByteScheduler with partition and credits searched."),
    workers: int = typer.Option(8, "--workers", "-n", help="Data-parallel workers."),
    gbps: float = typer.Option(25.0, "--gbps", help="Link rate per worker, Gbit/s."),
    latency: float = typer.Option(25.0, "--latency-us", help="Latency per ring step, us."),
    topo: str = typer.Option(
        None, "--topo", "-t", help="Time allreduce on this topology instead of a ring."),
    batch: int = typer.Option(None, "--batch", help="Samples per worker (profile default)."),
    accelerator: str = typer.Option("v100", "--accelerator", help="Accelerator preset."),
    png: Path = typer.Option(None, "--png", help="Draw the first policy's timeline here."),
    as_json: bool = typer.Option(False, "--json", help="Print the results as JSON."),
) -> None:
    """Simulate data-parallel training iterations of a model under scheduling policies.

    Each layer's gradient is reduced as the policy says (per layer, DDP buckets, Horovod
    fusion, priority with partitions and credits, preemption, reduce-scatter + all-gather,
    sharded parameters) over one link, while compute runs forward then backward. Prints
    the steady-state iteration time, its speed-up over fifo, the exposed communication and
    the lower bound max(F + B + c0, C).

    [bold]Examples[/bold]

      commflow sched vgg16 --gbps 10
      commflow sched resnet50 -p fifo,tuned --gbps 25 --png resnet.png
    """
    from commflow.sched import ring_cost, simulate, topology_cost
    from commflow.sched.autotune import autotune
    from commflow.sched.profiles import profile
    from commflow.topology import load

    workload = profile(model, batch=batch, accelerator=accelerator)
    cost = (topology_cost(load(topo)) if topo else
            ring_cost(workers, gbps, latency * 1e-6))
    names = [p.strip() for p in policies.split(",") if p.strip()]
    if not names:
        raise CommflowError("commflow sched: name at least one policy")
    baseline = simulate(workload, "fifo", cost)
    results = [autotune(workload, cost) if name == "tuned" else simulate(workload, name, cost)
               for name in names]
    if png is not None:
        from commflow.sched.timeline import draw_schedule

        draw_schedule(results[0], png)
    if as_json:
        echo_json({"workload": workload.describe(), "cost": cost.name,
                   "alpha_s": cost.alpha, "bandwidth_Bps": cost.bandwidth,
                   "lower_bound_s": baseline.lower_bound,
                   "results": [{"policy": r.policy.name,
                                "partition_bytes": r.policy.partition_bytes,
                                "credits": r.policy.credits,
                                "iteration_s": r.iteration_time, "exposed_s": r.exposed,
                                "speedup": baseline.iteration_time / r.iteration_time}
                               for r in results]})
        return
    out.print(f"# {escape(workload.describe())}")
    out.print(f"# {escape(cost.name)}: alpha {cost.alpha * 1e6:.0f} us, "
              f"{cost.bandwidth / 1e9:.2f} GB/s of buffer; bound "
              f"{baseline.lower_bound * 1e3:.2f} ms")
    rows = table("policy", "iteration(ms)", "speedup", "exposed(ms)", "of bound")
    for r in results:
        name = r.policy.name
        if name == "bytescheduler-tuned":
            name = f"tuned {r.policy.partition_bytes / (1 << 20):g}MiB x{r.policy.credits}"
        rows.add_row(escape(name), number(r.iteration_time * 1e3),
                     f"{baseline.iteration_time / r.iteration_time:.2f}",
                     number(r.exposed * 1e3), f"{r.lower_bound / r.iteration_time:.1%}")
    out.print(rows)
    if png is not None:
        err.print(f"wrote {escape(str(png))}")
