"""One peer's transport, as the rest of collectives sees it: point-to-point messages to and from
every other peer, by mailbox ``(src, channel, seq)``, with deadlines and errors that name the
peer, its address and the operation.

``Transport`` is a facade over the parts, each of which owns its state: the sockets
(sockets.py), the I/O loop that owns them once running (io_loop.py), the validation and
dispatch of what arrives (dispatch.py; drops counted in throttled_log.py's DropLog), liveness
(liveness.py), refused handshakes (refusals.py), the shared-memory protocol between peers on
one host (shm.py), the inbox where operations wait (inbox.py) and the flow control of what it
holds for operations not started and of what each link has in flight (flow_control.py). It
wires them together here, once, and adds what a caller needs on top: sends that pick the path
(inline, shared memory or zero-copy frame), receives that read the socket themselves when it is
free, errors worded with what the transport knows, and ``stats()``, what they all counted.
"""
from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass
from typing import Any


from collectives import defaults
from collectives.config import TransportConfig
from collectives.errors import PeerLost, ProtocolError, RendezvousError
from collectives.flight_recorder import FlightRecorder
from collectives.notices import LongWait
from collectives.transport.activity import Activity, Status
from collectives.transport.dispatch import Arrivals, status_channel
from collectives.transport.emulation import emulation_stats
from collectives.transport.flow_control import Acks, Holds, held_bounds
from collectives.transport.inbox import Inbox
from collectives.transport.io_loop import IoLoop
from collectives.transport.link import Link, SendTicket
from collectives.transport.liveness import Liveness
from collectives.transport.offenders import Offenders
from collectives.transport.shm import SharedMemory
from collectives.transport.sockets import Sockets, host_id
from collectives.transport.throttled_log import DropLog
from collectives.transport.wait_errors import describe_wait, wait_error
from collectives.transport.wire import (ABORT, PLAN, PLAN_ANSWER, SHM, STATUS, Header,
                                        encode_header)

__all__ = ["Transport", "PeerCounters", "host_id"]

log = logging.getLogger("collectives")

# Chunks up to this size travel inside the message, copied: cheaper than a shared-memory slot
# or a zero-copy frame with its tracker (pyzmq copies below 64 KiB anyway).
_INLINE_BYTES = 32 * 1024


@dataclass
class PeerCounters:
    """Traffic with one peer, as counted by this peer's I/O thread."""
    bytes_sent: int = 0
    messages_sent: int = 0
    bytes_received: int = 0
    messages_received: int = 0


