"""What an operator sees at the default log level: the group's events and the waits that last.

``events`` is the logger "gossip.events": one line per peer death (who noticed it, which rank,
why), heal, join, leave and view change, at INFO, and one line at WARNING for every wait that
outlasts ``defaults.LONG_WAIT``. Unlike the package loggers ("gossip", "collectives"), which
stay silent until the application or GOSSIP_LOG_LEVEL configures them, gossip sends it to
stderr when nothing else is configured (gossip/logs.py). Both layers log to it (collectives
names the logger, not the gossip package: nothing is imported).

``LongWait`` is the one way a wait says what it waits for: made as the wait starts (or lazily,
with the wait's start), ``check()`` in the wait's loop (a float comparison until it is due)
logs once, past ``defaults.LONG_WAIT``, the wait's description (the ranks or the address it
waits on, the operation and its sequence) and how much of its timeout it spent::

    notice = LongWait(lambda: f"rank {r}: allreduce ... at sequence 7: waiting on rank 3",
                      start, deadline)
    while not ready():
        notice.check()
        sleep_until(notice.until(next_look))
"""
from __future__ import annotations

import logging
import math
import time
from typing import Callable

from collectives import defaults

__all__ = ["EVENTS_LOGGER", "events", "LongWait"]

#: The name of the events logger (gossip/logs.py gives it a stderr handler by default).
EVENTS_LOGGER = "gossip.events"
events = logging.getLogger(EVENTS_LOGGER)


class LongWait:
    """The notice of one wait that began at ``start`` (monotonic seconds) and may last until
    ``deadline``: ``check()`` logs ``what`` (a string, or a callable worded only when due) once
    at WARNING on the events logger, the first time it is called ``after`` seconds past
    ``start`` or later (defaults.LONG_WAIT), with how long it waited and how much of
    ``timeout`` (the operation's, which may have begun before this wait; default: the wait's
    own, ``deadline - start``) is spent."""

    __slots__ = ("due", "_start", "_deadline", "_timeout", "_what")

    def __init__(self, what: str | Callable[[], str], start: float, deadline: float, *,
                 timeout: float | None = None, after: float = defaults.LONG_WAIT) -> None:
        self._what = what
        self._start = start
        self._deadline = deadline
        self._timeout = deadline - start if timeout is None else timeout
        #: When the notice is due (infinity once said, or for a wait that ends before).
        self.due = start + after if deadline > start + after else math.inf

    def until(self, moment: float) -> float:
        """The earlier of ``moment`` and the notice's due time: what a wait that sleeps until
        ``moment`` sleeps until instead, so it can check() on time."""
        return moment if moment < self.due else self.due

    def check(self, now: float | None = None) -> bool:
        """Log the notice if it is due and not said yet; True if it was said now."""
        if now is None:
            now = time.monotonic()
        if now < self.due:
            return False
        self.due = math.inf
        what = self._what() if callable(self._what) else self._what
        spent = self._timeout - (self._deadline - now)
        events.warning("%s: still waiting after %.1f s (%.1f s of its %.3g s timeout spent)",
                       what, now - self._start, spent, self._timeout)
        return True
