"""Live in-network aggregation against ring allreduces between emulated hosts on shaped links.

    sudo .venv/bin/python benchmarks/ina_live.py --sizes 1,16,64 --loss 0,0.05 --gloo

As root it builds the emulated cluster (``commflow cluster up --hosts 4 --bandwidth 1gbit``),
sets every link's MTU to ``--mtu`` (default 65520, so that a TCP segment and a datagram of
``--values`` values, by default the most that fit, cross unfragmented: a fragmented datagram
costs the sender a software checksum and a copy per fragment, and the receiver reassembly),
gives the bridge namespace ``commflow-sw`` the address 198.19.255.254 and runs ``commflow
ina switch`` there: a switch with one 1 Gbit/s port per host, as a top-of-rack switch would
be. Switch and ranks run at ``nice -10`` (the machine is shared with other jobs; INA and the
rings alike).
Then ``commflow run --hosts h0:1,..`` starts one rank per host running this file's ``worker``
mode, and finally it stops the switch and takes the cluster down (also after a failure). It
all runs in a private mount namespace (``unshare``), so other users of ``commflow cluster``
on the machine neither see nor remove its namespaces.

Per size (MiB of float32) and injected drop probability (on every worker's and the switch's
sends), the slowest rank's median of ``--reps`` calls after one untimed: ``ina_allreduce``
through the switch, per ``--delivery`` (``unicast``: the switch sends each result to every
worker; ``multicast``: once, to the group :data:`GROUP`, which the bridge copies to every
host's port); commflow's ``ring`` allreduce (``comm.allreduce(x, algo="ring")``, its
engine transport over TCP, which the injected loss does not touch); with ``--gloo`` torch's
gloo ``all_reduce`` between the same hosts (INA and the ring write into one preallocated
output, gloo sums in place). Also INA's retransmissions per call (all ranks)
and its largest error relative to the protocol's bound (must stay <= 1).
"""

from __future__ import annotations

import argparse
import os
import re
import resource
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

from commflow.ina.protocol import HEADER, MAX_VALUES

SWITCH_ADDR = "198.19.255.254"
PORT = 9999
GROUP = ("239.255.18.1", 9998)
"""The multicast group of ``--delivery multicast``: the bridge copies each result to every
host's port, each through that port's 1 Gbit/s ``tbf``."""
_IP_UDP = 28
"""IPv4 and UDP header bytes: a datagram of ``v`` values is ``28 + 34 + 4 v`` bytes of IP."""


def _cpu(pid: int | None = None) -> np.ndarray:
    """User and system CPU seconds so far of this process (threads included), or of ``pid``."""
    if pid is None:
        usage = resource.getrusage(resource.RUSAGE_SELF)
        return np.array([usage.ru_utime, usage.ru_stime])
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return np.array([int(fields[11]), int(fields[12])]) / os.sysconf("SC_CLK_TCK")


