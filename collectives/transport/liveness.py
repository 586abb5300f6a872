"""Liveness: which peers answer, and when one is declared lost.

Liveness comes from the DEALERs: libzmq's ZMTP heartbeats (answered by the remote libzmq
thread, so a peer busy in Python still answers) drop a silent connection after
``heartbeat_timeout``, a dead process drops it at once, and each DEALER's socket monitor reports
the drop. A dropped connection makes its peer a *suspect*; DISCONNECT_GRACE later it is marked
lost in the inbox, which turns into ``PeerLost`` for every operation waiting on it. A receive
from a peer therefore first connects to it, even when this peer never sends to it.
"""
from __future__ import annotations

import logging
import threading
import time

import zmq
from zmq.utils.monitor import recv_monitor_message

from collectives import defaults
from collectives.notices import events
from collectives.transport.inbox import Inbox, Lost

__all__ = ["Liveness", "MONITOR_EVENTS"]

log = logging.getLogger("collectives")

# What a DEALER's monitor reports (see Sockets.open_link).
MONITOR_EVENTS = (zmq.EVENT_DISCONNECTED | zmq.EVENT_HANDSHAKE_SUCCEEDED
                  | zmq.EVENT_HANDSHAKE_FAILED_AUTH | zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL
                  | zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL)


class Liveness:
    """The monitors of one peer's links, the peers reached, and the suspects (I/O thread;
    ``connected`` is read by callers)."""

    def __init__(self, inbox: Inbox, heartbeat_timeout: float, refusals) -> None:
        self._inbox = inbox
        self._refusals = refusals  # Refusals: an outbound refusal is logged like an inbound one
        self._heartbeat_timeout = heartbeat_timeout
        self.monitors: dict[zmq.Socket, int] = {}  # monitor socket -> rank
        self.connected: set[int] = set()  # ranks a ZeroMQ handshake succeeded with
        self._reached = threading.Condition()   # notified as a rank joins ``connected``
        self.suspects: dict[int, float] = {}  # rank -> when its dropped connection counts

    def wait_reached(self, rank: int, timeout: float) -> bool:
        """Wait up to ``timeout`` seconds for a handshake with ``rank`` (woken as it
        succeeds); True if it has."""
        with self._reached:
            return self._reached.wait_for(lambda: rank in self.connected, timeout)

    def watch(self, link) -> zmq.Socket:
        """Start reading ``link``'s monitor; returns the socket to poll."""
        self.monitors[link.monitor] = link.rank
        return link.monitor

    def on_events(self, monitor, rank: int) -> None:
        """Read what ``monitor`` (of the link to ``rank``) reported."""
        while True:
            try:
                event = recv_monitor_message(monitor, zmq.NOBLOCK)
            except zmq.Again:
                return
            kind = event["event"]
            if kind == zmq.EVENT_HANDSHAKE_SUCCEEDED:
                log.debug("rank %s: connected to rank %d at %s (handshake done)",
                          self._refusals.rank, rank, event["endpoint"].decode(errors="replace"))
                # A ZeroMQ peer answered (with or without CURVE), not just some process that
                # accepted the connection on a port or socket file a dead peer left behind.
                with self._reached:
                    self.connected.add(rank)
                    self._reached.notify_all()
            elif kind == zmq.EVENT_DISCONNECTED:
                if rank in self.connected and rank not in self.suspects:
                    log.debug("rank %s: connection to rank %d dropped (it closed or died): "
                              "counted lost in %gs", self._refusals.rank, rank,
                              defaults.DISCONNECT_GRACE)
                    # What the peer sent before it went travels on its own connection to our
                    # ROUTER and may be read after this event: give it a moment to land, so
                    # the last messages of a peer that finished and left are not lost.
                    self.suspects[rank] = time.monotonic() + defaults.DISCONNECT_GRACE
            elif kind == zmq.EVENT_HANDSHAKE_FAILED_AUTH:
                reason = "the peer refused our cluster key (CURVE authentication failed)"
                self._refusals.outbound(rank, reason)
                self._inbox.mark_lost(rank, Lost(reason, kind="auth"))
            elif kind == zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL:
                reason = ("security handshake failed (does every peer use the same cluster "
                          "key, or none?)")
                self._refusals.outbound(rank, reason)
                self._inbox.mark_lost(rank, Lost(reason, kind="auth"))
            elif kind == zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL:
                # The connection closed before the handshake ended: most often the peer died
                # at that moment (a joiner killed as it starts); a foreign key shows so too,
                # so say both, and count it a loss, not a configuration error.
                reason = ("the connection closed during its handshake: the peer died, or it "
                          "does not hold this group's cluster key")
                self._refusals.outbound(rank, reason)
                self._inbox.mark_lost(rank, Lost(reason))

    def declare_lost(self) -> None:
        """Mark lost every suspect whose grace has passed."""
        now = time.monotonic()
        for rank, when in list(self.suspects.items()):
            if now >= when:
                del self.suspects[rank]
                reason = ("connection dropped (the peer died, closed, or missed heartbeats for "
                          f"{self._heartbeat_timeout:g}s)")
                if self._inbox.lost(rank) is None:   # (not a peer that said goodbye)
                    # The events log's line of a death, once per peer that noticed it.
                    events.info("rank %s: lost rank %d: %s", self._refusals.rank, rank, reason)
                self._inbox.mark_lost(rank, Lost(reason))
