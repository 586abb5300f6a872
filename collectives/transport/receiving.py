"""What a peer's I/O thread does with what arrives: messages on the ROUTER (validated, then
delivered to the inbox, or dropped and counted) and connection events from the DEALERs' socket
monitors (liveness). A mixin of Transport, split out so each file holds one concept: the
transport sends and owns the sockets, this reads."""
from __future__ import annotations

import logging
import threading
import time

import zmq
from zmq.utils.monitor import recv_monitor_message

from collectives.errors import PeerLost
from collectives.transport.inbox import Lost, SlotError
from collectives.transport.shm import ShmView, parse_open, ring_name
from collectives.transport.wire import (ABORT, BYE, CREDIT, DATA, HELLO, SHM, SHM_MAPPED, SHM_OPEN,
                              STARVED, WireError, decode_header, encode_header)

__all__ = ["Receiving", "IDENTITY_PREFIX"]

log = logging.getLogger("collectives")

IDENTITY_PREFIX = b"gossip:"
# Drops are logged in a burst of this many, then one summary line per interval at most: a
# fuzzer or a flood must not turn into one log line per message.
_MAX_LOGGED_DROPS = 20
_DROP_SUMMARY_S = 10.0
_DISCONNECT_GRACE = 0.25  # seconds between a dropped connection and declaring its peer lost
_EVENTS, _POLLIN, _NOBLOCK = int(zmq.EVENTS), int(zmq.POLLIN), int(zmq.NOBLOCK)


# How long a waiting caller keeps the ROUTER per turn before it looks at close() again.
_PUMP_SLICE_S = 0.01
# While a caller reads the ROUTER, the I/O thread looks for its return after _PARK_MIN_S,
# backing off to _PARK_MAX_S while the caller keeps it (a long wait on a slow peer).
_PARK_MIN_S = 0.001
_PARK_MAX_S = 0.016


