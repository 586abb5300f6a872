"""A list of arrays reduced in one call (torch's all_reduce_coalesced, Horovod's
grouped_allreduce): the arrays are packed into one flat buffer, reduced by one allreduce
(one latency and one agreement check for all of them instead of one per array), and
unpacked back into each array, in place. Shapes may differ; arrays of several dtypes (or
families: numpy, torch) are packed per dtype, one allreduce each, in the order each dtype
first appears in the list. With a codec the packed buffer is encoded as one array (its blocks
may span two of the arrays). A non-blocking call unpacks on the communicator's worker thread
right after the allreduces, so its Work is done only once every array holds its result."""
from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Callable

from collectives.algorithms.ring import counts_digest
from collectives.arrays.adapter import adapter_for
from collectives.engine import Engine
from collectives.staging import contiguous_flat

__all__ = ["coalesced_allreduce"]


class _Pack:
    """The arrays of one family and dtype, packed into one flat buffer."""

    def __init__(self, parts: list[tuple[Any, Any, Any]]) -> None:
        self.parts = parts   # (array, its contiguous stand-in or None, flat view)
        self.adapter = adapter_for(parts[0][2])
        adapter = self.adapter
        self.sizes = [adapter.size(flat) for _, _, flat in parts]
        self.buffer = adapter.empty(sum(self.sizes), adapter.dtype_name(parts[0][2]),
                                    parts[0][2])
        self.bounds = [0]
        for (_, _, flat), size in zip(parts, self.sizes):
            adapter.copy(adapter.slice(self.buffer, self.bounds[-1], self.bounds[-1] + size),
                         flat)
            self.bounds.append(self.bounds[-1] + size)

    def unpack(self) -> None:
        adapter, packed = self.adapter, self.buffer
        for (a, stand_in, flat), lo, hi in zip(self.parts, self.bounds, self.bounds[1:]):
            if stand_in is None:
                adapter.copy(flat, adapter.slice(packed, lo, hi))
            else:
                adapter.write_back(a, adapter.slice(packed, lo, hi).reshape(tuple(a.shape)))
        adapter.synchronize()


def coalesced_allreduce(engine: Engine, allreduce: Callable[..., Any], arrays: Sequence[Any],
                        op: str, *, wait: bool, timeout: float | None, algorithm: str,
                        compression: Any = None) -> Any:
    """Reduce every array of ``arrays`` across peers, in place, by one ``allreduce`` (the
    communicator's) of their packed copy per dtype; returns ``arrays`` (or a Work whose
    result it is)."""
    given, arrays = arrays, list(arrays)
    if not arrays:
        raise ValueError(f"rank {engine.rank}: allreduce of an empty list of arrays")
    groups: dict[tuple[str, str], list[tuple[Any, Any, Any]]] = {}
    for a in arrays:
        stand_in, adapter, flat, dtype = contiguous_flat(a)
        groups.setdefault((adapter.kind, dtype), []).append((a, stand_in, flat))
    packs = [_Pack(parts) for parts in groups.values()]

    def unpack() -> Sequence[Any]:
        for pack in packs:
            pack.unpack()
        return given

    # The sizes are part of each call's signature: peers whose lists differ but add up to
    # the same total would otherwise reduce each other's arrays into the wrong ones (and a
    # dtype's place in the list is its call's, so lists in another order fail as well).
    works = [allreduce(pack.buffer, op, wait=wait, timeout=timeout, algorithm=algorithm,
                       compression=compression, _layout=f",arrays={counts_digest(pack.sizes)}")
             for pack in packs]
    if wait:
        return unpack()

    def after() -> Sequence[Any]:
        for work in works:
            work.wait()
        return unpack()
    return engine.launch(f"allreduce of {len(arrays)} arrays", after, False)