def _worker(args: argparse.Namespace) -> None:
    import commflow.runtime as runtime
    from commflow.ina import Faults, WorkerStats, error_bound, ina_allreduce

    comm = runtime.init()
    rank, n = comm.rank, comm.size
    dist = None
    if args.gloo:
        import torch
        import torch.distributed as dist

        dist.init_process_group("gloo", init_method=f"tcp://{os.environ['MASTER_ADDR']}:"
                                f"{int(os.environ['MASTER_PORT']) + 1}", rank=rank, world_size=n)
    faults = Faults(drop=args.drop, seed=1000 + rank)
    for mib in (int(s) for s in args.sizes.split(",")):
        x = np.random.default_rng(rank).standard_normal(mib << 18).astype(np.float32)
        stats = [WorkerStats()]
        modes = args.delivery.split(",")
        into = np.empty_like(x)
        calls = {
            mode: lambda x=x, s=stats, o=into, g=GROUP if mode == "multicast" else None:
            ina_allreduce(
                x, switch=(SWITCH_ADDR, PORT), rank=rank, nranks=n, slots=args.slots,
                faults=faults, stats=s[0], timeout=120, min_rto=args.min_rto,
                max_rto=args.max_rto, group=g, out=o)
            for mode in modes}
        calls["ring"] = lambda x=x, o=into: comm.allreduce(x, algo="ring", out=o)
        if dist is not None:
            calls["gloo"] = lambda t=torch.from_numpy(x.copy()): dist.all_reduce(t)
        times: dict[str, list[float]] = {k: [] for k in calls}
        retx = dict.fromkeys(modes, 0)
        cpu = {k: np.zeros(2) for k in calls}
        switch_cpu = {k: np.zeros(2) for k in modes}
        sent = dict.fromkeys(modes, 0)
        worst = dict.fromkeys(modes, 0.0)
        xs = [np.random.default_rng(r).standard_normal(x.size).astype(np.float32)
              for r in range(n)]
        exact = np.sum(xs, axis=0, dtype=np.float64)
        bound = error_bound(xs, args.values) + np.spacing(
            np.abs(exact).astype(np.float32))
        for rep in range(args.reps + 1):
            for name, call in calls.items():
                stats[0] = WorkerStats()
                comm.barrier()
                before = _cpu(), _cpu(args.switch_pid) if name in modes and rank == 0 else 0
                start = time.perf_counter()
                y = call()
                if rep:
                    times[name].append(time.perf_counter() - start)
                    cpu[name] += _cpu() - before[0]
                if name in modes:
                    comm.barrier()
                    if rep and rank == 0:
                        switch_cpu[name] += _cpu(args.switch_pid) - before[1]
                    retx[name] += stats[0].retransmits if rep else 0
                    sent[name] += stats[0].sent if rep else 0
                    worst[name] = max(worst[name], float(np.max(
                        np.abs(y.astype(np.float64) - exact) / bound)))
        med = comm.allreduce(np.array([np.median(times[k]) for k in calls]), "max")
        total = comm.allreduce(np.array([retx[m] for m in modes], np.float64), "sum")
        worst_all = comm.allreduce(np.array([worst[m] for m in modes]), "max")
        for i, mode in enumerate(modes):
            ring = med[len(modes)]
            cells = [mode, f"{1e3 * med[i]:.0f}", f"{(mib << 20) / med[i] / 1e9:.3f}",
                     f"{total[i] / args.reps:.0f}", f"{worst_all[i]:.2f}", f"{1e3 * ring:.0f}",
                     f"{ring / med[i]:.2f}"]
            if dist is not None:
                gloo = med[len(modes) + 1]
                cells += [f"{1e3 * gloo:.0f}", f"{gloo / med[i]:.2f}"]
            if rank == 0:
                print(f"| {mib} | {args.drop:.0%} | " + " | ".join(cells) + " |", flush=True)
        ranks_cpu = comm.allreduce(np.concatenate([cpu[k] for k in calls]), "sum") / args.reps
        datagrams = comm.allreduce(np.array([sent[m] for m in modes], np.float64), "sum")
        if rank == 0:
            parts = [f"{k} {ranks_cpu[2 * i]:.3f}/{ranks_cpu[2 * i + 1]:.3f}"
                     + (f" + switch {switch_cpu[k][0] / args.reps:.3f}/"
                        f"{switch_cpu[k][1] / args.reps:.3f}, {datagrams[i] / args.reps:.0f} "
                        "datagrams sent by the ranks" if k in modes else "")
                     for i, k in enumerate(calls)]
            print(f"# {mib} MiB, CPU s per call, user/system, {n} ranks summed: "
                  + "; ".join(parts), flush=True)
    if dist is not None:
        dist.destroy_process_group()


def _commflow(*words: str, nice: int = -10) -> list[str]:
    return ["nice", "-n", str(nice), sys.executable, "-m", "commflow.cli", *words]


def _set_mtu(hosts: int, mtu: int) -> None:
    """Every link of the cluster (both veth ends and the bridge) to ``mtu`` bytes."""
    from commflow.runtime import cluster

    links = [(f"commflow-h{i}", "eth0") for i in range(hosts)] + [
        (cluster.SWITCH, f"h{i}") for i in range(hosts)] + [(cluster.SWITCH, "br0")]
    for ns, dev in links:
        subprocess.run(["ip", "-n", ns, "link", "set", dev, "mtu", str(mtu)], check=True)


