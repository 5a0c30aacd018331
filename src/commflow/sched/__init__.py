"""Communication scheduling for data-parallel training: simulate how gradients' collectives
share the link with compute under FIFO, bucketing, fusion, priority, partitions, credits,
preemption, reduce-scatter/all-gather decomposition and sharded parameters."""

from commflow.sched.cost import CommCost, fitted_cost, ring_cost, topology_cost
from commflow.sched.engine import Schedule, Span, drain, lower_bound, simulate
from commflow.sched.policies import POLICIES, Policy, get_policy
from commflow.sched.workload import Layer, ScheduleError, Workload

__all__ = [
    "POLICIES",
    "CommCost",
    "Layer",
    "Policy",
    "Schedule",
    "ScheduleError",
    "Span",
    "Workload",
    "fitted_cost",
    "drain",
    "get_policy",
    "lower_bound",
    "ring_cost",
    "simulate",
    "topology_cost",
]
