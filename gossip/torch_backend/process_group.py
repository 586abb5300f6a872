"""A torch.distributed backend named "gossip": ``dist.init_process_group("gossip")`` under
torchrun, ``gossip run`` or any launcher torch supports, then DDP and the plain
``dist.all_reduce / broadcast / all_gather / reduce_scatter / barrier / send / recv`` on CPU
tensors run over gossip's collectives, with gossip's errors (PeerLost naming the rank that
is gone, OperationTimeout, agreement mismatches raised on every rank).

    import torch, gossip                      # torch first: gossip registers the backend
    dist.init_process_group("gossip")         # (or: import gossip.torch_backend)

Each process group (the default one, and each ``dist.new_group``) is a gossip Peer of its
own: its group rank 0 opens a gossip rendezvous on a free port of its host (MASTER_ADDR's
address when set, else 127.0.0.1) and publishes it, with a fresh job id, in the group's
c10d store; the others read it there. The group's timeout (``init_process_group(timeout=)``)
is the Peer's. Every call returns a ``dist.Work`` at once: collectives run in call order on
the Peer's worker thread, sends and receives on threads of their own (so an ``isend`` to a
peer that is not receiving yet does not block the caller); ``get_future()`` completes with
the call's tensors, as DDP's communication hooks expect, on threads of its own
(c10d_work.py: a callback may start another collective and wait for it). Errors are gossip's
and torch's at once (``as_c10d_error``: a PeerLost is a DistBackendError too).

send and recv match tags as Gloo does (a recv gets the earliest message of its tag from its
source; collectives/operations/send_recv.py), and ``dist.recv(src=None)`` receives from any
other rank (the first with a message of the tag waiting). What is refused with a clear error
rather than done wrongly: devices other than CPU, ReduceOp.PREMUL_SUM, bitwise reductions of
floating-point tensors. Non-contiguous tensors go through contiguous copies, as Gloo's do
(collectives/staging.py).
"""
from __future__ import annotations

import os
import socket
import uuid
from typing import Any, Callable, NoReturn

import torch
import torch.distributed as dist
from torch.distributed import ReduceOp

from collectives.errors import OperationTimeout
from collectives.work import Executor, Work as OurWork
from gossip.torch_backend.c10d_work import GossipWork, joined as _joined, seconds as _seconds

__all__ = ["GossipProcessGroup", "register", "BACKEND_NAME", "peer_of"]

BACKEND_NAME = "gossip"
"""The name torch.distributed knows the backend by: ``init_process_group("gossip")``."""
_STORE_KEY = "gossip/rendezvous"

_OPS = ((ReduceOp.SUM, "sum"), (ReduceOp.AVG, "mean"), (ReduceOp.PRODUCT, "prod"),
        (ReduceOp.MIN, "min"), (ReduceOp.MAX, "max"), (ReduceOp.BAND, "band"),
        (ReduceOp.BOR, "bor"), (ReduceOp.BXOR, "bxor"))


def _op_name(op: Any) -> str:
    for theirs, ours in _OPS:
        if op == theirs:
            return ours
    raise ValueError(f"the gossip backend has no reduction {op}: it reduces with SUM, AVG, "
                     "PRODUCT, MIN, MAX, BAND, BOR and BXOR")