class Receiving:
    """The receiving half of Transport.

    Who reads the ROUTER: the I/O thread, or a caller waiting in recv() (leader/follower).
    A waiting caller that finds the socket free reads it itself, so a message reaches the
    operation waiting for it without a hand-off between threads (about 40 us of two thread
    wake-ups per message on a loaded 2-core machine); whatever else arrives meanwhile is
    delivered to the inbox as the I/O thread would. ``_rx_lock`` is the memory fence that
    lets the socket move between threads. The I/O thread watches the socket's signalling
    file descriptor (not the socket, which it may not touch without the lock); when a caller
    holds the socket the I/O thread stops watching it ("parks") until the caller hands it
    back, and the caller always leaves the socket drained, so its descriptor signals again on
    the next arrival.
    """

    def _receive(self) -> bool:
        """Read what the ROUTER holds (the caller holds ``_rx_lock``); True once drained."""
        # The raw socket calls, not pyzmq's recv_multipart/getsockopt sugar: per 4 KiB
        # allreduce these were ~20 us of enum conversions, RCVMORE lookups and zmq.Again
        # exceptions, on the critical path of every small operation.
        router = self._router
        get, recv = router.get, router.recv
        for _ in range(1024):  # bounded, so commands and monitors are not starved
            # Reading EVENTS also settles the socket's signalling descriptor (ZeroMQ's
            # edge-triggered ZMQ_FD): once it says "nothing", the descriptor fires again only
            # on a later arrival.
            if not get(_EVENTS) & _POLLIN:
                return True
            try:
                frames = [recv(_NOBLOCK, copy=False)]
                while frames[-1].more:  # the parts of one message arrive together
                    frames.append(recv(_NOBLOCK, copy=False))
            except zmq.Again:
                continue
            self._handle(frames)
        return False

    # -- the I/O thread's side
    def _io_receive(self) -> None:
        """The socket signalled (or is known to hold more): read it, or park if a caller has
        it."""
        if self._rx_lock.acquire(blocking=False):
            try:
                self._rx_more = not self._receive()
            finally:
                self._rx_lock.release()
            if self._rx_parked:
                self._poller.register(self._rx_fd, zmq.POLLIN)
                self._rx_parked = False
            return
        if self._rx_parked:
            self._rx_park_s = min(2 * self._rx_park_s, _PARK_MAX_S)
        else:
            self._poller.unregister(self._rx_fd)
            self._rx_parked = True
            self._rx_park_s = _PARK_MIN_S

    # -- a waiting caller's side
    def _pump(self, key, deadline: float) -> bool:
        """Read the ROUTER in this thread until slot ``key`` has something (or an error),
        ``deadline`` passes or the transport closes; False at once if another thread is
        reading it (that thread, or the I/O thread, delivers to the inbox)."""
        if not self._rx_lock.acquire(blocking=False):
            return False
        more = False
        taken = time.monotonic()
        try:
            router, inbox = self._router, self.inbox
            while not self._closed:
                drained = self._receive()
                if inbox.poll(key):
                    break
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    break
                if drained:
                    # zmq_poll itself: Socket.poll builds a Poller per call.
                    zmq.zmq_poll([(router, _POLLIN)],
                                 int(min(remaining, _PUMP_SLICE_S) * 1000) + 1)
            else:
                return True
            more = not self._receive()  # leave it drained, so its descriptor fires again
            return True
        finally:
            self._rx_lock.release()
            # A parked I/O thread looks again within a millisecond or so by itself: waking it
            # here would cost a thread switch per operation. After a long hold it has backed
            # off to longer looks, so hand the socket back explicitly then.
            if more:
                self._rx_more = True
            # Callers that found the socket taken wait on the inbox: someone must read for
            # them now.
            if more or self._rx_waiting or time.monotonic() - taken > _PARK_MAX_S / 4:
                self._command(("rx",))

    def _drop(self, reason: str, detail: str) -> None:
        self.dropped += 1
        self.dropped_by_reason[reason] = self.dropped_by_reason.get(reason, 0) + 1
        if self.dropped <= _MAX_LOGGED_DROPS:
            log.warning("rank %d: dropped a message (%s): %s%s", self.rank, reason, detail,
                        "; further drops are summarised every %gs" % _DROP_SUMMARY_S
                        if self.dropped == _MAX_LOGGED_DROPS else "")
            self._drops_logged_at = (time.monotonic(), self.dropped)
            return
        when, count = self._drops_logged_at
        now = time.monotonic()
        if now - when >= _DROP_SUMMARY_S:
            log.warning("rank %d: dropped %d more messages in %.0fs (by reason so far: %s); "
                        "latest (%s): %s", self.rank, self.dropped - count, now - when,
                        self.dropped_by_reason, reason, detail)
            self._drops_logged_at = (now, self.dropped)

    def _handle(self, frames: list) -> None:
        identity = frames[0].bytes
        src = self._identity_ranks.get(identity)  # the usual spelling, without parsing
        if src is None:
            src = _rank_of_identity(identity, self.world_size)
        if src is None:
            self._drop("foreign", f"unknown sender identity {identity[:40]!r}")
            return
        if len(frames) not in (2, 3):
            self._drop("malformed", f"{len(frames) - 1} frames from rank {src}")
            return
        payload = frames[2] if len(frames) == 3 else None
        payload_len = len(payload) if payload is not None else 0
        try:
            header = decode_header(frames[1].buffer, world_size=self.world_size,
                                   max_bytes=self.config.max_message_bytes,
                                   payload_len=payload_len)
        except WireError as exc:
            self._drop("malformed", f"from rank {src}: {exc}")
            return
        if header.src != src:
            self._drop("foreign", f"header claims rank {header.src} on rank {src}'s connection")
            return
        if src == self.rank:
            # A peer never sends to itself: whoever uses our own identity is an intruder, and
            # what it sends would sit in slots nobody reads.
            self._drop("foreign", f"a connection uses this peer's own identity (rank {src})")
            return
        # Replays and duplicates: one pipe per source never reorders or repeats, so numbers
        # only grow. This runs before anything reaches the inbox, so a chunk is never reduced
        # twice, whether its operation is running or finished.
        if header.number <= self._heard[src]:
            self._drop("replay", f"message number {header.number} from rank {src} after "
                                 f"{self._heard[src]} (a replay, a duplicate, or unnumbered)")
            return
        self._heard[src] = header.number
        # Every message is either dropped (and counted as such) or received, never both:
        # dropped + received accounts for every message that arrived.
        counters = self.counters[src]
        kind = header.kind
        key = (src, header.channel, header.seq)
        if kind == DATA:
            if not self.inbox.put(key, (header, payload, None)):
                self._drop("stale", f"rank {src} sent to finished operation "
                                    f"(channel {header.channel}, seq {header.seq})")
                return
            counters.bytes_received += payload_len
        elif kind == SHM:
            view = self._views.get(src)
            if view is None or header.slot >= view.nslots or header.length > view.slot_bytes:
                self._drop("malformed", f"rank {src} named shared-memory slot {header.slot} "
                                        f"of {header.length} bytes outside its ring")
                return
            release = _Releaser(self, src, view, header.slot)
            if not self.inbox.put(key, (header, view.chunk(header.slot, header.length),
                                        release)):
                release()
                self._drop("stale", f"rank {src} sent to finished operation "
                                    f"(channel {header.channel}, seq {header.seq})")
                return
            counters.bytes_received += header.length
        elif kind == SHM_OPEN:
            if not self._map_ring(src, header.op):
                return
        elif kind == SHM_MAPPED:
            mapped = self._ring_mapped.get(src)
            if mapped is not None:
                mapped.set()
        elif kind == STARVED:
            self.inbox.spill(src, _copy_out)
        elif kind == CREDIT:
            link = self._links.get(src)
            if link is not None:
                # Flushing belongs to the I/O thread (it owns the blocked set and poller).
                if threading.get_ident() == self._thread.ident:
                    if link in self._shm_blocked:
                        self._flush(link)
                else:
                    self._command(("flush", link))
        elif kind == ABORT:
            reason, lost_rank = header.op, None
            if reason.startswith("lost:"):
                rank_text, _, reason = reason[5:].partition("|")
                lost_rank = int(rank_text) if rank_text.isdigit() else None
            self.inbox.post_error(key, SlotError(f"rank {src} abandoned the operation: {reason}",
                                                 lost_rank))
        elif kind == BYE:
            self.inbox.mark_lost(src, Lost("it closed its peer (left the group)", kind="closed"))
        elif kind == HELLO:
            pass
        counters.messages_received += 1

    def _map_ring(self, src: int, announcement: str) -> bool:
        """False if the announcement was malformed (and dropped)."""
        parsed = parse_open(announcement)
        if parsed is None:
            self._drop("malformed", f"rank {src} announced a shared-memory ring as "
                                    f"{announcement[:60]!r}")
            return False
        old = self._views.pop(src, None)
        if old is not None:
            old.close()
        try:
            self._views[src] = ShmView(*parsed, name=ring_name(src, self.rank))
        except ValueError as exc:  # not a gossip ring: a forged announcement
            self._drop("foreign", f"rank {src}: {exc}")
            return False
        except OSError as exc:
            self.inbox.mark_lost(src, Lost(
                f"cannot map its shared-memory ring ({exc}); run with GOSSIP_TRANSPORT=ipc "
                "if peers on this host cannot read each other's /proc/<pid>/fd"))
            return True
        # From now on the ring outlives its sender: tell it that it may exit. A peer that got
        # the address table before us may be heard from before we can answer it.
        if src in self._addresses:
            self._send_quietly(src, encode_header(SHM_MAPPED, self.rank, 0, 0))
        else:
            self._unanswered.append(src)
        return True

    def _send_quietly(self, dst: int, header: bytes) -> None:
        """A control message whose loss only costs time (the peer is closing or gone)."""
        try:
            self.send(dst, header)
        except (PeerLost, ValueError) as exc:
            log.debug("rank %d: control message to rank %d not sent: %s", self.rank, dst, exc)

    def _monitor_event(self, monitor, rank: int) -> None:
        while True:
            try:
                event = recv_monitor_message(monitor, zmq.NOBLOCK)
            except zmq.Again:
                return
            kind = event["event"]
            if kind == zmq.EVENT_HANDSHAKE_SUCCEEDED:
                # A ZeroMQ peer answered (with or without CURVE), not just some process that
                # accepted the connection on a port or socket file a dead peer left behind.
                self._connected.add(rank)
            elif kind == zmq.EVENT_DISCONNECTED:
                if rank in self._connected and rank not in self._suspects:
                    # What the peer sent before it went travels on its own connection to our
                    # ROUTER and may be read after this event: give it a moment to land, so
                    # the last messages of a peer that finished and left are not lost.
                    self._suspects[rank] = time.monotonic() + _DISCONNECT_GRACE
            elif kind == zmq.EVENT_HANDSHAKE_FAILED_AUTH:
                self.inbox.mark_lost(rank, Lost("the peer refused our cluster key (CURVE "
                                                "authentication failed)", kind="auth"))
            elif kind in (zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL,
                          zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL):
                self.inbox.mark_lost(rank, Lost("security handshake failed (does every peer use "
                                                "the same cluster key, or none?)", kind="auth"))

    def _declare_lost(self) -> None:
        now = time.monotonic()
        for rank, when in list(self._suspects.items()):
            if now >= when:
                del self._suspects[rank]
                self.inbox.mark_lost(rank, Lost(
                    "connection dropped (the peer died, closed, or missed heartbeats for "
                    f"{self.config.effective_heartbeat_timeout:g}s)"))


class _Releaser:
    """Frees one shared-memory slot, once (a retired message may be released twice), and
    wakes the sender with a CREDIT if it was waiting for a slot."""

    __slots__ = ("transport", "src", "view", "slot")

    def __init__(self, transport: Receiving, src: int, view: ShmView, slot: int) -> None:
        self.transport, self.src, self.view, self.slot = transport, src, view, slot

    def __call__(self) -> None:
        view, self.view = self.view, None
        if view is not None and view.release(self.slot) and not self.transport.closed:
            self.transport._send_quietly(self.src,
                                         encode_header(CREDIT, self.transport.rank, 0, 0))


def _copy_out(item):
    """A shared-memory message moved to private memory, its slot freed."""
    header, payload, release = item
    if release is None:
        return item
    copy = memoryview(bytearray(payload))
    release()
    return header, copy, None


def _rank_of_identity(identity: bytes, world_size: int) -> int | None:
    if not identity.startswith(IDENTITY_PREFIX):
        return None
    digits = identity[len(IDENTITY_PREFIX):]
    if not digits.isdigit() or len(digits) > 9:
        return None
    rank = int(digits)
    return rank if rank < world_size else None
