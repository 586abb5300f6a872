"""The pushes an asynchronous peer receives: each message checked and averaged, per bucket,
into what arrived since the training thread last folded it in (push-sum's sum of arrivals,
de-biased, so the fold is one pass whatever the number of messages)."""
from __future__ import annotations

import logging
import math
from typing import Any

from collectives.arrays import adapter_for
from gossip.errors import GossipError
from gossip.policies.base.failures import PEER_FAILURES

log = logging.getLogger("gossip")

__all__ = ["Arrivals"]


class Arrivals:
    """Per bucket, the weighted average A of the models received and their total weight W.
    Two sets of averages: the receiving thread adds into one while the training thread folds
    the other in, so neither waits for the other's pass over memory. A message is a model
    with its weight appended (one buffer per bucket, ``numel + 1`` elements); one source's
    messages arrive in order, bucket after bucket.

    ``absorbed_from[j]``: messages taken from source j (absorbed, or dropped as malformed),
    updated under ``cond``, which is notified after each."""

    def __init__(self, buckets: Any, *, rank: int, world_size: int,
                 cond: Any, locks: tuple[Any, Any]) -> None:
        nb = len(buckets)
        self._rank, self._n, self._cond = rank, world_size, cond
        self._next_bucket: dict[int, int] = {}   # source -> bucket of its next message
        self.absorbed_from = [0] * world_size
        self.absorbed = 0
        self._in = [b.new(extra=1) for b in buckets]    # the message being received
        self._avg = [[b.new(extra=1) for b in buckets] for _ in range(2)]
        self._count = [[0] * nb for _ in range(2)]
        # Summed in float64: a float32 sum of two weights would round, and the live peers'
        # weights would no longer add up to n.
        self._weight = [[0.0] * nb for _ in range(2)]
        self._fill = 0   # the set the receiver adds into
        # (The policy's host makes them: gossip/policies/base/concurrency.py.)
        self._lock, self._absorbing = locks   # _absorbing: one absorber at a time: a source's messages

    def renumber(self, rank: int, world_size: int) -> None:
        """(No receiver running, every arrival taken.) The ranks of a new view: the counts
        per source start again, as the senders' counts do; the buffers are kept."""
        self._rank, self._n = rank, world_size
        self._next_bucket = {}
        with self._cond:
            self.absorbed_from = [0] * world_size

    def drain(self, comm: Any, sources: list[int], timeout: float) -> None:
        """(Training thread.) Absorb what is waiting from ``sources``, unless the receiving
        thread is absorbing now: a push in this process is in the next fold even when that
        thread is starved of CPU. A source found lost is the receiving thread's to handle."""
        if not self._absorbing.acquire(blocking=False):
            return
        try:
            for src in sources:
                try:
                    self._absorb(comm, src, timeout)
                except PEER_FAILURES:
                    pass
        finally:
            self._absorbing.release()

    def absorb_from(self, comm: Any, src: int, timeout: float) -> None:
        """(Receiving thread.) Absorb every message waiting from ``src`` on ``comm``. A
        malformed one is dropped (logged) and serving goes on; PeerLost and OperationTimeout
        propagate to the caller's failure rule."""
        with self._absorbing:
            self._absorb(comm, src, timeout)

    def _absorb(self, comm: Any, src: int, timeout: float) -> None:
        while comm.probe(src):
            k = self._next_bucket.setdefault(src, 0)
            got = self._in[k]
            try:
                comm.recv(src, got, timeout=timeout)
            except PEER_FAILURES:
                raise
            except GossipError as exc:
                self._taken(src, k, f"bad message: {exc}")
                continue
            weight = float(got[-1])
            if not (math.isfinite(weight) and 0.0 < weight <= self._n):
                # Push-sum weights stay in (0, n]: anything else is not a push of ours, and
                # folding it in would divide by zero or flip the model's sign.
                self._taken(src, k, f"push-sum weight {weight!r} out of (0, n]")
                continue
            self._add(k, weight)
            self._taken(src, k)
            self.absorbed += 1

    def _taken(self, src: int, k: int, dropped_why: str | None = None) -> None:
        """One message from ``src`` (for bucket k) is dealt with: a dropped one counts too,
        so quiesce() does not wait for it."""
        if dropped_why is not None:
            log.warning("rank %d: asynchronous gossip: dropped a message from rank %d: %s",
                        self._rank, src, dropped_why)
        self._next_bucket[src] = (k + 1) % len(self._in)
        with self._cond:
            self.absorbed_from[src] += 1
            self._cond.notify_all()

    def _add(self, k: int, weight: float) -> None:
        """Average the message just received into _in[k], of push-sum weight ``weight``,
        into bucket k's arrivals."""
        with self._lock:
            s = self._fill
            if self._count[s][k] == 0:
                # The first arrival for this bucket: swap buffers instead of copying.
                self._avg[s][k], self._in[k] = self._in[k], self._avg[s][k]
                self._weight[s][k] = weight
            else:
                total = self._weight[s][k] + weight
                avg = self._avg[s][k][:-1]
                adapter_for(avg).lerp(avg, self._in[k][:-1], weight / total)
                self._weight[s][k] = total
            self._count[s][k] += 1

    def take(self) -> list[tuple[Any, float] | None]:
        """(Training thread.) What arrived since the last take, per bucket: (average model,
        total weight), or None where nothing did. The averages stay valid until the next
        take (the receiver adds into the other set meanwhile)."""
        with self._lock:
            s = self._fill
            counts = self._count[s]
            if not any(counts):
                return [None] * len(counts)
            self._fill = 1 - s
            self._count[s] = [0] * len(counts)
            weights, self._weight[s] = self._weight[s], [0.0] * len(counts)
            return [(self._avg[s][k][:-1], weights[k]) if counts[k] else None
                    for k in range(len(counts))]
