"""Which allreduce algorithm a call runs: the user's choice, or "auto" by size and placement.
Every peer of a call must choose alike (they see the same size and, on one host, the same
shared-memory peers); one that does not meets a ProtocolError on every peer, never a wrong
sum, since the algorithm is part of the call's signature."""
from __future__ import annotations

from typing import Any, Callable

from collectives.algorithms.ring import ring_allreduce
from collectives.algorithms.shm_allreduce import OnHostAllreduce
from collectives.algorithms.small import recursive_doubling_allreduce

__all__ = ["allreduce_algorithm", "ALLREDUCE_ALGORITHMS"]

ALLREDUCE_ALGORITHMS = ("ring", "recursive-doubling", "shm")


def allreduce_algorithm(name: str, dtype: str, nbytes: int, small_bytes: int,
                        on_host: OnHostAllreduce, transport: Any,
                        adapter: Any) -> tuple[str, Callable]:
    """(name, algorithm(call, adapter, flat, op)) for ``name`` ("auto": recursive doubling up
    to ``small_bytes``, shared memory when every peer is on this host (OnHostAllreduce.usable),
    else the ring); ValueError for an unknown name or "shm" where it cannot run."""
    if name == "auto":
        if nbytes <= small_bytes:
            name = "recursive-doubling"
        else:
            name = ("shm" if on_host.usable(transport, adapter, nbytes)
                    and on_host.fits(dtype, nbytes) else "ring")
    if name not in ALLREDUCE_ALGORITHMS:
        raise ValueError(f"unknown allreduce algorithm {name!r}; use 'auto', "
                         + ", ".join(f"'{a}'" for a in ALLREDUCE_ALGORITHMS))
    if name == "shm":
        if not (on_host.usable(transport, adapter, 1 << 62) and on_host.fits(dtype, nbytes)):
            raise ValueError("allreduce algorithm 'shm' needs every peer on this host with "
                             "shared memory, and an array in host memory of a numpy dtype "
                             "and at least 32 bytes")
        return name, on_host
    return name, ring_allreduce if name == "ring" else recursive_doubling_allreduce
