"""The threads, locks and clock a background policy works with, from its host: on a real peer
the standard library's (``REAL_CONCURRENCY``), on a simulated one the simulator's virtual
threads, which run one at a time in virtual-time order (gossip/simulation/scheduler.py), so the
same policy code gives the same result on every run.

A policy makes every thread, lock, condition and event it shares with its threads through
``Concurrency`` and reads the time through ``monotonic()``; it never blocks on anything else
(a wait on a primitive of the ``threading`` module would hold a simulated peer's turn for
ever)."""
from __future__ import annotations

import threading
import time
from typing import Any, Callable, Protocol

__all__ = ["Concurrency", "ThreadHandle", "REAL_CONCURRENCY", "ThreadKilled"]


class ThreadKilled(BaseException):
    """Raised in a policy's thread when the host ends it as its process dies (a simulated
    peer's death): the thread unwinds and ends quietly, as a killed process's threads stop,
    without being reported as failed."""


class ThreadHandle(Protocol):
    """What a policy does with a thread it started."""

    name: str

    def start(self) -> None: ...

    def join(self, timeout: float | None = None) -> None: ...

    def is_alive(self) -> bool: ...


class Concurrency:
    """The standard library's threads, locks and monotonic clock."""

    def thread(self, target: Callable[..., None], name: str, args: tuple = ()) -> ThreadHandle:
        """A daemon thread running ``target(*args)``, not started."""
        return threading.Thread(target=target, args=args, name=name, daemon=True)

    def lock(self) -> Any:
        return threading.Lock()

    def condition(self, lock: Any = None) -> Any:
        return threading.Condition(lock)

    def event(self) -> Any:
        return threading.Event()

    def monotonic(self) -> float:
        """Seconds, for deadlines and for measuring how long something took."""
        return time.monotonic()


#: What a real peer's policies use.
REAL_CONCURRENCY = Concurrency()
