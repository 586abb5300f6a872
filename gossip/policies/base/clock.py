"""Where a policy's wall time goes: inside its calls (``comm_seconds``: the communication the
training loop waits for) and between them (``compute_seconds``: the loop's own work)."""
from __future__ import annotations

import contextlib
import time
from typing import Iterator

__all__ = ["PolicyClock"]


class PolicyClock:
    """Wall time inside and between a policy's calls (time.perf_counter)."""

    def __init__(self) -> None:
        self.comm_seconds = 0.0
        self.compute_seconds = 0.0
        self._last_exit: float | None = None

    @contextlib.contextmanager
    def inside(self) -> Iterator[None]:
        """Time the block as the policy's; the time since the last block was the loop's."""
        start = time.perf_counter()
        if self._last_exit is not None:
            self.compute_seconds += start - self._last_exit
        try:
            yield
        finally:
            self._last_exit = time.perf_counter()
            self.comm_seconds += self._last_exit - start
