"""A list of arrays reduced in one call (torch's all_reduce_coalesced, Horovod's
grouped_allreduce): the arrays are packed into one flat buffer, reduced by one allreduce
(one latency and one agreement check for all of them instead of one per array), and
unpacked back into each array, in place. The arrays must share the family and dtype;
shapes may differ. A non-blocking call unpacks on the communicator's worker thread right
after the allreduce, so its Work is done only once every array holds its result."""
from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Callable

from collectives.algorithms.ring import counts_digest
from collectives.arrays.adapter import adapter_for
from collectives.engine import Engine
from collectives.staging import contiguous_flat

__all__ = ["coalesced_allreduce"]


def coalesced_allreduce(engine: Engine, allreduce: Callable[..., Any], arrays: Sequence[Any],
                        op: str, *, wait: bool, timeout: float | None, algorithm: str) -> Any:
    """Reduce every array of ``arrays`` across peers, in place, by one ``allreduce`` (the
    communicator's) of their packed copy; returns ``arrays`` (or a Work whose result it
    is)."""
    given, arrays = arrays, list(arrays)
    if not arrays:
        raise ValueError(f"rank {engine.rank}: allreduce of an empty list of arrays")
    parts = []   # (array, its contiguous stand-in or None, flat view, dtype)
    for a in arrays:
        stand_in, other, flat, dtype = contiguous_flat(a)
        parts.append((a, stand_in, flat, dtype))
        if other.kind != adapter_for(arrays[0]).kind or dtype != parts[0][3]:
            raise TypeError(f"rank {engine.rank}: a coalesced allreduce takes arrays of one "
                            f"family and dtype: {adapter_for(arrays[0]).kind} {parts[0][3]} "
                            f"and {other.kind} {dtype}")
    adapter = adapter_for(parts[0][2])
    sizes = [adapter.size(flat) for _, _, flat, _ in parts]
    packed = adapter.empty(sum(sizes), parts[0][3], parts[0][2])
    bounds = [0]
    for (_, _, flat, _), size in zip(parts, sizes):
        adapter.copy(adapter.slice(packed, bounds[-1], bounds[-1] + size), flat)
        bounds.append(bounds[-1] + size)

    def unpack() -> Sequence[Any]:
        for (a, stand_in, flat, _), lo, hi in zip(parts, bounds, bounds[1:]):
            if stand_in is None:
                adapter.copy(flat, adapter.slice(packed, lo, hi))
            else:
                adapter.write_back(a, adapter.slice(packed, lo, hi).reshape(tuple(a.shape)))
        adapter.synchronize()
        return given

    # The sizes are part of the call's signature: peers whose lists differ but add up to
    # the same total would otherwise reduce each other's arrays into the wrong ones.
    work = allreduce(packed, op, wait=wait, timeout=timeout, algorithm=algorithm,
                     _layout=f",arrays={counts_digest(sizes)}")
    if wait:
        return unpack()

    def after() -> Sequence[Any]:
        work.wait()
        return unpack()
    return engine.launch(f"allreduce of {len(arrays)} arrays", after, False)