class GossipProcessGroup(dist.ProcessGroup):
    """A c10d process group whose collectives are a gossip Peer's (see the module's text).

    Its methods take what c10d passes a backend, (tensors, options); torch's stub also lists
    the binding's convenience overloads of ProcessGroup's methods (a single tensor, an op, a
    timeout), which torch.distributed never calls on a backend: hence the overrides' type
    ignores."""

    def __init__(self, store: Any, rank: int, size: int, timeout: Any,
                 name: str = "") -> None:
        super().__init__(rank, size)  # type: ignore[call-arg]  # the stub lacks (rank, size)
        import gossip   # (gossip imports this module lazily: no cycle at import time)
        seconds = _seconds(timeout)
        job, address = _rendezvous_through(store, rank, name)
        self.peer = gossip.init(rank=rank, world_size=size, rendezvous=address, job_id=job,
                                timeout=seconds)
        self._comm = self.peer.communicator
        self._sends = Executor(f"gossip-c10d send r{rank}")
        self._recvs = Executor(f"gossip-c10d recv r{rank}")
        # What torch names the group by (destroy_process_group, functional collectives):
        # ProcessGroup keeps it in its first device backend, and this group is its own.
        self._group_name = ""
        self._group_desc = ""

    # ------------------------------------------------------------------ c10d interface
    def getBackendName(self) -> str:
        return BACKEND_NAME

    def _set_group_name(self, name: str) -> None:
        self._group_name = name

    @property
    def group_name(self) -> str:  # type: ignore[override]  # (the binding's is a property too)
        if not self._group_name:
            raise RuntimeError("ProcessGroup name not set")   # (as torch's own says)
        return self._group_name

    def _set_group_desc(self, desc: str) -> None:
        self._group_desc = desc

    @property
    def group_desc(self) -> str:
        return self._group_desc

    def allreduce(  # type: ignore[override]  # c10d's (tensors, opts): class docstring
            self, tensors: list, opts: Any = None) -> GossipWork:
        op = _op_name(opts.reduceOp if opts is not None else ReduceOp.SUM)
        return self._each(tensors, lambda t: self._comm.allreduce(t, op, wait=False))

    def allreduce_coalesced(self, tensors: list, opts: Any = None) -> GossipWork:
        return self.allreduce(tensors, opts)

    def broadcast(  # type: ignore[override]  # c10d's (tensors, opts): class docstring
            self, tensors: list, opts: Any = None) -> GossipWork:
        root = opts.rootRank if opts is not None else 0
        return self._each(tensors, lambda t: self._comm.broadcast(t, root, wait=False))

    def allgather(  # type: ignore[override]  # c10d's (tensors, opts): class docstring
            self, outputs: list, inputs: list, opts: Any = None) -> GossipWork:
        """outputs[i]: a list of world-size tensors, ``outputs[i][r]`` sized like rank r's
        inputs[i]: like this rank's, or of uneven sizes (torch's all_gather takes both): then
        the variable allgather, whose sizes every rank checks against its outputs."""
        if len(outputs) != len(inputs):
            raise ValueError(f"allgather: {len(outputs)} output lists for {len(inputs)} inputs")
        handles: list[OurWork] = []
        gathered: list[Any] = []
        for out_list, x in zip(outputs, inputs):
            self._check(x, *out_list)
            if len(out_list) != self.size():
                raise ValueError(f"allgather: {len(out_list)} output tensors for world size "
                                 f"{self.size()}")
            if any(tuple(o.shape) != tuple(x.shape) for o in out_list):
                if out_list[self.rank()].numel() != x.numel():
                    self._refuse(f"all_gather: rank {self.rank()}'s output tensor has "
                                 f"{out_list[self.rank()].numel()} elements, its input "
                                 f"{x.numel()}", "all_gather")
                handles.append(self._comm.allgather(x, variable=True, wait=False))
                gathered.append(None)
                continue
            buf = torch.empty((self.size(),) + tuple(x.shape), dtype=x.dtype)
            handles.append(self._comm.allgather(x, out=buf, wait=False))
            gathered.append(buf)

        def finish() -> None:
            for out_list, buf, handle in zip(outputs, gathered, handles):
                parts = handle.wait() if buf is None else buf
                for r, out in enumerate(out_list):
                    if buf is None and parts[r].numel() != out.numel():
                        raise ValueError(
                            f"all_gather: rank {r} sent {parts[r].numel()} elements, rank "
                            f"{self.rank()}'s output tensor {r} holds {out.numel()}")
                    out.copy_(parts[r].reshape(out.shape))
        return GossipWork(handles, outputs, finish)

    def allgather_coalesced(self, outputs: list, inputs: list, opts: Any = None) -> GossipWork:
        return self.allgather(outputs, inputs, opts)

    def all_gather_single(self, output: Any, x: Any, opts: Any = None) -> GossipWork:
        """all_gather_into_tensor: ``output`` holds world-size copies of x's size, rank order."""
        self._check(x, output)
        if output.numel() != x.numel() * self.size():
            self._refuse(f"all_gather_into_tensor: output has {output.numel()} elements, "
                         f"expected {x.numel()} x {self.size()}", "all_gather_into_tensor")
        handle = self._comm.allgather(x, out=output, wait=False)
        return GossipWork([handle], [output])

    _allgather_base = all_gather_single  # type: ignore[assignment]  # c10d's form

    def all_gather_single_coalesced(self, outputs: list, inputs: list,
                                    opts: Any = None) -> GossipWork:
        return _joined([self.all_gather_single(o, x, opts) for o, x in zip(outputs, inputs)],
                       outputs)

    def reduce_scatter(  # type: ignore[override]  # c10d's (tensors, opts): class docstring
            self, outputs: list, inputs: list, opts: Any = None) -> GossipWork:
        """``inputs[i]``: a list of world-size tensors, ``inputs[i][j]`` like rank j's
        ``outputs[i]`` (sizes may differ between ranks); this rank gets the reduction of every
        rank's ``inputs[i][rank]``."""
        op = _op_name(opts.reduceOp if opts is not None else ReduceOp.SUM)
        handles, parts = [], []
        for out, in_list in zip(outputs, inputs):
            self._check(out, *in_list)
            if len(in_list) != self.size():
                raise ValueError(f"reduce_scatter: {len(in_list)} input tensors for world "
                                 f"size {self.size()}")
            if in_list[self.rank()].numel() != out.numel():
                self._refuse(f"reduce_scatter: input {self.rank()} has "
                             f"{in_list[self.rank()].numel()} elements, output "
                             f"{out.numel()}", "reduce_scatter")
            counts = [t.numel() for t in in_list]
            flat = torch.cat([t.reshape(-1) for t in in_list])   # a copy: inputs stay
            handles.append(self._comm.reduce_scatter(
                flat, op, counts=None if len(set(counts)) == 1 else counts, wait=False))
            parts.append(flat)
        return GossipWork(handles, outputs, lambda: self._scatter_back(outputs, handles))

    def reduce_scatter_single(self, output: Any, x: Any, opts: Any = None) -> GossipWork:
        """reduce_scatter_tensor: x holds world-size parts of output's size, rank order."""
        op = _op_name(opts.reduceOp if opts is not None else ReduceOp.SUM)
        self._check(output, x)
        if x.numel() != output.numel() * self.size():
            self._refuse(f"reduce_scatter_tensor: input has {x.numel()} elements, "
                         f"expected {output.numel()} x {self.size()}", "reduce_scatter_tensor")
        flat = x.reshape(-1).clone()   # reduced in place: the caller's input stays
        handle = self._comm.reduce_scatter(flat, op, wait=False)
        return GossipWork([handle], [output], lambda: self._scatter_back([output], [handle]))

    _reduce_scatter_base = reduce_scatter_single  # type: ignore[assignment]  # c10d's form

    def reduce_scatter_single_coalesced(self, outputs: list, inputs: list,
                                        opts: Any = None) -> GossipWork:
        return _joined([self.reduce_scatter_single(o, x, opts)
                        for o, x in zip(outputs, inputs)], outputs)

    def barrier(self, opts: Any = None) -> GossipWork:
        # At once, as every call: dist.barrier() waits on the Work, async_op=True does not.
        work = self._comm.barrier(wait=False)
        assert work is not None   # (wait=False: always a Work)
        return GossipWork([work], None)

    def send(self, tensors: list, dst: int, tag: int = 0) -> GossipWork:
        x = _one(tensors, "send").contiguous()
        self._check(x)
        work = self._sends.submit(lambda: self._comm.send(dst, x, tag=tag),
                                  OurWork(f"rank {self.rank()}: send to rank {dst}"))
        return GossipWork([work], tensors)

    def recv(self, tensors: list, src: int, tag: int = 0) -> GossipWork:
        out = _one(tensors, "recv")
        self._check(out)
        work = self._recvs.submit(lambda: self._comm.recv(src, out, tag=tag),
                                  OurWork(f"rank {self.rank()}: recv from rank {src}"))
        return GossipWork([work], tensors)

    def recv_anysource(self, tensors: list, tag: int = 0) -> GossipWork:
        """dist.recv(src=None): from the first other rank with a message of ``tag``
        waiting; the Work's ``_source_rank()`` says which."""
        out = _one(tensors, "recv")
        self._check(out)
        others = [r for r in range(self.size()) if r != self.rank()]
        source: list[int] = []

        def receive() -> None:
            src = self._comm.wait_any(others, tag=tag)
            if src is None:
                raise OperationTimeout(f"rank {self.rank()}: recv from any source (tag {tag}): "
                                       f"no rank sent within the timeout "
                                       f"({self._comm.transport.config.timeout:g}s)",
                                       rank=self.rank())
            self._comm.recv(src, out, tag=tag)
            source.append(src)

        work = self._recvs.submit(receive, OurWork(f"rank {self.rank()}: recv from any source"))
        return GossipWork([work], tensors, source=lambda: source[0])

    def reduce(  # type: ignore[override]  # c10d's (tensors, opts): class docstring
            self, tensors: list, opts: Any = None) -> GossipWork:
        op = _op_name(opts.reduceOp if opts is not None else ReduceOp.SUM)
        root = opts.rootRank if opts is not None else 0
        return self._each(tensors, lambda t: self._comm.reduce(t, root, op, wait=False))

    def gather(  # type: ignore[override]  # c10d's (tensors, opts): class docstring
            self, outputs: list, inputs: list, opts: Any = None) -> GossipWork:
        """outputs: [the root's list of world-size tensors] on the root, [] elsewhere."""
        root = opts.rootRank if opts is not None else 0
        x = _one(inputs, "gather")
        self._check(x)
        handle = self._comm.gather(x, root, wait=False)
        if self.rank() != root:
            return GossipWork([handle], outputs)
        out_list = _one(outputs, "gather's outputs")
        self._check(*out_list)

        def finish() -> None:
            gathered = handle.wait(0)
            for k, out in enumerate(out_list):
                out.copy_(gathered[k])
        return GossipWork([handle], outputs, finish)

    def scatter(  # type: ignore[override]  # c10d's (tensors, opts): class docstring
            self, outputs: list, inputs: list, opts: Any = None) -> GossipWork:
        """inputs: [the root's list of world-size tensors] on the root, [] elsewhere."""
        root = opts.rootRank if opts is not None else 0
        out = _one(outputs, "scatter")
        source = None
        if self.rank() == root:
            parts = _one(inputs, "scatter's inputs")
            self._check(out, *parts)
            source = torch.cat([t.reshape(-1) for t in parts])
        handle = self._comm.scatter(source, root, out=out, wait=False)
        return GossipWork([handle], outputs)

    def alltoall(self, outputs: list, inputs: list, opts: Any = None) -> GossipWork:
        """all_to_all: inputs[j] goes to rank j, outputs[j] comes from rank j (sizes may
        differ: rank j's inputs[r] must be like this rank's outputs[j])."""
        self._check(*outputs, *inputs)
        flat = torch.cat([t.reshape(-1) for t in inputs])
        counts = [t.numel() for t in outputs]
        handle = self._comm.alltoall(flat, send_counts=[t.numel() for t in inputs],
                                     recv_counts=counts, wait=False)

        def finish() -> None:
            got = handle.wait(0)
            at = 0
            for out, m in zip(outputs, counts):
                out.copy_(got[at:at + m].reshape(out.shape))
                at += m
        return GossipWork([handle], outputs, finish)

    def all_to_all_single(self, output: Any, x: Any, output_splits: list, input_splits: list,
                          opts: Any = None) -> GossipWork:
        """all_to_all_single: equal blocks when no splits are given, else the splits (along
        the first dimension) per rank, as torch documents."""
        self._check(output, x)
        n = self.size()
        if not output_splits and not input_splits:
            if x.numel() != output.numel() or x.numel() % n:
                self._refuse(f"all_to_all_single: input of {x.numel()} and output of "
                             f"{output.numel()} elements, not n = {n} equal blocks",
                             "all_to_all_single")
            handle = self._comm.alltoall(x, out=output, wait=False)
            return GossipWork([handle], [output])
        sends = _split_counts(x, input_splits, n, "input")
        recvs = _split_counts(output, output_splits, n, "output")
        handle = self._comm.alltoall(x, send_counts=sends, recv_counts=recvs, out=output,
                                     wait=False)
        return GossipWork([handle], [output])

    alltoall_base = all_to_all_single  # type: ignore[assignment]  # c10d's form

    def shutdown(self) -> None:
        self.close()

    def close(self) -> None:
        """Stop the send and receive threads and close the Peer (destroy_process_group)."""
        self._sends.close()
        self._recvs.close()
        self.peer.close()

    # ------------------------------------------------------------------ helpers
    def _each(self, tensors: list, start: Callable[[Any], OurWork]) -> GossipWork:
        """``start`` on each tensor, in place (a non-contiguous one through a contiguous
        stand-in: collectives/staging.py)."""
        self._check(*tensors)
        return GossipWork([start(t) for t in tensors], tensors)

    def _scatter_back(self, outputs: list, handles: list) -> None:
        """Each output takes its reduce_scatter's segment (the view the handle returns)."""
        for out, handle in zip(outputs, handles):
            out.copy_(handle.wait(0).reshape(out.shape))

    def _check(self, *tensors: Any) -> None:
        for t in tensors:
            if not isinstance(t, torch.Tensor):
                raise TypeError(f"rank {self.rank()}: the gossip backend takes tensors, got "
                                f"{type(t).__name__}")
            if t.layout != torch.strided:
                raise ValueError(f"rank {self.rank()}: the gossip backend takes dense tensors, "
                                 f"got a {str(t.layout).replace('torch.', '')} one (call "
                                 f".to_dense() first)")
            if t.device.type != "cpu":
                raise ValueError(f"rank {self.rank()}: the gossip backend runs on CPU tensors, "
                                 f"got one on {t.device} (use NCCL for GPU tensors)")

    def _refuse(self, message: str, what: str) -> NoReturn:
        """A check of this rank's own tensors failed (the others cannot see them): fail a call
        of its own with it, so the other ranks raise at once, naming this one, and stay in
        step with it (Engine.refuse), then raise ValueError here."""
        self._comm.engine.refuse(ValueError(f"rank {self.rank()}: {message}"), what)

