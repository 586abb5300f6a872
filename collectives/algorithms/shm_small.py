"""Small allreduces among peers on one host, without ZeroMQ (issue #18): each peer writes its
array into a slot of its own small arena (transport/shm_arena.py, mapped by the others once,
at the first such call, with one announcement over ZeroMQ) and every peer reduces all the
slots itself, in rank order, so the results are bitwise identical.

A slot starts with a header: the call's sequence number and a CRC of its signature, dtype
and shape. A peer that made another call sees it in the headers, so does every other: a
ProtocolError on every peer, naming the first that differs. The counter in each arena's
header says how far its owner got, in absolute terms of the communicator's sequence numbers
(2s + 1: slot written for call s; 2s + 2: done reading call s's slots), so a call that failed
half-way leaves nothing to resynchronise: a failing peer marks itself done reading anyway.
Waits are wait_counters' (shm_allreduce.py): yield, sleep, check the mailboxes for an abort
or a lost peer every millisecond, give up at the deadline.
"""
from __future__ import annotations

import time
import zlib
from typing import Any

import numpy as np

from collectives.algorithms.p2p import Call
from collectives.algorithms.shm_allreduce import (check_mailbox, count_shared,
                                                  exchange_arenas, wait_counters)
from collectives.arrays.adapter import ArrayAdapter
from collectives.errors import ProtocolError
from collectives.transport.shm_arena import HEADER_BYTES, ArenaViews, ShmArena, counter_of

__all__ = ["OnHostSmall", "SMALL_SHM_BYTES"]

#: The largest array this path takes (one slot per peer).
SMALL_SHM_BYTES = 64 << 10
_SLOT_HEADER = 64   # seq, signature CRC, byte count (int64 each), then padding


class OnHostSmall:
    """A communicator's small on-host allreduce: its slot and its mappings of the peers'."""

    def __init__(self, rank: int, order: Any) -> None:
        self.order = order   # choice.py's SequenceOrder: one call at a time, in order
        self.arena = ShmArena(rank, kind="small")
        self.views = ArenaViews(kind="small")
        self._arenas: dict[int, np.ndarray] | None = None   # after the first call's exchange
        self._counters: dict[int, np.ndarray] = {}          # their counters (views)
        self._last = -1    # the sequence number of the last call through here

    def __call__(self, call: Call, adapter: ArrayAdapter, flat: Any, op: str) -> None:
        with self.order.turn(call):
            self._run(call, adapter, flat, op)

    def _run(self, call: Call, adapter: ArrayAdapter, flat: Any, op: str) -> None:
        t = call.transport
        n, r, s = t.world_size, t.rank, call.seq
        others = [j for j in range(n) if j != r]
        if self._arenas is None:
            self._arenas, _ = exchange_arenas(call, others, self.arena, self.views,
                                              _SLOT_HEADER + SMALL_SHM_BYTES)
            self._counters = {j: counter_of(a) for j, a in self._arenas.items()}
        arenas, counters = self._arenas, self._counters
        count, size = adapter.size(flat), call.itemsize
        crc = zlib.crc32(f"{call.signature} {call.dtype} {call.shape}".encode())
        try:
            if self._last >= 0:   # everyone is done reading the last call's slots
                wait_counters(call, counters, {j: 2 * self._last + 2 for j in others},
                              "the end of the previous call")
            slot = arenas[r][HEADER_BYTES:]
            slot[:24].view(np.int64)[:] = (s, crc, count * size)
            adapter.copy(self._part(adapter, call, r, count), flat)
            counters[r][0] = 2 * s + 1
            for j in others:   # (each reads this peer's slot)
                count_shared(t, j, count * size)
            wait_counters(call, counters, {j: 2 * s + 1 for j in others}, "the call")
            for j in range(n):
                seq, theirs, nbytes = (int(v) for v in
                                       arenas[j][HEADER_BYTES:HEADER_BYTES + 24].view(np.int64))
                if (seq, theirs, nbytes) != (s, crc, count * size):
                    if seq != s:   # it marked itself done without writing: it failed
                        _await_abort(call, j)
                    raise ProtocolError(
                        f"rank {r}: called {call.describe()}, but rank {j} made another call "
                        f"at that sequence ({nbytes} bytes, signature CRC {theirs:08x} against "
                        f"{crc:08x}): the peers made different calls")
            reduce_op = "sum" if op == "mean" else op
            adapter.copy(flat, self._part(adapter, call, 0, count))
            for j in range(1, n):
                adapter.reduce(reduce_op, flat, self._part(adapter, call, j, count))
            if op == "mean":
                adapter.divide(flat, n)
        finally:
            counters[r][0] = 2 * s + 2   # done reading (or failed): the slots may change
            self._last = s

    def _part(self, adapter: ArrayAdapter, call: Call, j: int, count: int) -> Any:
        start = HEADER_BYTES + _SLOT_HEADER
        frame = self._arenas[j][start:start + count * call.itemsize]
        return adapter.from_frame(frame, call.frame_dtype, count)

    def close(self) -> None:
        self._arenas, self._counters = None, {}
        self.views.close()
        self.arena.close()


def _await_abort(call: Call, j: int, grace: float = 0.2) -> None:
    """Raise the abort rank ``j`` sent for this call (it failed before writing its slot), if
    it comes within ``grace`` seconds; else return."""
    deadline = time.monotonic() + grace
    while time.monotonic() < deadline:
        check_mailbox(call, [j])
        time.sleep(0.001)
