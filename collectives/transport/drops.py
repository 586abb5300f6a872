"""Dropped messages: counted by reason and logged without flooding the log.

A receiver never raises on a bad message (a malformed frame, a foreign sender, a replay, a
message for a finished operation): it drops it, counts it here, and keeps serving. Every message
that arrives is either dropped (counted here) or received (counted per peer), never both, so
the two add up to what arrived. Drops are logged one by one up to MAX_LOGGED_DROPS, then as one
summary line per DROP_SUMMARY_INTERVAL at most: a fuzzer or a flood must not turn into one log
line per message.
"""
from __future__ import annotations

import logging
import time

from collectives import defaults
from collectives.transport.wire import Header

__all__ = ["DropLog"]

log = logging.getLogger("collectives")


class DropLog:
    """The drop counters of one peer (written by whichever thread reads the ROUTER)."""

    def __init__(self, rank: int) -> None:
        self.rank = rank
        self.count = 0
        self.by_reason: dict[str, int] = {}
        self._logged_at = (0.0, 0)  # (when, drop count) of the last drop log line

    def drop(self, reason: str, detail: str) -> None:
        """Count one dropped message under ``reason`` and log it: one by one at first, then in
        summaries (see the module docstring)."""
        self.count += 1
        self.by_reason[reason] = self.by_reason.get(reason, 0) + 1
        if self.count <= defaults.MAX_LOGGED_DROPS:
            log.warning("rank %d: dropped a message (%s): %s%s", self.rank, reason, detail,
                        "; further drops are summarised every %gs"
                        % defaults.DROP_SUMMARY_INTERVAL
                        if self.count == defaults.MAX_LOGGED_DROPS else "")
            self._logged_at = (time.monotonic(), self.count)
            return
        when, count = self._logged_at
        now = time.monotonic()
        if now - when >= defaults.DROP_SUMMARY_INTERVAL:
            log.warning("rank %d: dropped %d more messages in %.0fs (by reason so far: %s); "
                        "latest (%s): %s", self.rank, self.count - count, now - when,
                        self.by_reason, reason, detail)
            self._logged_at = (now, self.count)

    def stale(self, src: int, header: Header) -> None:
        """A message for an operation whose mailbox was retired (a late or replayed one)."""
        self.drop("stale", f"rank {src} sent to finished operation "
                           f"(channel {header.channel}, seq {header.seq})")
