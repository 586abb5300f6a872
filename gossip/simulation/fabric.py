"""The in-process network of a simulation: what the peers of one process send each other, and
the virtual clock each of them keeps.

Data moves at once, in memory; time does not. Each peer has a clock (seconds of simulated
time). A message leaves at its sender's clock, waits for its directed link to be free, and
arrives ``latency + bytes / rate`` later (that link's: links.py); the receiver's clock moves to the arrival if that is
later. A collective starts when its last member arrives (the latest clock) and ends after the
algorithm's cost on the link model (the ring allreduce's 2(n - 1) steps of bytes / n, ...);
every member's clock moves to the end. Results are combined in rank order, so a simulation
gives the same numbers whatever order its threads run in.
"""
from __future__ import annotations

import math
import threading
from collections import deque
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from collectives.communicator import DEFAULT_SMALL_BYTES
from collectives.transport.emulation import LinkSpec
from gossip.errors import OperationTimeout
from gossip.simulation.links import Links

__all__ = ["Fabric", "collective_seconds"]


def collective_seconds(op: str, nbytes: int, size: int, link: LinkSpec | None) -> float:
    """Simulated seconds of collective ``op`` over ``size`` peers on ``nbytes`` per peer when
    every link is ``link``, by the algorithm the collectives run: allreduce by recursive
    doubling below DEFAULT_SMALL_BYTES (ceil(log2 n) steps of nbytes), as a ring above (2(n-1)
    steps of nbytes/n); allgather as a ring (n-1 steps of nbytes); broadcast as a binomial tree
    (ceil(log2 n) steps of nbytes); barrier as ceil(log2 n) latencies. 0 without a link model
    or for one peer. (Links.collective_seconds: the same over links that differ.)"""
    if link is None or size <= 1:
        return 0.0
    return Links.uniform(size, link).collective_seconds(op, nbytes)


class _Round:
    __slots__ = ("parts", "clocks", "result", "end", "taken")

    def __init__(self) -> None:
        self.parts: dict[int, Any] = {}
        self.clocks: dict[int, float] = {}
        self.result: Any = None
        self.end: float | None = None
        self.taken = 0


class Fabric:
    """``size`` peers' mailboxes, collectives and clocks (one lock; waits bounded by
    ``timeout`` real seconds, then OperationTimeout naming the peers waited for). ``links``:
    every directed link (links.py), or one LinkSpec for all, or None (free)."""

    def __init__(self, size: int, links: Links | LinkSpec | None = None, *,
                 timeout: float = 300.0) -> None:
        self.size = size
        self.links = links if isinstance(links, Links) else Links.uniform(size, links)
        self.timeout = timeout
        self.clock = [0.0] * size
        self.bytes_sent = [0] * size
        self.messages_sent = [0] * size
        self._cond = threading.Condition()
        self._mail: dict[tuple[int, int], deque[tuple[np.ndarray, float]]] = {}
        self._link_free: dict[tuple[int, int], float] = {}
        self._rounds: dict[tuple[str, int], _Round] = {}
        self._seq: list[dict[str, int]] = [{} for _ in range(size)]
        self._aborted: str | None = None

    def abort(self, reason: str) -> None:
        """End every wait now and every later one at once, with ``reason`` (a peer failed: the
        others would wait for it until their timeout)."""
        with self._cond:
            self._aborted = reason
            self._cond.notify_all()

    def _check(self) -> None:
        if self._aborted is not None:
            raise RuntimeError(f"simulation stopped: {self._aborted}")

    def advance(self, rank: int, seconds: float) -> None:
        """``rank`` computes for ``seconds`` of simulated time."""
        with self._cond:
            self.clock[rank] += seconds

    def send(self, src: int, dst: int, data: np.ndarray) -> None:
        """Post a copy of ``data`` from ``src`` to ``dst`` (never blocks)."""
        copy = np.array(data, copy=True)
        with self._cond:
            start = max(self.clock[src], self._link_free.get((src, dst), 0.0))
            rate, latency = self.links.link(src, dst)
            transfer = copy.nbytes / rate
            self._link_free[(src, dst)] = start + transfer
            self._mail.setdefault((src, dst), deque()).append((copy, start + transfer + latency))
            self.bytes_sent[src] += copy.nbytes
            self.messages_sent[src] += 1
            self._cond.notify_all()

    def recv(self, dst: int, src: int, what: str) -> np.ndarray:
        """The next message from ``src`` to ``dst``; ``dst``'s clock moves to its arrival."""
        with self._cond:
            box = self._mail.setdefault((src, dst), deque())
            if not self._cond.wait_for(lambda: bool(box) or self._aborted is not None,
                                       self.timeout):
                raise OperationTimeout(f"simulated rank {dst}: no message from rank {src} for "
                                       f"{what} within {self.timeout:g}s (real time)")
            self._check()
            data, arrival = box.popleft()
            self.clock[dst] = max(self.clock[dst], arrival)
            return data

    def collective(self, rank: int, op: str, part: Any, nbytes: int,
                   combine: Callable[[Sequence[Any]], Any]) -> Any:
        """Every peer's ``part`` of this ``op`` (the peers' k-th calls of it meet), combined
        once in rank order by ``combine``; every member's clock moves to the latest arrival
        plus the op's cost (collective_seconds)."""
        with self._cond:
            self._check()
            seq = self._seq[rank].get(op, 0)
            self._seq[rank][op] = seq + 1
            key = (op, seq)
            meeting = self._rounds.setdefault(key, _Round())
            meeting.parts[rank] = part
            meeting.clocks[rank] = self.clock[rank]
            if len(meeting.parts) == self.size:
                meeting.result = combine([meeting.parts[r] for r in range(self.size)])
                meeting.end = max(meeting.clocks.values()) + self.links.collective_seconds(
                    op, nbytes)
                self._cond.notify_all()
            elif not self._cond.wait_for(
                    lambda: meeting.end is not None or self._aborted is not None, self.timeout):
                missing = sorted(set(range(self.size)) - set(meeting.parts))
                raise OperationTimeout(f"simulated rank {rank}: {op} #{seq} still waits for "
                                       f"ranks {missing[:8]} after {self.timeout:g}s (real time)")
            if meeting.end is None:
                self._check()
            assert meeting.end is not None
            self.clock[rank] = meeting.end
            self.bytes_sent[rank] += _collective_bytes(op, nbytes, self.size)
            self.messages_sent[rank] += 1
            meeting.taken += 1
            if meeting.taken == self.size:
                del self._rounds[key]
            return meeting.result


def _collective_bytes(op: str, nbytes: int, size: int) -> int:
    """Bytes one peer sends in ``op`` under collective_seconds' algorithms."""
    if size <= 1:
        return 0
    if op == "allreduce" and nbytes < DEFAULT_SMALL_BYTES:
        return math.ceil(math.log2(size)) * nbytes
    if op == "allreduce":
        return 2 * (size - 1) * nbytes // size
    if op == "allgather":
        return (size - 1) * nbytes
    if op == "broadcast":
        return nbytes
    return 0