def _run(args: argparse.Namespace) -> None:
    from commflow.runtime import cluster

    hosts = ",".join(f"h{i}:1" for i in range(args.ranks))
    if cluster.current() is not None:
        raise SystemExit("an emulated cluster is up (another job's?); `commflow cluster down` "
                         "first if it is yours")
    print(f"# {args.ranks} hosts at {args.bandwidth}, MTU {args.mtu}, switch in namespace "
          f"{cluster.SWITCH} at {SWITCH_ADDR}: {args.slots} slots x {args.values} values per "
          f"packet, min RTO {args.min_rto} s; median of {args.reps}, slowest rank")
    head = ("| MiB | loss | results | INA ms | INA GB/s | INA retx | err/bound | ring ms | "
            "ring/INA |")
    print(head + (" gloo ms | gloo/INA |" if args.gloo else ""))
    print("|---" * (9 + 2 * args.gloo) + "|", flush=True)
    subprocess.run(_commflow("cluster", "up", "--hosts", str(args.ranks), "--bandwidth",
                             args.bandwidth), check=True, stdout=subprocess.DEVNULL)
    switch = None
    try:
        subprocess.run(["ip", "-n", cluster.SWITCH, "addr", "add", f"{SWITCH_ADDR}/15", "dev",
                        "br0"], check=True)
        _set_mtu(args.ranks, args.mtu)
        for drop in (float(p) for p in args.loss.split(",")):
            switch = subprocess.Popen(
                ["ip", "netns", "exec", cluster.SWITCH,
                 *_commflow("ina", "switch", "--host", SWITCH_ADDR, "--port", str(PORT), "-n",
                            str(args.ranks), "--slots", str(args.slots), "--values",
                            str(args.values), "--loss", str(drop), "--seed", "7",
                            nice=args.switch_nice)],
                stdout=subprocess.PIPE, text=True)
            if not re.match("listening on", switch.stdout.readline()):
                raise SystemExit("the switch did not start")
            worker = [*_commflow("run", "--hosts", hosts, "--", sys.executable, str(Path(__file__)),
                                 "worker", "--sizes", args.sizes, "--drop", str(drop),
                                 "--reps", str(args.reps), "--slots", str(args.slots),
                                 "--values", str(args.values), "--min-rto", str(args.min_rto),
                                 "--max-rto", str(args.max_rto), "--delivery", args.delivery,
                                 "--switch-pid", str(switch.pid))
                      ] + (["--gloo"] * args.gloo)
            done = subprocess.run(worker, capture_output=True, text=True,
                                  env={**os.environ, "GLOO_SOCKET_IFNAME": "eth0"})
            rows = [re.sub(r"^\[rank 0\] ", "", line) for line in done.stdout.splitlines()]
            print("\n".join(r for r in rows if r.startswith(("|", "#"))), flush=True)
            if done.returncode:
                raise SystemExit(f"workers failed:\n{done.stdout[-2000:]}{done.stderr[-3000:]}")
            fields = Path(f"/proc/{switch.pid}/stat").read_text().rsplit(")", 1)[1].split()
            cpu = (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
            switch.terminate()
            print(f"# switch CPU {cpu:.1f} s; " + switch.communicate(timeout=30)[0].strip(),
                  flush=True)
            switch = None
    finally:
        if switch is not None:
            switch.kill()
            switch.wait()
        subprocess.run(_commflow("cluster", "down"), check=False, stdout=subprocess.DEVNULL)


def _private(argv: list[str]) -> None:
    """Run again in a mount namespace of its own with empty ``/run/netns`` and
    ``/run/commflow``: the cluster made here is invisible to any other ``commflow cluster``
    user on the machine (whose ``up``/``down`` would otherwise replace it mid-run), and
    vanishes with the run."""
    script = ("mount -t tmpfs ina-live /run/netns && mkdir -p /run/commflow && "
              "mount -t tmpfs ina-live /run/commflow && exec \"$@\"")
    os.execvpe("unshare", ["unshare", "--mount", "--propagation", "private", "sh", "-c",
                           script, "sh", sys.executable, *argv],
               {**os.environ, "INA_LIVE_PRIVATE": "1"})


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("mode", nargs="?", default="run", choices=("run", "worker"))
    parser.add_argument("--ranks", type=int, default=4)
    parser.add_argument("--bandwidth", default="1gbit")
    parser.add_argument("--sizes", default="1,16,64", help="MiB, comma-separated")
    parser.add_argument("--loss", default="0,0.05", help="drop probabilities")
    parser.add_argument("--drop", type=float, default=0.0, help=argparse.SUPPRESS)
    parser.add_argument("--switch-pid", type=int, default=0, help=argparse.SUPPRESS)
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--slots", type=int, default=24)
    parser.add_argument("--values", type=int, default=None,
                        help="values per packet (default: the most whose datagram fits the MTU)")
    parser.add_argument("--gloo", action="store_true", help="also torch gloo all_reduce")
    parser.add_argument("--delivery", default="unicast,multicast",
                        help="how the switch returns results: unicast (once per worker), "
                             "multicast (once, to a group), or both, comma-separated")
    parser.add_argument("--switch-nice", type=int, default=-10, help="the switch's nice")
    parser.add_argument("--mtu", type=int, default=65520, help="MTU of every link")
    parser.add_argument("--min-rto", type=float, default=0.05, help="INA's least timeout (s)")
    parser.add_argument("--max-rto", type=float, default=1.0, help="INA's largest timeout (s)")
    args = parser.parse_args()
    if args.values is None:
        args.values = min(MAX_VALUES, (args.mtu - _IP_UDP - HEADER.size) // 4)
    if args.mode == "run" and os.environ.get("INA_LIVE_PRIVATE") != "1":
        _private(sys.argv)
    (_worker if args.mode == "worker" else _run)(args)


if __name__ == "__main__":
    main()
