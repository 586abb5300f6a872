"""Dropped messages: counted by reason and logged without flooding the log.

A receiver never raises on a bad message (a malformed frame, a foreign sender, a replay, a
message for a finished operation): it drops it, counts it here, and keeps serving. Every message
that arrives is either dropped (counted here) or received (counted per peer), never both, so
the two add up to what arrived. Drops are logged through a ThrottledLog: one by one up to
MAX_LOGGED_DROPS, then as one summary line per DROP_SUMMARY_INTERVAL at most, so a fuzzer or
a flood does not turn into one log line per message.
"""
from __future__ import annotations

from collectives.transport.throttle import ThrottledLog
from collectives.transport.wire import Header

__all__ = ["DropLog"]


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
