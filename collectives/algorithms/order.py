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

    def release(self, seq: int) -> None:
        """Give up reserved ``seq`` without running it (the call went another way)."""
        with self._cond:
            self._reserved.discard(seq)
            self._cond.notify_all()

    def wait_before(self, seq: int, deadline: float, transport: Any, what: str) -> None:
        """Return once every call reserved before ``seq`` is done (OperationTimeout at
        ``deadline``; PeerLost once the transport closes), without taking a turn; ``what``:
        the waiting call, as errors name it."""
        with self._cond:
            while any(s < seq for s in self._reserved):
                left = deadline - time.monotonic()
                self._check(seq, left, transport, what)
                self._cond.wait(min(left, 0.1))

    def _check(self, seq: int, left: float, t: Any, what: str) -> None:
        if t.closed:
            raise PeerLost(f"rank {t.rank}: {what}: this peer was closed", operation=what)
        if left <= 0:
            raise OperationTimeout(
                f"rank {t.rank}: {what}: shared-memory calls "
                f"{sorted(s for s in self._reserved if s < seq)} of this peer, taken "
                "before it, did not run within the timeout", operation=what)

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
                try:
                    self._check(seq, left, t, call.describe())
                except (PeerLost, OperationTimeout):
                    self._reserved.discard(seq)
                    self._cond.notify_all()
                    raise
                self._cond.wait(min(left, 0.1))
        try:
            yield
        finally:
            with self._cond:
                self._reserved.discard(seq)
                self._cond.notify_all()
