"""Kill ranks at random points and check that the survivors of ``Communicator.shrink`` agree.

    PYTHONPATH=src python benchmarks/shrink_stress.py --runs 200

Each run starts ``--ranks`` processes (forked) on one shared-memory world and picks one or two
victims, each killed with SIGKILL by a timer at a random time in [0, ``--window``) s: inside a
collective, between two, or inside a shrink. Every rank runs collectives (allreduce on the fast
path and with ``ring``, allgather with ``direct``), each checked exactly against numpy over the
communicator's members; on ``CommAbortedError`` it calls ``shrink()`` and goes on with the new
communicator, until a communicator holds no victim, on which it runs five more checked
collectives and reports. A run counts as

- **split brain** when the survivors' histories (the members of each communicator they got,
  or the error a shrink raised) differ, or the last members are not exactly the survivors;
- **wrong** for every result that differs from numpy;
- **hang** when a survivor reports nothing within ``--deadline`` s;
- **leftover** when a ``/dev/shm`` segment of the run remains after its ranks exited.

Prints one line per failed run and a summary (``--json``: the summary as JSON); exit status 1
when any run failed.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import random
import signal
import statistics
import sys
import tempfile
import threading
import time
import uuid

import numpy as np

from commflow.runtime import CommAbortedError, CommError, init
from commflow.runtime.shm import SHM_DIR, remove_job

_CTX = mp.get_context("fork")
_TIMEOUT = 10.0


def _collective(comm, step: int) -> bool:
    """One checked collective on ``comm`` (step number ``step`` on it): True when exact."""
    members = comm.ranks
    me = comm.ranks[comm.rank]

    def data(rank: int, n: int) -> np.ndarray:
        return np.arange(n, dtype=np.float64) + (rank + 1) * 1000.0 + step

    kind = step % 3
    if kind == 2:
        got = comm.allgather(data(me, 64), algo="direct")
        return np.array_equal(got, np.concatenate([data(r, 64) for r in members]))
    n = 256 if kind == 0 else 1 << 15
    got = comm.allreduce(data(me, n), algo="auto" if kind == 0 else "ring")
    return np.array_equal(got, sum(data(r, n) for r in members))


def _rank(rank: int, nranks: int, job: str, victims: dict[int, float], conn) -> None:
    report: dict = {"events": [], "checked": 0, "wrong": 0, "shrink_s": []}
    try:
        comm = init(rank=rank, world_size=nranks, job=job, timeout=_TIMEOUT)
        if rank in victims:
            threading.Timer(victims[rank], os.kill, (os.getpid(), signal.SIGKILL)).start()
        step = 0
        while True:
            try:
                if set(comm.ranks) & set(victims):
                    ok = _collective(comm, step)  # until a victim's death stops the loop
                elif step < 5:
                    ok = _collective(comm, step)
                else:
                    break
                report["checked"] += 1
                report["wrong"] += not ok
                step += 1
            except CommAbortedError:
                start = time.monotonic()
                try:
                    comm = comm.shrink(timeout=_TIMEOUT)
                except CommError as error:
                    reason = str(error).split(": ", 2)[-1].split(" [flight record")[0]
                    report["events"].append(["error", type(error).__name__, reason])
                    break
                report["shrink_s"].append(time.monotonic() - start)
                report["events"].append(["members", list(comm.ranks)])
                step = 0
    except BaseException as error:  # reported to the parent as a failure
        report["events"].append(["crash", f"{type(error).__name__}: {error}"])
    conn.send_bytes(json.dumps(report).encode())
    conn.close()
    os._exit(0)


def trial(seed: int, nranks: int, window: float, deadline: float) -> dict:
    """One run: returns its verdict (``split``, ``wrong``, ``hang``, ``leftover``, ...)."""
    rng = random.Random(seed)
    victims = {r: rng.uniform(0, window)
               for r in rng.sample(range(nranks), rng.choice([1, 1, 2]))}
    job = f"stress{uuid.uuid4().hex[:12]}"
    pipes, procs = [], []
    for r in range(nranks):
        recv, send = _CTX.Pipe(duplex=False)
        proc = _CTX.Process(target=_rank, args=(r, nranks, job, victims, send))
        proc.start()
        send.close()
        pipes.append(recv)
        procs.append(proc)
    start = time.monotonic()
    reports = {}
    for r in sorted(set(range(nranks)) - set(victims)):
        if pipes[r].poll(max(0.0, start + deadline - time.monotonic())):
            reports[r] = json.loads(pipes[r].recv_bytes())
    for proc in procs:
        proc.join(5)
        if proc.is_alive():
            proc.kill()
            proc.join()
    leftover = sorted(p.name for p in SHM_DIR.glob(f"commflow.{job}.*"))
    remove_job(job)
    survivors = sorted(set(range(nranks)) - set(victims))
    histories = [json.dumps(reports[r]["events"]) for r in reports]
    events = reports[survivors[0]]["events"] if survivors[0] in reports else []
    crashed = [e for r in reports for e in reports[r]["events"] if e[0] == "crash"]
    last = next((e for e in reversed(events) if e[0] == "members"), None)
    failed_shrink = bool(events) and events[-1][0] == "error"
    return {
        "seed": seed,
        "victims": {str(r): round(t, 3) for r, t in victims.items()},
        "hang": len(reports) < len(survivors),
        "split": len(set(histories)) > 1 or bool(crashed) or (
            not failed_shrink and (last is None or last[1] != survivors)),
        "failed_shrink": failed_shrink,
        "wrong": sum(rep["wrong"] for rep in reports.values()),
        "checked": sum(rep["checked"] for rep in reports.values()),
        "shrink_s": [t for rep in reports.values() for t in rep["shrink_s"]],
        "events": events,
        "crashed": crashed,
        "leftover": leftover,
        "seconds": time.monotonic() - start,
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--runs", type=int, default=200)
    p.add_argument("--ranks", type=int, default=4)
    p.add_argument("--seed", type=int, default=0, help="run i uses seed SEED*100000 + i")
    p.add_argument("--window", type=float, default=0.3, help="victims die in [0, WINDOW) s")
    p.add_argument("--deadline", type=float, default=60.0, help="a run taking longer hangs")
    p.add_argument("--json", action="store_true")
    args = p.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="commflow-stress-") as dumps:
        os.environ["COMMFLOW_DUMP_DIR"] = dumps
        results = []
        for i in range(args.runs):
            r = trial(args.seed * 100000 + i, args.ranks, args.window, args.deadline)
            results.append(r)
            if r["hang"] or r["split"] or r["wrong"] or r["leftover"]:
                print(f"FAILED run seed={r['seed']}: {json.dumps(r)}", file=sys.stderr,
                      flush=True)
    bad = [r for r in results if r["hang"] or r["split"] or r["wrong"] or r["leftover"]]
    shrinks = [t for r in results for t in r["shrink_s"]]
    seconds = [r["seconds"] for r in results]
    summary = {
        "runs": len(results),
        "ranks": args.ranks,
        "split_brain": sum(r["split"] for r in results),
        "wrong": sum(r["wrong"] for r in results),
        "checked": sum(r["checked"] for r in results),
        "hangs": sum(r["hang"] for r in results),
        "leftovers": sum(bool(r["leftover"]) for r in results),
        "shrinks": len(shrinks),
        "failed_shrinks": sum(r["failed_shrink"] for r in results),
        "shrink_ms_median": round(1e3 * statistics.median(shrinks), 1) if shrinks else None,
        "shrink_ms_max": round(1e3 * max(shrinks), 1) if shrinks else None,
        "run_s_median": round(statistics.median(seconds), 2),
        "run_s_max": round(max(seconds), 2),
    }
    if args.json:
        print(json.dumps(summary))
    else:
        print(f"{summary['runs']} runs of {args.ranks} ranks: {summary['split_brain']} split "
              f"brain, {summary['wrong']} wrong of {summary['checked']} checked, "
              f"{summary['hangs']} hangs, {summary['leftovers']} with leftovers; "
              f"{summary['shrinks']} shrinks ({summary['failed_shrinks']} runs where a shrink "
              f"failed alike on every survivor), shrink {summary['shrink_ms_median']} ms median, "
              f"{summary['shrink_ms_max']} ms max; run {summary['run_s_median']} s median, "
              f"{summary['run_s_max']} s max")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
