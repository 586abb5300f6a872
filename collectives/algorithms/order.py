"""Sequence order for operations that share state across calls (the shared-memory
allreduces): each waits its turn, the lowest sequence number reserved and not yet done."""
from __future__ import annotations

import contextlib
import threading
import time
from typing import Any, Iterator

from collectives.errors import OperationTimeout, PeerLost

__all__ = ["SequenceOrder"]


class SequenceOrder:
    """Reserved sequence numbers, run one at a time, lowest first."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._reserved: set[int] = set()

    def reserve(self, seq: int) -> None:
        """(When ``seq`` is taken, under the lock that takes it.)"""
        with self._cond:
            self._reserved.add(seq)

    @contextlib.contextmanager
    def turn(self, call: Any) -> Iterator[None]:
        """Wait until ``call.seq`` is the lowest reserved (OperationTimeout at the call's
        deadline, PeerLost once the transport closes), run the body, then hand over to the
        next, whatever the body raised."""
        seq, t = call.seq, call.transport
        with self._cond:
            self._reserved.add(seq)   # (a call made without reserve: runs in its turn too)
            while min(self._reserved) != seq:
                left = call.deadline - time.monotonic()
                if t.closed:
                    self._reserved.discard(seq)
                    self._cond.notify_all()
                    raise PeerLost(f"rank {t.rank}: {call.describe()}: this peer was closed",
                                   operation=call.describe())
                if left <= 0:
                    self._reserved.discard(seq)
                    self._cond.notify_all()
                    raise OperationTimeout(
                        f"rank {call.transport.rank}: {call.describe()}: shared-memory calls "
                        f"{sorted(s for s in self._reserved if s < seq)} of this peer, taken "
                        "before it, did not run within the timeout", operation=call.describe())
                self._cond.wait(min(left, 0.1))
        try:
            yield
        finally:
            with self._cond:
                self._reserved.discard(seq)
                self._cond.notify_all()
