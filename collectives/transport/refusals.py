"""Refused handshakes, inbound and outbound: every one is counted and logged (throttled).

A client without CURVE, or with another server key, never reaches the ZAP handler: libzmq
refuses it in the handshake (mechanism mismatch, a box that does not decrypt) and only the
ROUTER's socket monitor hears of it. This module reads that monitor, so an operator sees those
refusals beside ZAP's (a client with a foreign key pair, reported by the handler) and the
DEALERs' (this peer refused by another, reported by liveness.py).

The monitor names the listening endpoint, not the client; the client's address is read from
the connection's descriptor when it is accepted, and a failed handshake is followed at once
by the disconnection of the same descriptor (one libzmq I/O thread emits both), which is how
the two are paired.

Some refusals come with no failure event at all: a client that speaks ZMTP 1.0 or 2.0, or no
ZMTP (an HTTP request, a port scanner's bytes), is dropped by a CURVE server before any
mechanism starts, and the monitor only reports the connection accepted and then disconnected.
Such a connection is one that ends while its handshake is pending: accepted, and neither
succeeded nor failed. Success events name no descriptor, so one is attributed when exactly one
connection is pending; when several are, they are all left unknown (never logged as refused:
an honest peer is never reported, at the cost of missing a refusal that overlaps a success).
"""
from __future__ import annotations

import logging

import zmq
from zmq.utils.monitor import recv_monitor_message

from collectives.transport.offenders import describe
from collectives.transport.throttled_log import ThrottledLog

__all__ = ["Refusals"]

log = logging.getLogger("collectives")

_EVENTS = (zmq.EVENT_ACCEPTED | zmq.EVENT_DISCONNECTED | zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL
           | zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL | zmq.EVENT_HANDSHAKE_SUCCEEDED
           | zmq.EVENT_HANDSHAKE_FAILED_AUTH)
_PROTOCOL_ERRORS: dict[int, str] = {
    zmq.PROTOCOL_ERROR_ZMTP_MECHANISM_MISMATCH: "security mechanism mismatch (a client without "
                                                "CURVE, or a keyed one to a keyless group)",
    zmq.PROTOCOL_ERROR_ZMTP_CRYPTOGRAPHIC: "CURVE handshake does not decrypt (a client with "
                                           "another server key)",
}
_UNFINISHED = ("the client never completed a handshake (it spoke ZMTP 1.0 or 2.0, which cannot "
               "use CURVE, or no ZMTP at all)")


def _peer_name(fd: int) -> str:
    """The remote address of an accepted connection's descriptor (read in place: libzmq's own
    is untouched)."""
    where = describe(fd)
    return where[0] if where is not None else "an unknown address"


class Refusals(ThrottledLog):
    """The refused handshakes of one peer, by reason (the I/O thread writes, ``stats`` reads)."""

    def __init__(self, rank: int | str, router: zmq.Socket) -> None:
        super().__init__(rank, "refused a handshake", "refused handshakes:")
        self._router = router
        self.monitor = router.get_monitor_socket(_EVENTS)
        self._clients: dict[int, str] = {}  # accepted descriptor -> client address
        self._failed: str | None = None  # a failure waiting for its descriptor's disconnect
        # Accepted descriptors whose handshake has no outcome yet, and those whose outcome
        # cannot be told (a success came while several were pending): see the docstring.
        self._pending: set[int] = set()
        self._unknown: set[int] = set()

    def on_events(self) -> None:
        """Read what the ROUTER's monitor reported (I/O thread)."""
        while True:
            try:
                event = recv_monitor_message(self.monitor, zmq.NOBLOCK)
            except zmq.Again:
                return
            kind, value = event["event"], event["value"]
            if kind == zmq.EVENT_ACCEPTED:
                self._clients[value] = _peer_name(value)
                self._pending.add(value)
                # Which rank it is shows with its first message (its routing id), not here.
                log.debug("%s: accepted a connection from %s on %s", self._who,
                          self._clients[value], event["endpoint"].decode(errors="replace"))
            elif kind in (zmq.EVENT_HANDSHAKE_SUCCEEDED, zmq.EVENT_HANDSHAKE_FAILED_AUTH):
                # An outcome (a ZAP denial is logged by the handler, zap_denied): of the one
                # pending connection, or of one of several, which cannot be told apart.
                if len(self._pending) > 1:
                    self._unknown |= self._pending
                self._pending.clear()
            elif kind == zmq.EVENT_DISCONNECTED:
                client = self._clients.pop(value, "an unknown address")
                endpoint = event["endpoint"].decode(errors="replace")
                if self._failed is not None:
                    self.note("inbound", f"from {client} on {endpoint}: {self._failed}")
                    self._failed = None
                elif value in self._pending:
                    self.note("inbound", f"from {client} on {endpoint}: {_UNFINISHED}")
                self._pending.discard(value)
                self._unknown.discard(value)
            else:
                if self._failed is not None:  # unpaired (should not happen): still logged
                    self.note("inbound", f"from an unknown address: {self._failed}")
                if kind == zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL:
                    # The client hung up mid-handshake: what a client without CURVE (or with
                    # it, to a keyless group) does when it sees the mismatch before we do.
                    self._failed = (f"the client left in the handshake (errno {value}: a "
                                    "client without CURVE, or a keyed one to a keyless group)")
                else:
                    self._failed = _PROTOCOL_ERRORS.get(value, f"handshake failed (ZMTP "
                                                               f"error {value:#x})")

    def zap_denied(self, mechanism: str, address: str) -> None:
        """The ZAP handler refused a client (a CURVE key pair that is not the cluster's)."""
        self.note("inbound", f"{mechanism} client from {address} does not hold the cluster key")

    def outbound(self, rank: int, reason: str) -> None:
        """Rank ``rank`` refused this peer's connection (its DEALER's monitor saw it)."""
        self.note("outbound", f"rank {rank} refused our connection: {reason}")

    def close(self) -> None:
        """Stop the monitor and close its socket (before the ROUTER closes); refusals not
        logged yet are summarised now."""
        self.tick(final=True)
        try:
            self._router.disable_monitor()
        except zmq.ZMQError:
            pass
        self.monitor.close(linger=0)
