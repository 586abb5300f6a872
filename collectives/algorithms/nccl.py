"""NCCL through cupy, for peers that each have their own GPU: allreduce, broadcast and
allgather of device arrays go through an NCCL communicator instead of the staged ring.

The communicator's unique id is made by rank 0 and handed to every peer with the project's own
broadcast (over the rendezvous-established transport, encrypted if a cluster key is set); no
MPI, no extra port. Whether NCCL is used is decided collectively the first time a device array
shows up: every peer must have cupy's NCCL bindings and its own GPU (no two peers on one host
sharing a device), or all of them use the staged ring, so peers never disagree on the path.
torch CUDA tensors are passed by pointer (their memory is used in place, no copy).
"""
from __future__ import annotations

import logging
import os
from typing import Any, Protocol

import numpy as np

from collectives.arrays.interface import Array

__all__ = ["NcclGroup", "HostCollectives", "nccl_available"]

log = logging.getLogger("collectives")

_OPS = ("sum", "prod", "max", "min")


def nccl_available() -> bool:
    """cupy's NCCL bindings import, and GOSSIP_NCCL is not "0" (the switch to force the staged
    ring, e.g. to compare the two)."""
    if os.environ.get("GOSSIP_NCCL", "") == "0":
        return False
    try:
        import cupy.cuda.nccl as nccl
    except Exception:
        return False
    return nccl is not None


def _nccl_dtype(nccl, name: str):
    table = {"int8": nccl.NCCL_INT8, "uint8": nccl.NCCL_UINT8, "int32": nccl.NCCL_INT32,
             "uint32": nccl.NCCL_UINT32, "int64": nccl.NCCL_INT64, "uint64": nccl.NCCL_UINT64,
             "float16": nccl.NCCL_FLOAT16, "float32": nccl.NCCL_FLOAT32,
             "float64": nccl.NCCL_FLOAT64}
    if hasattr(nccl, "NCCL_BFLOAT16"):
        table["bfloat16"] = nccl.NCCL_BFLOAT16
    return table.get(name)


def _pointer_and_stream(x: Any) -> tuple[int, int]:
    """Device pointer and the current stream of a cupy array or torch CUDA tensor."""
    if hasattr(x, "data_ptr"):  # torch
        import torch
        return x.data_ptr(), torch.cuda.current_stream(x.device).cuda_stream
    import cupy
    return x.data.ptr, cupy.cuda.get_current_stream().ptr


class HostCollectives(Protocol):
    """What an NcclGroup asks of the communicator it serves (a Communicator): its place in
    the group and the host collectives that decide on NCCL and hand out its unique id."""

    @property
    def rank(self) -> int:
        """This peer's rank."""
        ...

    @property
    def world_size(self) -> int:
        """The number of peers."""
        ...

    def allreduce(self, x: Array, op: str = "sum") -> Array:
        """Reduce ``x`` over every peer, in place."""
        ...

    def allgather(self, x: Array) -> Array:
        """Every peer's ``x``, stacked in rank order."""
        ...

    def broadcast(self, x: Array, root: int = 0) -> Array:
        """``root``'s ``x`` into every peer's, in place."""
        ...


class NcclGroup:
    """One NCCL communicator over all peers, created lazily and collectively."""

    def __init__(self, comm: HostCollectives) -> None:
        self._comm = comm  # the Communicator, for the id broadcast and the collective decision
        # cupy's NcclCommunicator (cupy has no type information), made by decide()
        self._nccl_comm: Any | None = None
        self.enabled: bool | None = None  # decided on first use, identically on every peer

    def decide(self, device_id: int, host: str) -> bool:
        """Whether NCCL is used, decided collectively on the first call (every peer makes it then):
        every peer needs the bindings and a GPU of its own, (``host``, ``device_id``). If so it
        creates the communicator; later calls return the decision."""
        if self.enabled is not None:
            return self.enabled
        ok = np.array([1 if nccl_available() else 0], dtype=np.int64)
        self._comm.allreduce(ok, op="min")
        if ok[0]:
            # Every (host, device) pair must be distinct: NCCL refuses two ranks on one GPU.
            key = np.frombuffer(f"{host}#{device_id}".encode()[:64].ljust(64, b"\0"),
                                dtype=np.uint8).copy()
            keys = self._comm.allgather(key)
            ok[0] = len({bytes(k) for k in keys}) == len(keys)
        self.enabled = bool(ok[0])
        if self.enabled:
            from cupy.cuda import nccl
            uid = np.zeros(128, dtype=np.int8)
            if self._comm.rank == 0:
                uid[:] = np.array(nccl.get_unique_id(), dtype=np.int8)
            self._comm.broadcast(uid, root=0)
            self._nccl_comm = nccl.NcclCommunicator(self._comm.world_size,
                                                    tuple(int(v) for v in uid), self._comm.rank)
            log.info("rank %d: NCCL communicator ready", self._comm.rank)
        return self.enabled

    def supports(self, op: str | None, dtype: str) -> bool:
        """True when NCCL takes ``dtype`` with ``op`` (None: no reduction; "mean" is a sum the
        caller divides)."""
        from cupy.cuda import nccl
        return _nccl_dtype(nccl, dtype) is not None and (op is None or op in _OPS or op == "mean")

    def _communicator(self) -> Any:
        """The NCCL communicator; RuntimeError before decide() enabled NCCL."""
        if self._nccl_comm is None:
            raise RuntimeError("NCCL is not enabled for this group: decide() did not make a "
                               "communicator")
        return self._nccl_comm

    def allreduce(self, flat: Any, count: int, dtype: str, op: str) -> None:
        """Reduce the ``count`` elements of ``flat`` in place, enqueued on its current stream;
        "mean" only sums (the caller divides)."""
        from cupy.cuda import nccl
        ops = {"sum": nccl.NCCL_SUM, "mean": nccl.NCCL_SUM, "prod": nccl.NCCL_PROD,
               "max": nccl.NCCL_MAX, "min": nccl.NCCL_MIN}
        ptr, stream = _pointer_and_stream(flat)
        self._communicator().allReduce(ptr, ptr, count, _nccl_dtype(nccl, dtype), ops[op], stream)

    def broadcast(self, flat: Any, count: int, dtype: str, root: int) -> None:
        """Copy root's ``flat`` into every peer's in place, enqueued on its current stream."""
        from cupy.cuda import nccl
        ptr, stream = _pointer_and_stream(flat)
        self._communicator().bcast(ptr, count, _nccl_dtype(nccl, dtype), root, stream)

    def allgather(self, flat: Any, out: Any, count: int, dtype: str) -> None:
        """Gather every peer's ``count`` elements of ``flat`` into ``out`` (n * count, in rank
        order), enqueued on the current stream."""
        from cupy.cuda import nccl
        ptr, stream = _pointer_and_stream(flat)
        out_ptr, _ = _pointer_and_stream(out)
        self._communicator().allGather(ptr, out_ptr, count, _nccl_dtype(nccl, dtype), stream)

    def close(self) -> None:
        """Destroy the communicator if one was made; best effort, so closing a peer never fails
        here."""
        if self._nccl_comm is not None:
            try:
                self._nccl_comm.destroy()
            except Exception:
                pass
            self._nccl_comm = None
