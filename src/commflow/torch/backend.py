"""The ``commflow`` torch.distributed backend: a ``dist.ProcessGroup`` whose CPU collectives
and messages run on a commflow :class:`~commflow.runtime.Communicator`.

Each call checks its tensors in the calling thread (errors raise there), then queues the
operation on the world's progress thread and returns a :class:`~.work.CommflowWork` whose
future completes once the data is in place; runtime errors (timeouts, mismatched calls, a dead
peer) fail the future and re-raise from ``wait()``. Tensors are used in place through zero-copy
numpy views. The algorithm of each collective comes from :mod:`commflow.torch.algo`.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import torch
import torch.distributed as dist

from commflow.collectives import Collective
from commflow.errors import CommflowError
from commflow.runtime import Communicator
from commflow.torch.alltoallv import alltoallv, split_counts
from commflow.torch.checks import (
    as_flat,
    call_options,
    check_sized,
    checked_root,
    describe,
    only,
    op_name,
    per_rank,
    split_pieces,
    unsupported,
)
from commflow.torch.p2p import Message
from commflow.torch.work import CommflowWork
from commflow.torch.world import World, new_world, subgroup

BACKEND = "commflow"
"""The backend's name in ``dist.init_process_group`` and ``dist.new_group``."""

class CommflowProcessGroup(dist.ProcessGroup):
    """A torch.distributed process group over a commflow communicator (CPU tensors)."""

    def __init__(self, world: World, comm: Communicator) -> None:
        super().__init__(comm.rank, comm.size)
        self.world = world
        self.comm = comm
        self._open = True
        self._group_name: str | None = None
        self._group_desc = ""
        world.attach()

    def getBackendName(self) -> str:  # noqa: N802 (torch's name)
        """``"commflow"``."""
        return BACKEND

    # torch keeps a group's name and description in its device backends; this group has none
    # (it is its own backend), so it keeps them itself. DeviceMesh, FSDP2, DTensor and the
    # functional collectives find a group by this name (``_resolve_process_group``).
    def setGroupName(self, name: str) -> None:  # noqa: N802 (torch's name)
        """Keep torch's name for this group (``dist.new_group`` sets it)."""
        self._group_name = name

    def getGroupName(self) -> str:  # noqa: N802 (torch's name)
        """Torch's name for this group; raises ``RuntimeError`` before torch set it."""
        if self._group_name is None:
            raise RuntimeError("commflow backend: ProcessGroup name not set")
        return self._group_name

    def setGroupDesc(self, desc: str) -> None:  # noqa: N802 (torch's name)
        """Keep torch's description of this group."""
        self._group_desc = desc

    def getGroupDesc(self) -> str:  # noqa: N802 (torch's name)
        """Torch's description of this group (empty until set)."""
        return self._group_desc

    def _get_backend(self, device) -> CommflowProcessGroup:
        """This group, for every device: it is its own backend (torch 2.14 asks a group's
        device backend, e.g. whether it coalesces in ``batch_isend_irecv``; this one does
        not, so each operation runs on its own)."""
        return self

    def __repr__(self) -> str:
        return f"CommflowProcessGroup(rank={self.comm.rank}, ranks={self.comm.ranks})"

    # -- machinery --------------------------------------------------------------------------
    def _run(self, call: str, job: Callable[[], object], outputs: list) -> CommflowWork:
        def run() -> list:
            job()
            return outputs

        return CommflowWork(self.world.submit(run), describe(self.comm, call))

    def _each(self, call, outputs: list, inputs: list, opts) -> CommflowWork:
        """``call`` on each output/input pair; the last Work completes after all of them."""
        works = [call(o, i, opts) for o, i in zip(outputs, inputs, strict=True)]
        return works[-1] if works else self._run("nothing", lambda: None, [])

    # -- reductions -------------------------------------------------------------------------
    def allreduce(self, tensors: list[torch.Tensor], opts=None) -> CommflowWork:
        """All-reduce each tensor in place (``dist.all_reduce``)."""
        opts = opts or dist.AllreduceOptions()
        views = [as_flat(t, "all_reduce tensor") for t in tensors]
        op = op_name(opts, "all_reduce", views[0]) if views else "sum"
        how = call_options(Collective.ALLREDUCE, opts)
        if self.comm.slots > 1:  # between hosts: several in flight (see .work)
            pieces = [p for v in views for p in split_pieces(v, self.comm.slots)]

            def start() -> list:
                return [self.comm.allreduce(p, op, out=p, async_op=True, **how) for p in pieces]

            return CommflowWork(self.world.start(start, tensors), describe(self.comm, "all_reduce"))

        def job() -> None:
            for v in views:
                self.comm.allreduce(v, op, out=v, **how)

        return self._run("all_reduce", job, tensors)

    def allreduce_coalesced(self, tensors: list[torch.Tensor], opts=None) -> CommflowWork:
        """All-reduce several tensors, fused: the tensors of each dtype are packed into one
        buffer (in order), reduced with one ``allreduce``, and copied back; a dtype with one
        tensor is reduced in place. ``dist.all_reduce_coalesced`` and ``_coalescing_manager``
        around ``all_reduce`` calls arrive here."""
        opts = opts or dist.AllreduceCoalescedOptions()
        views = [as_flat(t, f"all_reduce_coalesced tensor {i}") for i, t in enumerate(tensors)]
        groups: dict[np.dtype, list[np.ndarray]] = {}
        for v in views:
            groups.setdefault(v.dtype, []).append(v)
        op = "sum"
        for group in groups.values():
            op = op_name(opts, "all_reduce_coalesced", group[0])
        how = call_options(Collective.ALLREDUCE, opts)

        def job() -> None:
            for group in groups.values():
                if len(group) == 1:
                    self.comm.allreduce(group[0], op, out=group[0], **how)
                    continue
                fused = np.concatenate(group)
                self.comm.allreduce(fused, op, out=fused, **how)
                start = 0
                for v in group:
                    v[:] = fused[start : start + v.size]
                    start += v.size

        return self._run("all_reduce_coalesced", job, tensors)

    def reduce(self, tensors: list[torch.Tensor], opts=None) -> CommflowWork:
        """Reduce into the root's tensor (``dist.reduce``)."""
        opts = opts or dist.ReduceOptions()
        view = as_flat(only(tensors, "reduce"), "reduce tensor")
        op, root = op_name(opts, "reduce", view), checked_root(self.comm, opts.rootRank, "reduce")
        how = call_options(Collective.REDUCE, opts)
        return self._run("reduce", lambda: self.comm.reduce(view, root, op, **how), tensors)

    def reduce_scatter(self, output_tensors, input_tensors, opts=None) -> CommflowWork:
        """Reduce the ranks' lists ``input_tensors[0]`` and keep this rank's entry in
        ``output_tensors[0]`` (``dist.reduce_scatter``)."""
        out = as_flat(only(output_tensors, "reduce_scatter"), "reduce_scatter output")
        blocks = per_rank(self.comm, only(input_tensors, "reduce_scatter"), out, "reduce_scatter")
        return self._reduce_scatter(out, lambda: np.concatenate(blocks), opts, output_tensors)

    def reduce_scatter_single(self, output, input, opts=None) -> CommflowWork:  # noqa: A002
        """Reduce ``input`` and keep this rank's block (``dist.reduce_scatter_single``)."""
        out = as_flat(output, "reduce_scatter output")
        whole = as_flat(input, "reduce_scatter input")
        check_sized(self.comm, whole, out, "reduce_scatter_single")
        return self._reduce_scatter(out, lambda: whole, opts, [output])

    def _reduce_scatter(self, out: np.ndarray, whole, opts, outputs: list) -> CommflowWork:
        opts = opts or dist.ReduceScatterOptions()
        op = op_name(opts, "reduce_scatter", out)
        how = call_options(Collective.REDUCESCATTER, opts)
        return self._run(
            "reduce_scatter", lambda: self.comm.reduce_scatter(whole(), op, out=out, **how), outputs
        )

    def reduce_scatter_single_coalesced(self, outputs, inputs, opts=None) -> CommflowWork:
        """``reduce_scatter_single`` on each pair."""
        return self._each(self.reduce_scatter_single, outputs, inputs, opts)

    # -- data movement ----------------------------------------------------------------------
    def broadcast(self, tensors: list[torch.Tensor], opts=None) -> CommflowWork:
        """Copy the root's tensor to every rank (``dist.broadcast``)."""
        opts = opts or dist.BroadcastOptions()
        view = as_flat(only(tensors, "broadcast"), "broadcast tensor")
        root = checked_root(self.comm, opts.rootRank, "broadcast")
        how = call_options(Collective.BROADCAST, opts)
        return self._run("broadcast", lambda: self.comm.broadcast(view, root, **how), tensors)

    def allgather(self, output_tensors, input_tensors, opts=None) -> CommflowWork:
        """Gather every rank's ``input_tensors[0]`` into each rank's list
        ``output_tensors[0]`` (``dist.all_gather``)."""
        x = as_flat(only(input_tensors, "all_gather"), "all_gather input")
        outs = per_rank(self.comm, only(output_tensors, "all_gather"), x, "all_gather")
        how = call_options(Collective.ALLGATHER, opts)

        def job() -> None:
            for out, part in zip(
                outs, self.comm.allgather(x, **how).reshape(len(outs), -1), strict=True
            ):
                out[:] = part

        return self._run("all_gather", job, output_tensors)

    def allgather_coalesced(self, output_lists, input_tensors, opts=None) -> CommflowWork:
        """All-gather several tensors of any sizes and dtypes as one operation
        (``dist.all_gather_coalesced``): ``output_lists[r][i]`` gets rank r's
        ``input_tensors[i]``."""
        what = describe(self.comm, "all_gather_coalesced")
        if len(output_lists) != self.comm.size or any(
            len(outs) != len(input_tensors) for outs in output_lists
        ):
            raise CommflowError(
                f"{what}: pass {self.comm.size} output lists (one per rank) of "
                f"{len(input_tensors)} tensors (one per input tensor)"
            )
        pairs = []
        for i, t in enumerate(input_tensors):
            x = as_flat(t, f"all_gather_coalesced input {i}")
            outs = [outs[i] for outs in output_lists]
            pairs.append((x, per_rank(self.comm, outs, x, f"all_gather_coalesced output {i}")))
        how = call_options(Collective.ALLGATHER, opts)

        def job() -> None:
            for x, outs in pairs:
                if x.size:
                    gathered = self.comm.allgather(x, **how).reshape(len(outs), -1)
                    for out, part in zip(outs, gathered, strict=True):
                        out[:] = part

        return self._run("all_gather_coalesced", job, output_lists)

    def all_gather_single(self, output, input, opts=None) -> CommflowWork:  # noqa: A002
        """Gather every rank's tensor into one (``dist.all_gather_single``)."""
        out, x = as_flat(output, "all_gather output"), as_flat(input, "all_gather input")
        check_sized(self.comm, out, x, "all_gather_single")
        how = call_options(Collective.ALLGATHER, opts)
        return self._run("all_gather", lambda: self.comm.allgather(x, out=out, **how), [output])

    def all_gather_single_coalesced(self, outputs, inputs, opts=None) -> CommflowWork:
        """``all_gather_single`` on each pair."""
        return self._each(self.all_gather_single, outputs, inputs, opts)

    def gather(self, output_tensors, input_tensors, opts=None) -> CommflowWork:
        """Gather every rank's ``input_tensors[0]`` into the root's list ``output_tensors[0]``
        (``dist.gather``)."""
        opts = opts or dist.GatherOptions()
        x = as_flat(only(input_tensors, "gather"), "gather input")
        root = checked_root(self.comm, opts.rootRank, "gather")
        how = call_options(Collective.GATHER, opts)
        mine = self.comm.rank == root
        outs = per_rank(self.comm, only(output_tensors, "gather"), x, "gather") if mine else []

        def job() -> None:
            gathered = self.comm.gather(x, root, **how)
            for out, part in zip(
                outs, gathered.reshape(len(outs), -1) if mine else [], strict=True
            ):
                out[:] = part

        return self._run("gather", job, output_tensors)

    def scatter(self, output_tensors, input_tensors, opts=None) -> CommflowWork:
        """Give rank j the j-th tensor of the root's list ``input_tensors[0]``
        (``dist.scatter``)."""
        opts = opts or dist.ScatterOptions()
        out = as_flat(only(output_tensors, "scatter"), "scatter output")
        root = checked_root(self.comm, opts.rootRank, "scatter")
        how = call_options(Collective.SCATTER, opts)
        mine = self.comm.rank == root
        ins = per_rank(self.comm, only(input_tensors, "scatter"), out, "scatter") if mine else []

        def job() -> None:
            whole = np.concatenate(ins) if ins else np.empty(self.comm.size * out.size, out.dtype)
            self.comm.scatter(whole, root, out=out, **how)

        return self._run("scatter", job, output_tensors)

    def all_to_all_single(
        self,
        output,
        input,
        output_split_sizes,
        input_split_sizes,  # noqa: A002
        opts=None,
    ) -> CommflowWork:
        """Exchange blocks of the first dimension, even or by split sizes
        (``dist.all_to_all_single``)."""
        out, x = as_flat(output, "all_to_all output"), as_flat(input, "all_to_all input")
        how, n = call_options(Collective.ALLTOALL, opts), self.comm.size
        what = describe(self.comm, "all_to_all_single")
        if not output_split_sizes and not input_split_sizes:
            if out.size != x.size or out.dtype != x.dtype or x.size % n:
                raise CommflowError(
                    f"{what}: input and output must match and split evenly into {n} blocks"
                )
            return self._run("all_to_all", lambda: self.comm.alltoall(x, out=out, **how), [output])
        send = split_counts(input, input_split_sizes, n, f"{what}: input")
        recv = split_counts(output, output_split_sizes, n, f"{what}: output")
        return self._run(
            "all_to_all", lambda: alltoallv(self.comm, x, send, out, recv, **how), [output]
        )

    def alltoall(self, output_tensors, input_tensors, opts=None) -> CommflowWork:
        """Send the j-th input tensor to rank j, any sizes (``dist.all_to_all``)."""
        ins = [as_flat(t, f"all_to_all input {j}") for j, t in enumerate(input_tensors)]
        outs = [as_flat(t, f"all_to_all output {i}") for i, t in enumerate(output_tensors)]
        what, n = describe(self.comm, "all_to_all"), self.comm.size
        if len(ins) != n or len(outs) != n:
            raise CommflowError(f"{what}: pass {n} input and {n} output tensors")
        if len({a.dtype for a in ins + outs}) > 1:
            raise CommflowError(f"{what}: all tensors must share a dtype")
        how = call_options(Collective.ALLTOALL, opts)
        sizes = [o.size for o in outs]

        def job() -> None:
            recv = np.empty(sum(sizes), outs[0].dtype)
            alltoallv(self.comm, np.concatenate(ins), [a.size for a in ins], recv, sizes, **how)
            for out, end in zip(outs, np.cumsum(sizes), strict=True):
                out[:] = recv[end - out.size : end]

        return self._run("all_to_all", job, output_tensors)

    def barrier(self, opts=None) -> CommflowWork:
        """Complete once every rank of the group called ``barrier``."""
        timeout = call_options(Collective.ALLREDUCE, opts)["timeout"]
        return self._run("barrier", lambda: self.comm.barrier(timeout=timeout), [])

    # -- point to point ---------------------------------------------------------------------
    def send(self, tensors: list[torch.Tensor], dstRank: int, tag: int = 0) -> CommflowWork:  # noqa: N803
        """Send to group rank ``dstRank`` (``dist.isend``/``send``); see :mod:`.p2p`."""
        return self._message(tensors, dstRank, tag, sending=True)

    def recv(self, tensors: list[torch.Tensor], srcRank: int, tag: int = 0) -> CommflowWork:  # noqa: N803
        """Receive from group rank ``srcRank`` (``dist.irecv``/``recv``); see :mod:`.p2p`."""
        return self._message(tensors, srcRank, tag, sending=False)

    def recv_anysource(self, tensors: list[torch.Tensor], tag: int = 0) -> CommflowWork:
        """Receive from any other group rank (``dist.recv``/``irecv`` without ``src``); see
        :mod:`.p2p` for the order in which the peers are read."""
        return self._message(tensors, None, tag, sending=False)

    def _message(self, tensors, peer: int | None, tag: int, *, sending: bool) -> CommflowWork:
        if peer is None:
            call = f"recv from any source (tag {tag})"
            what = describe(self.comm, call)
            message = Message(self.comm, None, tag, only(tensors, call), False, what)
            return CommflowWork(
                self.world.hold(message), message.what, start=self.world.flush,
                source=lambda: message.peer,
            )
        call = f"{'send to' if sending else 'recv from'} rank {peer} (tag {tag})"
        what = describe(self.comm, call)
        if not 0 <= peer < self.comm.size:
            raise CommflowError(f"{what}: peer must be a group rank in 0..{self.comm.size - 1}")
        message = Message(self.comm, peer, tag, only(tensors, call), sending, what)
        return CommflowWork(self.world.hold(message), message.what, start=self.world.flush)

    # -- coalescing, older names, unsupported calls, shutdown -------------------------------
    def _start_coalescing(self, device: torch.device) -> None:
        """Nothing to do: operations already run in issue order."""

    def _end_coalescing(self, device: torch.device) -> CommflowWork:
        """A Work that completes after every operation issued so far."""
        return self._run("coalesced operations", lambda: None, [])

    _allgather_base = all_gather_single
    _reduce_scatter_base = reduce_scatter_single
    alltoall_base = all_to_all_single
    allgather_into_tensor_coalesced = all_gather_single_coalesced
    reduce_scatter_tensor_coalesced = reduce_scatter_single_coalesced

    split_group = unsupported("split_group", "use dist.new_group(ranks, backend='commflow')")
    merge_remote_group = unsupported("merge_remote_group", "create one job with every rank")

    def shutdown(self) -> None:
        """Finish this group's queued operations; the world's threads stop with its last
        group (``dist.destroy_process_group`` calls this)."""
        if self._open:
            self._open = False
            self.world.detach()


def create_backend(options, pg_options=None) -> CommflowProcessGroup:
    """torch's creator for the ``commflow`` backend (``extended_api=True``): the default group
    starts a commflow world; a sub-group becomes a communicator over its ranks on it (or, when
    the default group is another backend, a world of its own). ``timeout`` bounds every wait."""
    ranks = list(options.global_ranks_in_group)
    default = dist.group.WORLD if dist.is_initialized() else None
    if ranks and isinstance(default, CommflowProcessGroup):
        world = default.world
        comm = subgroup(world, ranks, options.group_id, options.timeout)
    else:
        world = new_world(
            options.store,
            options.group_rank,
            options.group_size,
            options.timeout,
            placement=not ranks,
        )
        comm = world.comm
    return CommflowProcessGroup(world, comm)
