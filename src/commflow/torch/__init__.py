"""PyTorch integration: the ``commflow`` torch.distributed backend, DDP comm hooks, and the
per-collective algorithm choice.

Importing this package registers the backend for CPU tensors, so an existing script switches
with one import and one word::

    import commflow.torch  # registers "commflow"
    dist.init_process_group("commflow")  # under torchrun or `commflow run`
    model = DistributedDataParallel(model)

``dist.new_group(ranks, backend="commflow")`` gives sub-groups; ``COMMFLOW_ALGO`` or
:func:`use_algorithms` choose algorithms; :mod:`commflow.torch.hooks` routes DDP buckets through
commflow from any backend (gloo included), optionally compressed;
:class:`PriorityScheduler` (:mod:`commflow.torch.sched`) averages gradients without DDP, with
prioritized, partitioned, credit-limited allreduces overlapping the next forward. Importing
this package imports torch; ``import commflow`` alone does not.
"""

import torch.distributed as dist

from commflow.torch import hooks, sched
from commflow.torch.algo import (
    ENV_VAR,
    algorithm_for,
    check_algorithm,
    parse_algorithms,
    use_algorithms,
)
from commflow.torch.backend import BACKEND, CommflowProcessGroup, create_backend
from commflow.torch.sched import Launch, PriorityScheduler
from commflow.torch.work import CommflowWork

dist.Backend.register_backend(BACKEND, create_backend, extended_api=True, devices=["cpu"])

__all__ = [
    "BACKEND",
    "ENV_VAR",
    "CommflowProcessGroup",
    "CommflowWork",
    "Launch",
    "PriorityScheduler",
    "algorithm_for",
    "check_algorithm",
    "create_backend",
    "hooks",
    "parse_algorithms",
    "sched",
    "use_algorithms",
]
