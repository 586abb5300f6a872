"""A log that a flood cannot turn into one line per event: events of one kind are logged one by
one up to MAX_LOGGED_DROPS, then as one summary line per DROP_SUMMARY_INTERVAL at most, with
the count by reason so far and the latest event; the owner's loop ticks it, so a burst's last
events are summarised even when nothing follows them. Dropped messages (DropLog, below),
refused handshakes (refusals.py) and cut connections (offenders.py) log through it.

Dropped messages: a receiver never raises on a bad message (a malformed frame, a foreign
sender, a replay, a message for a finished operation): it drops it, counts it in its DropLog,
and keeps serving. Every message that arrives is either dropped (counted there) or received
(counted per peer), never both, so the two add up to what arrived.
"""
from __future__ import annotations

import logging
import time

from collectives import defaults
from collectives.transport.wire import Header

__all__ = ["ThrottledLog", "DropLog"]

log = logging.getLogger("collectives")


class ThrottledLog:
    """Counts events by reason and logs them, one by one and then in summaries. ``what`` names
    one event in the log ("dropped a message"), ``many`` starts a summary line
    ("dropped messages:", then "N more in 10s"). A summary is due DROP_SUMMARY_INTERVAL after
    the last line: the next event logs it, or ``tick()``, which the owner's loop calls now and
    then, so the last events of a burst are never left unsaid."""

    def __init__(self, rank: int | str, what: str, many: str) -> None:
        self.rank = rank
        # Who logs: a peer's rank, or another name (a membership door's: its member).
        self._who = f"rank {rank}" if isinstance(rank, int) else str(rank)
        self.count = 0
        self.by_reason: dict[str, int] = {}
        self._what, self._many = what, many
        self._lines = 0  # events logged one by one
        self._logged_at = (time.monotonic(), 0)  # (when, count) of the last log line
        self._latest = ("", "")  # (reason, detail) of the latest event not logged yet

    def note(self, reason: str, detail: str, *, quiet: bool = False) -> None:
        """Count one event under ``reason`` and log it (see the class docstring); ``quiet``:
        only in the summaries (an event of a kind already logged, such as a sender cut again)."""
        self.count += 1
        self.by_reason[reason] = self.by_reason.get(reason, 0) + 1
        if not quiet and self._lines < defaults.MAX_LOGGED_DROPS:
            self._lines += 1
            log.warning("%s: %s (%s): %s%s", self._who, self._what, reason, detail,
                        "; further ones are summarised every %gs"
                        % defaults.DROP_SUMMARY_INTERVAL
                        if self._lines == defaults.MAX_LOGGED_DROPS else "")
            self._logged_at = (time.monotonic(), self.count)
            return
        self._latest = (reason, detail)
        self.tick()

    def tick(self, *, final: bool = False) -> None:
        """Log the summary of the events not logged yet, if one is due (``final``: now, as
        its owner closes)."""
        when, count = self._logged_at
        if count == self.count:
            return
        now = time.monotonic()
        if final or now - when >= defaults.DROP_SUMMARY_INTERVAL:
            reason, detail = self._latest
            log.warning("%s: %s %d more in %.0fs (by reason so far: %s); latest (%s): %s",
                        self._who, self._many, self.count - count, now - when,
                        self.by_reason, reason, detail)
            self._logged_at = (now, self.count)


class DropLog(ThrottledLog):
    """The drop counters of one peer (written by whichever thread reads the ROUTER)."""

    def __init__(self, rank: int) -> None:
        super().__init__(rank, "dropped a message", "dropped messages:")

    def drop(self, reason: str, detail: str) -> None:
        """Count one dropped message under ``reason`` and log it (throttled)."""
        self.note(reason, detail)

    def stale(self, src: int, header: Header) -> None:
        """A message for an operation whose mailbox was retired (a late or replayed one)."""
        self.drop("stale", f"rank {src} sent to finished operation "
                           f"(channel {header.channel}, seq {header.seq})")