class Transport:
    """Point-to-point messaging for one peer. ``send`` is asynchronous (queued to the I/O
    thread, zero-copy); ``recv`` waits on the mailbox ``(src, channel, seq)`` with a
    deadline. Higher layers (collectives, rendezvous) build on these two calls."""

    def __init__(self, rank: int, world_size: int, config: TransportConfig | None = None) -> None:
        if not 0 <= rank < world_size:
            raise ValueError(f"rank {rank} is outside world size {world_size}")
        self.rank = rank
        self.world_size = world_size
        self.config = config or TransportConfig()
        # What this peer holds for operations not started: smaller without a cluster key,
        # where anyone who reaches the port may send (flow_control.HeldBounds).
        self.bounds = held_bounds(self.config.key)
        self.inbox = Inbox(self.bounds)
        #: This peer's last calls and per-operation totals (flight_recorder.py); a view
        #: change carries it into the next view's transport (FlightRecorder.continue_from).
        self.recorder = FlightRecorder(rank)
        self.counters = [PeerCounters() for _ in range(world_size)]
        self.hosts: dict[int, str] = {}   # rank -> host_id, from the table (set_peers)
        self._closed = False
        self._armed: tuple | None = None   # the last wait logged (DEBUG): one line per wait
        self.interrupted = False   # interrupt() was called: a view change ends this transport
        self._close_lock = threading.Lock()
        self._rendezvous_refused: dict[str, int] = {}  # the rendezvous's, once it closed
        self._drops = DropLog(rank)
        self._sockets = Sockets(rank, self.config, self._count_sent)
        # Connections cut for bad messages (the ROUTER says whether one is still open).
        self._offenders = Offenders(rank, self._sockets.alive)
        self.context = self._sockets.context
        self.endpoints = self._sockets.endpoints
        # The sockets' tables, bound here: every send looks its link up.
        self._links = self._sockets.links
        self._addresses = self._sockets.addresses
        self._liveness = Liveness(self.inbox, self.config.effective_heartbeat_timeout,
                                  self._sockets.refusals)
        self._loop = IoLoop(rank, world_size, self._sockets, self.inbox, self._liveness)
        self._shm = SharedMemory(rank, self.config, inbox=self.inbox, counters=self.counters,
                                 drops=self._drops, loop=self._loop, links=self._links,
                                 addresses=self._addresses, send_quietly=self._send_quietly)
        # What this peer holds for operations not started is bounded in the inbox; holds asks
        # a source running ahead to wait, and obeys such requests from others; the send
        # window bounds in bytes what each link has in flight, paused or not.
        # A source paused and sending past its window is judged by its largest honest message,
        # with the margin the ROUTER's frame cap gives differently configured peers, halved.
        largest = 2 * max(self.config.whole_message_bytes, self.config.chunk_bytes) \
            + defaults.HELD_OVERHEAD
        self._acks = Acks(rank, world_size, self._links, self.connect, self._loop.command,
                          self.inbox.holding, every=self.bounds.ack_every,
                          allowance=self.bounds.window_allowance(largest))
        self._holds = Holds(rank, self._links, self.connect, self._loop.command, self._acks)
        self.inbox.on_hold = self._holds.request
        # What this peer's operations are doing, for the peers that ask (activity.py).
        self.activity = Activity()
        arrivals = Arrivals(rank, world_size, self.config, inbox=self.inbox,
                            counters=self.counters, drops=self._drops, offenders=self._offenders,
                            handlers={**self._shm.handlers(), **self._holds.handlers()},
                            activity=self.activity, answer=self._send_quietly, acks=self._acks)
        self._command = self._loop.command
        self.pump = self._loop.pump   # (pump(key, deadline): io_loop.py's)
        self._loop.start(arrivals.handle, self._shm,
                         ticks=(self._drops.tick, self._offenders.tick,
                                self._sockets.refusals.tick))

    # ------------------------------------------------------------------ set-up
    def set_peers(self, table: dict[int, dict]) -> None:
        """Install the endpoint table from the rendezvous: rank -> {tcp, ipc, host}."""
        me, mode = self.endpoints["host"], self.config.transport
        self.hosts = {rank: str(entry.get("host")) for rank, entry in table.items()}
        for rank, entry in table.items():
            same_host = entry.get("host") == me
            use_ipc = entry.get("ipc") and mode != "tcp" and (mode == "ipc" or same_host)
            self._addresses[rank] = entry["ipc"] if use_ipc else entry["tcp"]
            if (rank != self.rank and same_host and entry.get("shm") and self.endpoints["shm"]
                    and mode in ("auto", "shm")):
                self._shm.peers.add(rank)
            elif mode == "shm" and rank != self.rank:
                raise RendezvousError(f"rank {self.rank}: transport 'shm' needs every peer on "
                                      f"this host with shared memory, but rank {rank} "
                                      f"({entry.get('tcp')}) is not")
        self._shm.drop_prepared(self._shm.peers)
        self._shm.answer_unanswered()

    def on_host_peers(self) -> frozenset[int]:
        """The ranks this peer sends to through shared memory (on this host)."""
        return frozenset(self._shm.peers)

    def expect_on_host(self, ranks) -> None:
        """Ranks expected on this host: their rings are made now (SharedMemory.prepare)."""
        self._shm.prepare(ranks, self.world_size)

    def address(self, rank: int) -> str:
        """The endpoint this peer reaches ``rank`` at ("<unknown address>" before set_peers)."""
        return self._sockets.address(rank)

    # ------------------------------------------------------------------ user-thread API
    def connect(self, rank: int) -> Link:
        """The outgoing connection to ``rank``, opened on first use; it carries sends and
        tells when the peer dies, so a receive from a peer connects to it too."""
        link = self._links.get(rank)
        if link is not None:
            return link
        link, new = self._sockets.open_link(rank, self._prepare_link)
        if new:
            self._command(("watch", link))  # the I/O thread polls the monitor (and the queue)
        return link

    def _prepare_link(self, link: Link) -> None:
        if link.rank in self._shm.peers:
            self._shm.open_ring(link)

    def _count_sent(self, rank: int, messages: int, nbytes: int) -> None:
        counters = self.counters[rank]
        counters.messages_sent += messages
        counters.bytes_sent += nbytes

    def send(self, dst: int, header: bytes, payload: Any = None, *,
             ticket: SendTicket | None = None) -> None:
        """Send one message to ``dst`` now, or queue it behind earlier ones. The payload
        buffer is sent without a copy, so it must not change until ``ticket`` (if given, made
        with tracking) says so."""
        if self._closed:
            raise PeerLost(f"rank {self.rank}: send to rank {dst} after close()", rank=dst)
        link = self.connect(dst)
        frames = (header,) if payload is None else (header, payload)
        if link.send(frames, ticket):
            self._command(("flush", link))

    def _send_quietly(self, dst: int, header: bytes) -> None:
        """A control message whose loss only costs time (the peer is closing or gone)."""
        try:
            self.send(dst, header)
        except (PeerLost, ValueError) as exc:
            log.debug("rank %d: control message to rank %d not sent: %s", self.rank, dst, exc)

    def post_chunk(self, dst: int, header: Header, payload: Any, *, deadline: float,
                   track: bool = False) -> SendTicket | None:
        """Send one chunk of an array to ``dst``: ``header`` is its DATA header (from this
        peer; ``offset`` and ``length`` the chunk's byte range in the array, ``length`` the
        payload's own length; ``slot`` a neighbour exchange's PLAN bits or 0).

        To a peer on this host the chunk is copied into a shared-memory slot (or, if none is
        free, queued until one is; the ticket then says when the buffer was copied); otherwise
        it is sent zero-copy, and with ``track`` the ticket says when the buffer may change.
        Never blocks: a full ring or socket queues, in order. PLAN bits travel in the DATA
        header; a shared-memory chunk's header holds its slot there, so a separate PLAN goes
        first."""
        if self._closed:
            raise PeerLost(f"rank {self.rank}: send to rank {dst} after close()", rank=dst)
        link = self._links.get(dst) or self.connect(dst)
        if header.length <= _INLINE_BYTES:
            # Small: ZeroMQ copies it anyway, so the buffer is free at once (no tracking).
            # Straight to the link: this is the path of every latency-bound operation.
            if link.send((encode_header(header), bytes(payload)), None):
                self._command(("flush", link))
            return None
        if self._shm.has_ring(dst):
            if header.length > self.config.shm_chunk_bytes:
                # It would run over its slot into the next ones, and the receiver would drop
                # it as malformed: a caller's bug (chunks come from whole_bytes/chunk_bytes).
                raise ValueError(f"rank {self.rank}: a chunk of {header.length} bytes to "
                                 f"rank {dst} does not fit a shared-memory slot of "
                                 f"{self.config.shm_chunk_bytes} bytes (shm_chunk_bytes)")
            if header.slot:
                self.post_plan(dst, header._replace(kind=PLAN, offset=0, length=0))
            ticket = SendTicket() if track else None
            queued, wake = self._shm.post(link, header._replace(kind=SHM, slot=0), payload,
                                          ticket)
            if link.closed:
                raise PeerLost(f"rank {self.rank}: send to rank {dst} after close()", rank=dst)
            if not queued:
                ticket = None  # copied already: the buffer is free
            if wake:
                self._command(("flush", link))
            return ticket
        ticket = SendTicket() if track else None
        self.send(dst, encode_header(header), payload, ticket=ticket)
        return ticket

    def post_plan(self, dst: int, header: Header) -> None:
        """Tell ``dst`` this peer's pattern towards it in a neighbour exchange: ``header`` is
        the PLAN of that call (wire.PLAN_* bits in ``slot``), sent ahead of any data of the
        call (one pipe keeps the order)."""
        self.send(dst, encode_header(header))

    def answer_plan(self, src: int, channel: int, seq: int) -> None:
        """Answer the plan ``src`` sent for ``(channel, seq)``, which this peer's call there does
        not involve: "not involved" (wire.PLAN_ANSWER); what it sent there is dropped."""
        item = self.inbox.take((src, channel, seq))
        self.retire(channel, seq, [src])
        if type(item) is tuple:
            header = item[0]
            if item[2] is not None:
                item[2]()
            self._send_quietly(src, encode_header(Header(
                PLAN, self.rank, channel, seq, header.op, header.dtype, header.shape,
                header.nbytes, slot=PLAN_ANSWER)))

    def ask_status(self, rank: int, channel: int, seq: int, deadline: float) -> Status | None:
        """What ``rank`` says it is doing about operation ``(channel, seq)`` (its I/O thread
        answers, even while its Python is busy or idle); None if no answer by ``deadline``."""
        key = (rank, status_channel(channel), seq)
        try:
            self.send(rank, encode_header(Header(STATUS, self.rank, channel, seq)))
        except PeerLost:
            return None
        try:
            item = self._loop.wait_on_inbox(self.inbox.get, key, deadline) \
                if not self.pump(key, deadline) else self.inbox.get(key, deadline)
        finally:
            self.inbox.retire(key)
        if type(item) is not tuple:
            return None
        header = item[0]
        return Status(header.slot, header.offset - 1, header.op, header.length - 1)

    def chunk_bytes(self, dst: int) -> int:
        """How big the chunks sent to ``dst`` are: shared-memory slots are cheap to fill in
        bigger pieces (fewer messages per byte); socket chunks stay small enough for the
        receiver's allocator to recycle."""
        return self.config.shm_chunk_bytes if dst in self._shm.peers else self.config.chunk_bytes

    def whole_bytes(self, dst: int) -> int:
        """The largest array sent to ``dst`` as one chunk: ``whole_message_bytes``, or one
        shared-memory slot where that is smaller (a chunk to a peer on this host must fit a
        slot of its ring: post_chunk refuses a bigger one)."""
        whole = self.config.whole_message_bytes
        return min(whole, self.config.shm_chunk_bytes) if dst in self._shm.peers else whole

    def recv(self, src: int, channel: int, seq: int, *, deadline: float,
             operation: Any) -> tuple[Header, Any, Any]:
        """The next message in mailbox ``(src, channel, seq)`` as (header, payload, release):
        ``payload`` is a buffer (a ZeroMQ frame or a shared-memory slot), ``release`` is None
        or a callable to invoke once the payload has been consumed. Raises PeerLost /
        ProtocolError / OperationTimeout naming this rank, ``src``, its address and
        ``operation``."""
        if src not in self._links:
            self.connect(src)
        key = (src, channel, seq)
        item = self.inbox.take(key)
        if item is None:
            # For a peer that asks (STATUS); and a chunk of another call may have come already.
            mismatch = self.activity.waiting(channel, seq, src)
            if mismatch is not None:
                raise ProtocolError(f"rank {self.rank}: {mismatch}")
            if key != self._armed and log.isEnabledFor(logging.DEBUG):   # not per chunk
                self._armed = key
                log.debug("rank %d: %s: waiting on rank %d (channel %d, sequence %d), timeout "
                          "in %.3gs", self.rank, operation, src, channel, seq,
                          deadline - time.monotonic())
        if item is None:
            # Wanted meanwhile: a source paused for what all sources hold together is let go
            # on, so what it has for this operation is not stuck behind the pause.
            inbox = self.inbox
            inbox.want(src)
            now = time.monotonic()
            try:
                if deadline - now > defaults.LONG_WAIT:   # it may last: say so if it does
                    item = self._wait(key, now + defaults.LONG_WAIT)
                    if item is None and not self._closed:
                        LongWait(lambda: describe_wait(self, src, operation, channel, seq), now,
                                 deadline, timeout=getattr(operation, "timeout", None)).check()
                if item is None:
                    item = self._wait(key, deadline)
            finally:
                inbox.unwant(src)
                self.recorder.waited_on(src, time.monotonic() - now)
        if type(item) is tuple:
            return item
        raise self._wait_error(item, src, operation, channel, seq)

    def _wait(self, key: tuple, until: float) -> Any:
        """What mailbox ``key`` holds by ``until`` (None: nothing), read from the socket in
        this thread while no other does (pump), else as the I/O thread delivers it."""
        if self.pump(key, until):
            return self.inbox.get(key, until)
        return self._loop.wait_on_inbox(self.inbox.get, key, until)

    def wait_any(self, keys, deadline: float):
        """The first of the mailboxes ``keys`` that holds a message or an error, or None at
        ``deadline`` or on close (see Inbox.wait_any). Counted as a waiting caller, so a
        caller that reads the socket hands it back to the I/O thread when it is done."""
        return self._loop.wait_on_inbox(self.inbox.wait_any, keys, deadline)

    def abort(self, dsts, channel: int, seq: int, reason: str, lost_rank: int | None = None,
              late_rank: int | None = None, view_change: bool = False) -> None:
        """Tell peers that operation ``(channel, seq)`` is abandoned, so they raise instead of
        waiting out their timeout; with ``lost_rank`` they raise PeerLost naming that rank,
        with ``late_rank`` OperationTimeout naming the rank found missing; with ``view_change``
        or after interrupt(), ViewChanging (a membership change ended it: nobody was lost)."""
        if self.interrupted or view_change:
            reason = f"view:{reason}"
        elif lost_rank is not None:
            reason = f"lost:{lost_rank}|{reason}"
            self._loop.goodbye_cause = reason   # until an operation succeeds
        elif late_rank is not None:
            reason = f"late:{late_rank}|{reason}"
        header = encode_header(Header(ABORT, self.rank, channel, seq, reason[:250]))
        for dst in dsts:
            if dst != self.rank and self.inbox.lost(dst) is None:
                try:
                    self.send(dst, header)
                except PeerLost:
                    pass

    def succeeded(self) -> None:
        """An operation of this peer completed: a close from now on is not for a loss."""
        self._loop.goodbye_cause = ""

    def retire(self, channel: int, seq: int, srcs, *, ended: bool = False) -> None:
        """End mailbox ``(src, channel, seq)`` of each of ``srcs``: later arrivals are dropped as
        stale, and unread shared-memory chunks give their slots back. ``ended``: the
        operation ``(channel, seq)`` ended too (Inbox.begin's twin, under the same lock)."""
        for item in self.inbox.retire_all(channel, seq, srcs, ended=ended):
            if type(item) is tuple and item[2] is not None:
                item[2]()  # free the shared-memory slot of a message never consumed

    def is_lost(self, rank: int) -> bool:
        """True once ``rank`` can deliver no more (it died, closed or failed authentication)."""
        return self.inbox.lost(rank) is not None

    def reached(self, rank: int) -> bool:
        """True once a connection to ``rank`` was established (it may have dropped since):
        until then what is sent to it only waits in a queue."""
        return rank in self._liveness.connected

    def wait_reached(self, rank: int, timeout: float) -> bool:
        """Wait up to ``timeout`` seconds for a connection to ``rank`` to be established
        (woken as soon as it is); True if it was (see reached)."""
        return self._liveness.wait_reached(rank, timeout)

    def lost_ranks(self) -> dict[int, str]:
        """The lost ranks and why: rank -> reason."""
        return {r: lost.reason for r, lost in self.inbox.lost_ranks().items()}

    @property
    def dropped(self) -> int:
        """Messages dropped (malformed, foreign, replayed, stale), all reasons together."""
        return self._drops.count

    @property
    def dropped_by_reason(self) -> dict[str, int]:
        """Dropped messages by reason (malformed, foreign, replay, stale); the live counters."""
        return self._drops.by_reason

    def stats(self) -> dict:
        """A snapshot of this peer's traffic: endpoints, counters per peer and in total, drops,
        lost ranks, refused handshakes, flow control and link emulation, gathered from the
        transport's parts (the one place that reads them all)."""
        counters = self.counters
        zap = self._sockets.zap
        stats = {
            "rank": self.rank,
            "endpoints": dict(self.endpoints),
            "peers": {r: vars(c).copy() for r, c in enumerate(counters)
                      if c.messages_sent or c.messages_received},
            "bytes_sent": sum(c.bytes_sent for c in counters),
            "bytes_received": sum(c.bytes_received for c in counters),
            "messages_sent": sum(c.messages_sent for c in counters),
            "messages_received": sum(c.messages_received for c in counters),
            "dropped": self._drops.count,
            "dropped_by_reason": dict(self._drops.by_reason),
            # Connections cut for bad messages (offenders.py), by the reason of the last one;
            # a sender that reconnects and is cut again counts again.
            "disconnected": self._offenders.count,
            "disconnected_by_reason": dict(self._offenders.by_reason),
            "lost": self.lost_ranks(),
            "authentication_denied": zap.denied if zap else 0,
            # Every refused handshake of the data socket (and of the rendezvous this peer
            # hosted): ZAP's denials, those libzmq refuses before ZAP (no CURVE, another
            # server key, no ZMTP 3), and peers refusing this one ("outbound").
            "handshakes_refused": self.handshakes_refused(),
            "handshakes_refused_by_socket": {"data": dict(self._sockets.refusals.by_reason),
                                             "rendezvous": dict(self._rendezvous_refused)},
            # Flow control of messages for operations not started (flow_control.Holds).
            "holds_sent": dict(self._holds.sent),
            "holds_received": dict(self._holds.received),
            "held_peak": self.inbox.held_peak,
            # What is held for operations not started now, by source and in total, its most,
            # and the bounds (smaller without a cluster key: flow_control.HeldBounds).
            "held": self._held_stats(),
            # The send window (flow_control.Acks): acknowledgements sent and received.
            "acks_sent": self._acks.sent,
            "acks_received": self._acks.received,
            # Per operation (flight_recorder.py): calls, failures, the callers' bytes, seconds
            # and the latency histogram; and the seconds spent waiting on each peer.
            "ops": self.recorder.totals(),
            "waited_seconds": dict(self.recorder.waited),
        }
        if self.config.link is not None:
            # Link emulation (emulation.py): what its pacing held back, all links together.
            stats["link_emulation"] = emulation_stats(
                self.config.link, [link.emulated for link in list(self._links.values())])
        return stats

    def _held_stats(self) -> dict:
        by_link, total = self.inbox.held()
        bounds = self.bounds
        return {"by_link": by_link, "total": total, "peak_total": self.inbox.held_total_peak,
                "peak_link": self.inbox.held_peak, "bound_per_link": bounds.per_link,
                "bound_total": bounds.total, "pause": bounds.pause,
                "window": bounds.window, "keyed": self.config.key is not None}

    def handshakes_refused(self) -> dict[str, int]:
        """Refused handshakes of this peer's data socket, and of the rendezvous it hosted, by
        direction ("inbound": clients refused; "outbound": peers refusing this one)."""
        refused = dict(self._sockets.refusals.by_reason)
        for reason, n in self._rendezvous_refused.items():
            refused[reason] = refused.get(reason, 0) + n
        return refused

    def count_rendezvous_refusals(self, by_reason: dict[str, int]) -> None:
        """Add the refused handshakes of the rendezvous this peer hosted (rendezvous.py, as it
        closes its socket) to this transport's."""
        for reason, n in by_reason.items():
            self._rendezvous_refused[reason] = self._rendezvous_refused.get(reason, 0) + n

    def interrupt(self) -> None:
        """End every wait at once (each raises PeerLost: this peer was closed), leaving the
        sockets up, so aborts still go out: the membership replaces this transport by the
        next view's (collectives/group), and a member waiting here must answer."""
        self.interrupted = True   # what its aborts say from now on (see abort)
        self.inbox.close()

    def drain(self, deadline: float, *, stall: float = defaults.CLOSE_DRAIN_STALL
              ) -> dict[int, tuple[int, int]]:
        """Wait until what this peer queued for each live peer has left (close() drops what is
        still queued; a send returns once queued, so this is what delivers a job's last sends,
        as MPI_Finalize does). A peer is waited on while it takes what is queued for it: one
        that takes nothing for ``stall`` seconds (it paused this peer and its application
        does not read), or is lost, is given up, and so is every peer at ``deadline``. Says
        once at WARNING on the events logger, past LONG_WAIT, whom it waits on. Returns what
        is still queued for the peers given up: rank -> (messages, bytes)."""
        # What link emulation holds goes now, as close() lets it (on a real network it
        # would be in flight already).
        self._loop.command(("unpace",))
        start = time.monotonic()
        moved: dict[int, tuple[tuple[int, int], float]] = {}   # rank -> (mark, when)
        waiting: dict[int, tuple[int, int]] = {}
        notice = LongWait(lambda: f"rank {self.rank}: close() waits for "
                          + ", ".join(f"rank {r} to take {m} queued messages ({b} bytes)"
                                      for r, (m, b) in waiting.items()),
                          start, deadline)
        while True:
            now = time.monotonic()
            waiting, stalled = {}, {}
            for rank, link in list(self._links.items()):
                backlog = link.backlog()
                if not backlog[0] or self.is_lost(rank):
                    continue
                mark = (backlog[0], link.sent_number)
                if rank not in moved or moved[rank][0] != mark:
                    moved[rank] = (mark, now)
                if now - moved[rank][1] >= stall or now >= deadline:
                    stalled[rank] = backlog
                else:
                    waiting[rank] = backlog
            if not waiting:
                return stalled
            notice.check()
            time.sleep(max(0.0, notice.until(now + defaults.DRAIN_LOOK) - now))

    def close(self, timeout: float = defaults.CLOSE_TIMEOUT) -> None:
        """Say goodbye to connected peers, stop the I/O thread, close every socket with
        linger 0 and remove the ipc socket file. Idempotent; returns within about ``timeout``
        even with traffic in flight."""
        with self._close_lock:
            if self._closed:
                return
            self._closed = True
        self._sockets.stop_connecting()
        self._loop.closing()
        self._shm.closing()
        self._shm.wait_mapped(time.monotonic() + timeout * defaults.RING_MAPPED_SHARE)
        self._loop.stop(timeout)
        self.inbox.close()
        self._drops.tick(final=True)   # what the throttled logs have not said yet
        self._offenders.tick(final=True)
        self._sockets.destroy(timeout)
        self._loop.close_pipe()

    closed = property(lambda self: self._closed, doc="True once close() began.")

    # ------------------------------------------------------------------ errors
    def _wait_error(self, item, src: int, operation: Any, channel: int = -1,
                    seq: int = -1) -> Exception:
        return wait_error(self, item, src, operation, channel, seq)

    def connecting(self, rank: int) -> bool:
        """True while the connection to ``rank`` is younger than a silent peer is given: not
        reached yet is no sign of a dead peer then."""
        link = self._links.get(rank)
        return (link is not None and time.monotonic() - link.created
                < self.config.effective_heartbeat_timeout)
