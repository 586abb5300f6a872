"""A log that a flood cannot turn into one line per event: events of one kind are logged one by
one up to MAX_LOGGED_DROPS, then as one summary line per DROP_SUMMARY_INTERVAL at most, with
the count by reason so far and the latest event. Dropped messages (DropLog, below) and
refused handshakes (refusals.py) both log through it.

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
    ("dropped messages:", then "N more in 10s")."""

    def __init__(self, rank: int | str, what: str, many: str) -> None:
        self.rank = rank
        # Who logs: a peer's rank, or another name (a membership door's: its member).
        self._who = f"rank {rank}" if isinstance(rank, int) else str(rank)
        self.count = 0
        self.by_reason: dict[str, int] = {}
        self._what, self._many = what, many
        self._logged_at = (0.0, 0)  # (when, count) of the last log line

    def note(self, reason: str, detail: str) -> None:
        """Count one event under ``reason`` and log it (see the module docstring)."""
        self.count += 1
        self.by_reason[reason] = self.by_reason.get(reason, 0) + 1
        if self.count <= defaults.MAX_LOGGED_DROPS:
            log.warning("%s: %s (%s): %s%s", self._who, self._what, reason, detail,
                        "; further ones are summarised every %gs"
                        % defaults.DROP_SUMMARY_INTERVAL
                        if self.count == defaults.MAX_LOGGED_DROPS else "")
            self._logged_at = (time.monotonic(), self.count)
            return
        when, count = self._logged_at
        now = time.monotonic()
        if now - when >= defaults.DROP_SUMMARY_INTERVAL:
            log.warning("%s: %s %d more in %.0fs (by reason so far: %s); latest (%s): %s",
                        self._who, self._many, self.count - count, now - when, self.by_reason,
                        reason, detail)
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
