"""Small allreduces among peers on one host, without ZeroMQ (issue #18): each peer writes its
array into the slot of its small arena (shm_entry.py: entered and left through counters in
shared memory, the calls compared by their slot headers) and every peer reduces all the
slots itself, in rank order, so the results are bitwise identical."""
from __future__ import annotations

from typing import Any

from collectives.algorithms.p2p import Call
from collectives.algorithms.shm_entry import SharedEntry, count_shared
from collectives.arrays.adapter import ArrayAdapter

__all__ = ["OnHostSmall", "SMALL_SHM_BYTES"]

#: The largest array this path takes (one slot per peer).
SMALL_SHM_BYTES = 64 << 10


class OnHostSmall:
    """A communicator's small on-host allreduce, through its SharedEntry's slots."""

    def __init__(self, entry: SharedEntry, order: Any) -> None:
        self.entry = entry
        self.order = order   # choice.py's SequenceOrder: one call at a time, in order

    def __call__(self, call: Call, adapter: ArrayAdapter, flat: Any, op: str) -> None:
        with self.order.turn(call):
            try:
                self._run(call, adapter, flat, op)
            finally:
                self.entry.leave(call)

    def _run(self, call: Call, adapter: ArrayAdapter, flat: Any, op: str) -> None:
        t = call.transport
        n, r = t.world_size, t.rank
        count = adapter.size(flat)
        nbytes = count * call.itemsize
        entry = self.entry
        entry.ready(call)   # (the first such call maps the peers' slots: enter's first step)
        parts = entry.parts(adapter, call, count)

        def write() -> None:
            adapter.copy(parts[r], flat)
            for j in range(n):   # (each other reads this peer's slot)
                if j != r:
                    count_shared(t, j, nbytes)
        entry.enter(call, nbytes, write=write, keep=False)
        reduce_op = "sum" if op == "mean" else op
        adapter.copy(flat, parts[0])
        for j in range(1, n):
            adapter.reduce(reduce_op, flat, parts[j])
        if op == "mean":
            adapter.divide(flat, n)