def _split_counts(t: Any, splits: list, n: int, what: str) -> list[int]:
    """Elements per rank of an all_to_all_single tensor: its ``splits`` of the first
    dimension (equal parts when empty), times a row's elements."""
    rows = t.shape[0] if t.dim() else 1
    if not splits:
        if rows % n:
            raise ValueError(f"all_to_all_single: {what} of {rows} rows in {n} equal splits")
        splits = [rows // n] * n
    if len(splits) != n or sum(splits) != rows:
        raise ValueError(f"all_to_all_single: {what}_split_sizes {list(splits)} must be {n} "
                         f"sizes adding up to the {what}'s {rows} rows")
    row = t.numel() // rows if rows else 0
    return [int(s) * row for s in splits]


def _one(tensors: list, what: str) -> Any:
    if len(tensors) != 1:
        raise ValueError(f"{what} takes one tensor, got {len(tensors)}")
    return tensors[0]


def _rendezvous_through(store: Any, rank: int, name: str) -> tuple[str, str]:
    """(job id, rendezvous address) of a group: made up by its rank 0 and published in the
    group's store (a PrefixStore of its own per group), read there by the others."""
    if rank == 0:
        host = os.environ.get("MASTER_ADDR") or "127.0.0.1"
        job = f"c10d-{name or 'group'}-{uuid.uuid4().hex[:12]}"
        address = f"tcp://{_host_for(host)}:{_free_port(host)}"
        store.set(_STORE_KEY, f"{job} {address}")
        return job, address
    job, address = store.get(_STORE_KEY).decode().split(" ", 1)
    return job, address


def _host_for(host: str) -> str:
    return f"[{host}]" if ":" in host and not host.startswith("[") else host


def _free_port(host: str) -> int:
    """A port free on this host now (the rendezvous binds it right after; another process
    taking it between the two is reported by the rendezvous as a failed bind)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as s:
        try:
            s.bind((host, 0))
        except OSError:   # MASTER_ADDR names another interface's address: any will do
            s.bind(("", 0))
        return s.getsockname()[1]


def _create(options: Any, backend_options: Any = None) -> GossipProcessGroup:
    """c10d's creator (extended API): one Peer per process group."""
    return GossipProcessGroup(options.store, options.group_rank, options.group_size,
                              options.timeout, str(options.group_id or ""))


def peer_of(process_group: dist.ProcessGroup | None, user: str) -> Any:
    """The gossip Peer behind ``process_group`` (the default group when None); a ValueError
    naming ``user`` when its backend is not "gossip"."""
    group = process_group if process_group is not None else dist.group.WORLD
    peer = getattr(group, "peer", None)
    if peer is None:
        raise ValueError(f"{user}: the process group is not a gossip one "
                         "(dist.init_process_group('gossip')): pass peer=gossip.init()")
    return peer


def register() -> None:
    """Make "gossip" a torch.distributed backend for CPU tensors (idempotent)."""
    if BACKEND_NAME.upper() not in dist.Backend._plugins:
        dist.Backend.register_backend(BACKEND_NAME, _create, extended_api=True,
                                      devices=["cpu"])


register()
