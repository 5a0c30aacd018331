"""The random token in a job's shared-memory segment names, shared by its ranks.

Segment names built from the job id alone are predictable under torchrun or mpirun (the job id
comes from ``MASTER_ADDR``/``MASTER_PORT`` or the MPI job id), so another user could create
them first and make the job fail. Rank 0 therefore draws a random token and the ranks learn it
through what they already share, in this order:

1. ``COMMFLOW_SHM_TOKEN`` in the environment (``commflow run`` sets it for every rank);
2. the engine between hosts (its ``allgather``), when the job spans hosts;
3. a torch.distributed store: the one passed to ``init(store=)``, the default process group's,
   or torchrun's agent store (``TORCHELASTIC_USE_AGENT_STORE=True``);
4. MPI's ``COMM_WORLD`` (a 16-byte broadcast) under mpirun, when mpi4py is installed.

With none of these (``init(rank=, world_size=, job=)`` alone) there is no token: the job id
is the only secret, so pass a random one.
"""

from __future__ import annotations

import re
import secrets
from collections.abc import Mapping
from datetime import timedelta

from commflow.errors import CommflowError

TOKEN_ENV = "COMMFLOW_SHM_TOKEN"
"""Environment variable carrying the token (set by ``commflow run``)."""

_TOKEN_RE = re.compile(r"[0-9a-f]{16}")
_ROUNDS: dict[str, int] = {}
"""Tokens drawn per job in this process: each ``init`` of a job uses a store key of its own
(every rank calls ``init`` as often), so a second world never reads the first one's token."""


def new_token() -> str:
    """A fresh token: 16 hexadecimal digits from the system's random source."""
    return secrets.token_hex(8)


def _checked(token: str, source: str) -> str:
    if not _TOKEN_RE.fullmatch(token):
        raise CommflowError(f"shared-memory token {token!r} from {source} is not 16 hex digits; "
                            f"unset {TOKEN_ENV} or let commflow run set it")
    return token


def shm_token(*, rank: int, job: str, env: Mapping[str, str], source: str, timeout: float,
              store=None, wire=None) -> str:
    """The job's token (see the module docstring), ``""`` when the ranks share nothing to
    agree on one through. Every rank of the job must call it (it may be collective).

    ``source`` is where the world came from (``"mpi"`` enables the MPI broadcast), ``wire``
    an engine :class:`~commflow.runtime.transport.wire.Wire`, ``store`` a torch.distributed
    store. Raises ``CommflowError`` on a malformed token."""
    if env.get(TOKEN_ENV):
        return _checked(env[TOKEN_ENV], TOKEN_ENV)
    if wire is not None:
        return _checked(wire.allgather(new_token().encode())[0].decode(), "rank 0 (engine)")
    store = store if store is not None else _torch_store(env, timeout)
    if store is not None:
        rounds = _ROUNDS[job] = _ROUNDS.get(job, -1) + 1
        restart = env.get("TORCHELASTIC_RESTART_COUNT", "0")
        key = f"commflow/{job}/shm-token/{restart}/{rounds}"
        if rank == 0:
            store.set(key, new_token())
        return _checked(store.get(key).decode(), "rank 0 (store)")
    if source == "mpi":
        return _mpi_token()
    return ""


def _torch_store(env: Mapping[str, str], timeout: float):
    """The default process group's store, or torchrun's agent store as a client; ``None``."""
    import sys

    dist = sys.modules.get("torch.distributed")
    if dist is not None and dist.is_available() and dist.is_initialized():
        return dist.distributed_c10d._get_default_store()
    if env.get("TORCHELASTIC_USE_AGENT_STORE") != "True":
        return None
    import torch.distributed as dist

    try:
        return dist.TCPStore(env["MASTER_ADDR"], int(env["MASTER_PORT"]), is_master=False,
                             timeout=timedelta(seconds=timeout))
    except (KeyError, ValueError, RuntimeError) as err:
        raise CommflowError(f"cannot reach torchrun's store at MASTER_ADDR:MASTER_PORT to share "
                            f"the shared-memory token: {err}") from None


def _mpi_token() -> str:
    """Rank 0's token broadcast over ``MPI.COMM_WORLD`` (``""`` without mpi4py)."""
    try:
        from mpi4py import MPI
    except ImportError:
        return ""
    import numpy as np

    buf = np.frombuffer(new_token().encode(), np.uint8).copy()
    MPI.COMM_WORLD.Bcast(buf, root=0)
    return _checked(buf.tobytes().decode(), "rank 0 (MPI)")
