"""How fast this machine's CPUs let live INA and gloo's ring go, with no link in the way.

    .venv/bin/python benchmarks/ina_cpu_ceiling.py --ranks 4 --size 64

On loopback (no shaping, nothing but CPU and memory limits it), ``--ranks`` processes time
``ina_allreduce`` through a ``commflow ina switch`` process, then torch gloo's
``all_reduce``, on ``--size`` MiB of float32: the median of ``--reps`` calls after one
untimed, slowest rank, and the CPU seconds every process of the job (switch included) spent
per call. ``1 Gbit/s needs`` is the share of that ceiling a call at 1 Gbit/s link rate asks
for: INA moves ``size`` per worker each way, a ring ``2(n-1)/n`` times that.
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import resource
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

from commflow.runtime.launcher import free_port

LINE = 125e6
"""1 Gbit/s in bytes per second."""
VALUES = 16364
"""Values per packet, as benchmarks/ina_live.py sends at its 65,520-byte MTU."""


def _cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def _timed(call, reps: int) -> tuple[float, float]:
    """Median seconds per call and CPU seconds per call of this process."""
    call()
    times, cpu = [], _cpu()
    for _ in range(reps):
        start = time.perf_counter()
        call()
        times.append(time.perf_counter() - start)
    return float(np.median(times)), (_cpu() - cpu) / reps


def _ina(rank: int, n: int, size: int, reps: int, port: int, out) -> None:
    from commflow.ina import ina_allreduce

    x = np.random.default_rng(rank).standard_normal(size // 4).astype(np.float32)
    out.put(_timed(lambda: ina_allreduce(x, switch=("127.0.0.1", port), rank=rank, nranks=n,
                                         job=0, slots=24), reps))


def _gloo(rank: int, n: int, size: int, reps: int, port: int, out) -> None:
    import torch
    import torch.distributed as dist

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=n)
    x = torch.randn(size // 4)
    dist.barrier()
    out.put(_timed(lambda: dist.all_reduce(x), reps))
    dist.destroy_process_group()


def _job(target, n: int, size: int, reps: int, port: int) -> tuple[float, float]:
    """Slowest rank's median seconds per call and the ranks' CPU seconds per call."""
    ctx = mp.get_context("spawn")
    out = ctx.Queue()
    procs = [ctx.Process(target=target, args=(r, n, size, reps, port, out)) for r in range(n)]
    for p in procs:
        p.start()
    results = [out.get(timeout=600) for _ in procs]
    for p in procs:
        p.join()
    return max(t for t, _ in results), sum(c for _, c in results)


def _switch_cpu(pid: int) -> float:
    """CPU seconds (user + system) of process ``pid`` so far."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ranks", type=int, default=4)
    parser.add_argument("--size", type=int, default=64, help="MiB")
    parser.add_argument("--reps", type=int, default=3)
    args = parser.parse_args()
    n, size = args.ranks, args.size << 20
    port = free_port()
    switch = subprocess.Popen([str(Path(sys.executable).with_name("commflow")), "ina",
                               "switch", "--port", str(port), "-n", str(n), "--slots", "24",
                               "--values", str(VALUES)], stdout=subprocess.DEVNULL)
    try:
        time.sleep(3)
        before = _switch_cpu(switch.pid)
        ina, ina_cpu = _job(_ina, n, size, args.reps, port)
        ina_cpu += (_switch_cpu(switch.pid) - before) / (args.reps + 1)
    finally:
        switch.terminate()
        switch.wait()
    gloo, gloo_cpu = _job(_gloo, n, size, args.reps, free_port())
    print(f"# {n} ranks on loopback, {args.size} MiB of float32, {os.cpu_count()} CPUs; "
          f"median of {args.reps}, slowest rank")
    print("| allreduce | ms | GB/s (size/time) | CPU s per call | 1 Gbit/s needs |")
    print("|---|---|---|---|---|")
    for name, t, cpu, wire in (("INA", ina, ina_cpu, size),
                               ("gloo ring", gloo, gloo_cpu, 2 * (n - 1) / n * size)):
        print(f"| {name} | {t * 1e3:.0f} | {size / t / 1e9:.3f} | {cpu:.2f} | "
              f"{t / (wire / LINE):.0%} |")


if __name__ == "__main__":
    main()
