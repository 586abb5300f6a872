"""Quiescence of push gossip among the live peers: how many pushes each live peer must still
absorb before no mass is in flight. Each peer tells every other live peer how many pushes it
sent it (point to point), so a dead peer stops nothing, where an allreduce of the counts would
fail on it. The counts travel on a communicator of their own (``comm``, a ``peer.channel()``),
never the peer's: a user's own ``peer.send`` still outstanding there would meet them."""
from __future__ import annotations

from typing import Any, Callable

import numpy as np

from gossip.errors import PeerLost

__all__ = ["Quiescence", "pushes_to_absorb"]


def pushes_to_absorb(peer: Any, comm: Any, sent_to: list[int], timeout: float,
                     on_lost: Callable[[str, PeerLost, int], None],
                     partners: list[int] | None = None) -> dict[int, int]:
    """Every live peer j (not in peer.lost_peers()) -> the pushes j sent to this peer, given
    ``sent_to`` (this peer's pushes per destination), exchanged over ``comm``. A collective of
    the live peers, or of ``partners`` (ranks; a view change: the members that go on in the
    next view, which each name the same set). A peer
    lost meanwhile is left out and handed to ``on_lost(what, error, rank)``; a live one too
    slow to answer raises OperationTimeout, as any collective."""
    if partners is None:
        lost = peer.lost_peers()
        live = [j for j in range(peer.world_size) if j != peer.rank and j not in lost]
    else:
        live = [j for j in partners if j != peer.rank]
    for j in live:   # all sends first: no peer waits for another's receive
        try:
            comm.send(j, np.array([sent_to[j]], dtype=np.int64), timeout=timeout)
        except PeerLost as exc:
            on_lost(f"quiesce: count to rank {j}", exc, j)
    expected: dict[int, int] = {}
    for j in live:
        try:
            expected[j] = int(comm.recv(j, np.zeros(1, dtype=np.int64), timeout=timeout)[0])
        except PeerLost as exc:
            on_lost(f"quiesce: count from rank {j}", exc, j)
    return expected


class Quiescence:
    """Asynchronous's quiesce() and resume() (a mixin: the policy's push state, its
    arrivals and its fold)."""

    def quiesce(self, timeout: float | None = None) -> None:
        """Stop pushing until every push a live peer made to this one is absorbed (the weights
        then add up to n, less what the dead held): a collective of the live peers
        (pushes_to_absorb: a dead peer does not stop it). ``resume()`` undoes it."""
        self._check_ready()
        timeout = self.timeout if timeout is None else timeout
        self._paused = True
        with self._cond:        # a push in progress completes first
            self._wait_locked(lambda: self._job is None, timeout, 0.5,
                              lambda: ("quiesce: the push in progress did not finish",
                                       "asynchronous quiesce"))
            sent = list(self._sent_to)
        expected = pushes_to_absorb(self._peer, self._counts, sent, timeout,
                                    self._exchange_failed)
        absorbed = self._arrivals.absorbed_from
        with self._cond:
            self._wait_locked(
                lambda: all(absorbed[j] >= count for j, count in expected.items()),
                timeout, 0.5,
                lambda: (f"quiesce: absorbed {[absorbed[j] for j in expected]} of the "
                         f"{list(expected.values())} messages ranks {list(expected)} pushed "
                         "to it", "asynchronous quiesce"))
        # Fold the absorbed mass into the parameters (no move since the last step).
        self._buckets.copy_in()
        self._fold_in(moved=False)
        self._buckets.copy_out()
        if self._anchor is not None:
            self._keep_anchor()

    def resume(self) -> None:
        """Push again after quiesce()."""
        self._check_ready()
        self._paused = False
