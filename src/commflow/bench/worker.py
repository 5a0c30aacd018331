"""The rank side of ``commflow bench``: ``python -m commflow.bench.worker SPEC.json``.

Every rank reads the :class:`RunSpec` the parent wrote, joins the implementation's job, and
for every algorithm, size and placement runs ``warmup`` untimed iterations, then ``iters``
timed ones. Each iteration first resets the buffers (:meth:`Case.prepare`, untimed), then
enters the implementation's own barrier; the rank times only the collective call
(``time.perf_counter``). After the timed loop every rank counts the elements of its last
result that differ from the expected values. Each rank writes its times and count as JSON to
``rank<r>.json`` in the spec file's directory; rank 0 appends a line to ``progress`` there
after each size. Nothing is pickled.
"""

from __future__ import annotations

import json
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from commflow.bench.cases import Case, CaseSpec, wrong_values
from commflow.bench.impl import Ranks, module
from commflow.collectives import parse_collective
from commflow.errors import CommflowError
from commflow.runtime import dtype_of


@dataclass(frozen=True, kw_only=True)
class RunSpec:
    """What the ranks of one implementation run, as the parent writes it for them."""

    impl: str
    """Implementation name (``commflow``, ``gloo``, ``mpi``)."""
    collective: str
    """Collective name."""
    algos: tuple[str, ...]
    """Algorithms to run, in order (peers: ``("default",)``)."""
    blocks: tuple[int, ...]
    """Elements per block, one entry per size (see :func:`cases.block_elements`)."""
    dtype: str
    """Element type name."""
    op: str
    """Reduction operator."""
    root: int
    """Root of rooted collectives."""
    warmup: int
    """Untimed iterations before the timed ones, per size and placement."""
    iters: int
    """Timed iterations per size and placement."""
    timeout: float
    """Seconds any wait of the implementation may take."""
    corrupt_rank: int | None = None
    """Test hook: this rank spoils one element of each result before the check."""

    def save(self, path: Path) -> None:
        """Write the spec as JSON to ``path``."""
        path.write_text(json.dumps(asdict(self)))

    @classmethod
    def load(cls, path: Path) -> RunSpec:
        """Read a spec written by :meth:`save`."""
        fields = json.loads(Path(path).read_text())
        return cls(**{**fields, "algos": tuple(fields["algos"]), "blocks": tuple(fields["blocks"])})


def _measure(ranks: Ranks, spec: RunSpec, algo: str, case: Case) -> dict:
    """Warm up, time ``spec.iters`` iterations of ``case``, check the last result."""
    call = ranks.operation(algo, case)
    for _ in range(spec.warmup):
        case.prepare()
        ranks.barrier()
        call()
    times = []
    for _ in range(spec.iters):
        case.prepare()
        ranks.barrier()
        start = time.perf_counter()
        call()
        times.append(time.perf_counter() - start)
    if spec.corrupt_rank == ranks.rank and case.expected is not None:
        case.recv[:1] = wrong_values(case.expected[:1])
    return {
        "algo": algo,
        "block": case.spec.block,
        "inplace": case.spec.inplace,
        "times": times,
        "wrong": case.wrong(),
    }


def run(spec: RunSpec, outdir: Path) -> None:
    """Run ``spec`` on this rank and write ``outdir/rank<r>.json``."""
    ranks = module(spec.impl).connect(spec.timeout)
    collective, dtype = parse_collective(spec.collective), dtype_of(spec.dtype)
    results = []
    for algo in spec.algos:
        for block in spec.blocks:
            for inplace in (False, True):
                case = Case(
                    CaseSpec(
                        collective=collective,
                        nranks=ranks.nranks,
                        rank=ranks.rank,
                        block=block,
                        dtype=dtype,
                        op=spec.op,
                        root=spec.root,
                        inplace=inplace,
                    )
                )
                results.append(_measure(ranks, spec, algo, case))
            if ranks.rank == 0:
                with open(outdir / "progress", "a") as progress:
                    progress.write(f"{algo} {block}\n")
    ranks.close()
    result = {"rank": ranks.rank, "nranks": ranks.nranks, "runs": results}
    (outdir / f"rank{ranks.rank}.json").write_text(json.dumps(result))


def main(argv: list[str]) -> int:
    """Entry point: ``argv`` is ``[SPEC.json]``; returns the exit status."""
    if len(argv) != 1:
        print("usage: python -m commflow.bench.worker SPEC.json", file=sys.stderr)
        return 2
    try:
        path = Path(argv[0])
        run(RunSpec.load(path), path.parent)
    except CommflowError as error:
        print(f"error: {error}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
