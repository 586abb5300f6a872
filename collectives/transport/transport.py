"""One peer's ZeroMQ transport: a bound ROUTER for everything inbound, one DEALER per peer it
talks to, and one background I/O thread that owns every socket.

Data always flows DEALER(src) -> ROUTER(dst). A DEALER's routing id is ``gossip:<rank>``, so the
ROUTER knows which peer a message came from; the header's ``src`` must agree or the message is
dropped as foreign. Liveness comes from the DEALERs: libzmq's ZMTP heartbeats (answered by the
remote libzmq thread, so a peer busy in Python still answers) drop a silent connection after
``heartbeat_timeout``, a dead process drops it at once, and a socket monitor turns the drop into
``PeerLost`` for every operation waiting on that peer. A receive from a peer therefore first
connects to it, even when this peer never sends to it.

The I/O thread owns the sockets. A calling thread may borrow an outgoing connection for one send
under its lock when nothing is queued on it (see collectives/transport/link.py): the common case leaves at
once, without a wake-up of the I/O thread. Everything else (queued sends, connection set-up,
closing) goes to the I/O thread as commands on a lock-free deque, with a pipe to wake it only
when it is asleep.
"""
from __future__ import annotations

import logging
import os
import socket as pysocket
import tempfile
import threading
import time
import uuid
from collections import deque
from dataclasses import dataclass, field
from typing import Any

import zmq

from collectives.config import TransportConfig
from collectives.errors import (AuthenticationError, OperationTimeout, PeerLost, ProtocolError,
                                RendezvousError)
from collectives.transport.inbox import Inbox, Lost, SlotError
from collectives.transport.link import Link
from collectives.transport.receiving import IDENTITY_PREFIX, Receiving
from collectives.security import ZapHandler
from collectives.transport.shm import ShmRing, ShmView, ring_name, shm_supported
from collectives.transport.wire import (ABORT, BYE, DATA, SHM, SHM_MAPPED, SHM_OPEN, STARVED, Header,
                              encode_header)

__all__ = ["Transport", "PeerCounters", "SendTicket", "host_id"]

log = logging.getLogger("collectives")

_MONITOR_EVENTS = (zmq.EVENT_DISCONNECTED | zmq.EVENT_HANDSHAKE_SUCCEEDED
                   | zmq.EVENT_HANDSHAKE_FAILED_AUTH | zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL
                   | zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL)
# Chunks up to this size travel inside the message, copied: cheaper than a shared-memory slot
# or a zero-copy frame with its tracker (pyzmq copies below 64 KiB anyway).
_INLINE_BYTES = 32 * 1024
_STARVED_REPEAT = 0.05  # seconds between two STARVED messages while a ring stays full


def host_id() -> str:
    """Identifies a host *and* network namespace: ipc sockets only work between peers that
    share both (network-namespace test hosts share the hostname and boot id)."""
    try:
        boot = open("/proc/sys/kernel/random/boot_id").read().strip()
    except OSError:
        boot = ""
    try:
        netns = str(os.stat("/proc/self/ns/net").st_ino)
    except OSError:
        netns = ""
    return f"{pysocket.gethostname()}/{boot}/{netns}"


@dataclass
class PeerCounters:
    """Traffic with one peer, as counted by this peer's I/O thread."""
    bytes_sent: int = 0
    messages_sent: int = 0
    bytes_received: int = 0
    messages_received: int = 0


@dataclass
class SendTicket:
    """Completion of one queued send: ``queued`` is set once libzmq has the message; then
    ``tracker`` (if tracking was asked for) says when libzmq no longer reads the buffer."""
    queued: threading.Event = field(default_factory=threading.Event)
    tracker: Any = None
    error: Exception | None = None

    def wait(self, deadline: float) -> bool:
        """True when the buffer may be reused; False at the deadline. Raises the send's error."""
        if not self.queued.wait(max(0.0, deadline - time.monotonic())):
            return False
        if self.error is not None:
            raise self.error
        if self.tracker is None:
            return True
        try:
            self.tracker.wait(max(1e-3, deadline - time.monotonic()))
        except zmq.NotDone:
            return False
        return True


class Transport(Receiving):
    """Point-to-point messaging for one peer. ``send`` is asynchronous (queued to the I/O
    thread, zero-copy); ``recv`` waits on the inbox slot ``(src, channel, seq)`` with a
    deadline. Higher layers (collectives, rendezvous) build on these two calls."""

    def __init__(self, rank: int, world_size: int, config: TransportConfig | None = None) -> None:
        if not 0 <= rank < world_size:
            raise ValueError(f"rank {rank} is outside world size {world_size}")
        self.rank = rank
        self.world_size = world_size
        self.config = config or TransportConfig()
        self.inbox = Inbox()
        self.counters = [PeerCounters() for _ in range(world_size)]
        self.dropped = 0
        self.dropped_by_reason: dict[str, int] = {}
        self._drops_logged_at = (0.0, 0)  # (when, drop count) of the last drop log line
        self._heard = [0] * world_size  # last message number accepted from each source
        self._identity_ranks = {IDENTITY_PREFIX + str(r).encode(): r for r in range(world_size)}
        self._closed = False
        self._close_lock = threading.Lock()
        self._table: dict[int, dict] = {}
        self._addresses: dict[int, str] = {}
        self._links: dict[int, Link] = {}           # outgoing connections, by destination
        self._links_lock = threading.Lock()
        self._connected: set[int] = set()
        self._shm_peers: set[int] = set()          # ranks whose payloads go through shm
        self._ring_mapped: dict[int, threading.Event] = {}  # our rings the receiver has mapped
        self._views: dict[int, ShmView] = {}       # peers' rings, by source (I/O thread)
        self._shm_blocked: set[Link] = set()       # links waiting for a free slot
        self._unanswered: deque = deque()          # rings mapped before we had the table
        self._cmds: deque = deque()
        self._asleep = False
        self._wake_r, self._wake_w = os.pipe()
        os.set_blocking(self._wake_r, False)
        os.set_blocking(self._wake_w, False)

        self.context = zmq.Context()
        self._zap = ZapHandler(self.context, self.config.key) if self.config.key else None
        self._router = self._socket(zmq.ROUTER, server=True)
        self._router.rcvhwm = self.config.recv_hwm
        # libzmq allocates a frame before we can look at its header: cap what a connection
        # may make us allocate. Legitimate frames are chunks of at most whole_message_bytes
        # (or chunk_bytes); the margin tolerates peers configured differently. Bigger frames
        # make libzmq drop that connection.
        self._router.maxmsgsize = max(64 << 20, 4 * max(self.config.whole_message_bytes,
                                                        self.config.chunk_bytes))
        self._ipc_path: str | None = None
        self.endpoints = self._bind()
        # The ROUTER is read by whichever thread holds _rx_lock (see Receiving).
        self._rx_lock = threading.Lock()
        self._rx_fd = self._router.getsockopt(zmq.FD)
        self._rx_parked = False
        self._rx_park_s = 0.0  # how long the parked I/O thread waits before it looks again
        self._rx_waiting = 0  # callers waiting on the inbox while another reads the socket
        self._rx_count_lock = threading.Lock()
        self._rx_more = True  # read once at start: the descriptor only signals changes
        # Owned by the I/O thread from here on.
        self._poller = zmq.Poller()
        self._pollout: dict[zmq.Socket, Link] = {}  # links whose socket is full
        self._monitors: dict[zmq.Socket, int] = {}
        self._suspects: dict[int, float] = {}  # rank -> when its dropped connection counts
        self._thread = threading.Thread(target=self._run, name=f"gossip-io-r{rank}", daemon=True)
        self._thread.start()

    # ------------------------------------------------------------------ set-up
    def _socket(self, kind: int, *, server: bool = False) -> zmq.Socket:
        sock = self.context.socket(kind)
        sock.linger = 0
        if self.config.socket_buffer_bytes:
            sock.sndbuf = sock.rcvbuf = self.config.socket_buffer_bytes
        hb = self.config
        sock.setsockopt(zmq.HEARTBEAT_IVL, int(hb.effective_heartbeat_interval * 1000))
        sock.setsockopt(zmq.HEARTBEAT_TIMEOUT, int(hb.effective_heartbeat_timeout * 1000))
        sock.setsockopt(zmq.HEARTBEAT_TTL, int(hb.effective_heartbeat_timeout * 1000))
        if self.config.key is not None:
            if server:
                self.config.key.apply_server(sock)
            else:
                self.config.key.apply_client(sock)
        return sock

    def _bind(self) -> dict:
        cfg = self.config
        lo, hi = cfg.data_ports
        try:
            # max_port is exclusive; a narrow range is tried port by port at most 200 times.
            port = self._router.bind_to_random_port(f"tcp://{cfg.bind_host}", min_port=lo,
                                                    max_port=hi + 1, max_tries=200)
        except zmq.ZMQError as exc:
            raise RendezvousError(f"rank {self.rank}: cannot bind a data socket on "
                                  f"{cfg.bind_host} in ports {lo}-{hi} (GOSSIP_PORT_RANGE): "
                                  f"{exc}") from None
        advertise = cfg.advertise_host or cfg.bind_host
        endpoints = {"tcp": f"tcp://{advertise}:{port}", "ipc": None, "host": host_id(),
                     "shm": cfg.transport in ("auto", "shm") and shm_supported()}
        if cfg.transport in ("auto", "ipc", "shm"):
            path = os.path.join(tempfile.gettempdir(),
                                f"gossip-{os.getpid()}-r{self.rank}-{uuid.uuid4().hex[:8]}.sock")
            try:
                self._router.bind(f"ipc://{path}")
                self._ipc_path = path
                endpoints["ipc"] = f"ipc://{path}"
            except zmq.ZMQError as exc:
                if cfg.transport in ("ipc", "shm"):
                    raise RendezvousError(f"rank {self.rank}: cannot bind ipc://{path}: {exc}")
                log.info("rank %d: no ipc endpoint (%s); using tcp only", self.rank, exc)
        return endpoints

    def set_peers(self, table: dict[int, dict]) -> None:
        """Install the endpoint table from the rendezvous: rank -> {tcp, ipc, host}."""
        me = self.endpoints["host"]
        mode = self.config.transport
        for rank, entry in table.items():
            same_host = entry.get("host") == me
            use_ipc = entry.get("ipc") and mode != "tcp" and (mode == "ipc" or same_host)
            self._addresses[rank] = entry["ipc"] if use_ipc else entry["tcp"]
            if (rank != self.rank and same_host and entry.get("shm") and self.endpoints["shm"]
                    and mode in ("auto", "shm")):
                self._shm_peers.add(rank)
            elif mode == "shm" and rank != self.rank:
                raise RendezvousError(f"rank {self.rank}: transport 'shm' needs every peer on "
                                      f"this host with shared memory, but rank {rank} "
                                      f"({entry.get('tcp')}) is not")
        self._table = dict(table)
        while self._unanswered:
            self._send_quietly(self._unanswered.popleft(),
                               encode_header(SHM_MAPPED, self.rank, 0, 0))

    def address(self, rank: int) -> str:
        return self._addresses.get(rank, "<unknown address>")

    # ------------------------------------------------------------------ user-thread API
    def connect(self, rank: int) -> Link:
        """The outgoing connection to ``rank``, opened on first use; it carries sends and
        tells when the peer dies, so a receive from a peer connects to it too."""
        link = self._links.get(rank)
        if link is not None:
            return link
        with self._links_lock:
            link = self._links.get(rank)
            if link is not None:
                return link
            if self._closed:
                raise PeerLost(f"rank {self.rank}: connection to rank {rank} after close()",
                               rank=rank)
            if rank not in self._addresses:
                raise ValueError(f"rank {self.rank}: no address for rank {rank}; the rendezvous "
                                 f"table has ranks {sorted(self._addresses)}")
            dealer = self._socket(zmq.DEALER)
            dealer.routing_id = IDENTITY_PREFIX + str(self.rank).encode()
            dealer.sndhwm = self.config.send_hwm
            dealer.setsockopt(zmq.RECONNECT_IVL, 200)
            monitor = dealer.get_monitor_socket(_MONITOR_EVENTS)
            dealer.connect(self.address(rank))
            link = Link(rank, dealer, monitor, self._count_sent)
            if rank in self._shm_peers:
                link.ring = ShmRing(self.config.shm_slots, self.config.shm_chunk_bytes,
                                    ring_name(self.rank, rank))
                self._ring_mapped[rank] = threading.Event()
                # The first message on the link, so it arrives before any chunk in the ring.
                link.send((encode_header(SHM_OPEN, self.rank, 0, 0,
                                         link.ring.announcement()),), None)
            self._links[rank] = link
        self._command(("watch", link))  # the I/O thread polls the monitor (and the queue)
        return link

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

    def post_chunk(self, dst: int, channel: int, seq: int, op: str, dtype: str,
                   shape: tuple, nbytes: int, offset: int, payload: Any, *, deadline: float,
                   track: bool = False) -> SendTicket | None:
        """Send one chunk of an array (bytes ``[offset, offset + len(payload))``) to ``dst``.

        To a peer on this host the chunk is copied into a shared-memory slot (or, if none is
        free, queued until one is; the ticket then says when the buffer was copied); otherwise
        it is sent zero-copy, and with ``track`` the ticket says when the buffer may change.
        Never blocks: a full ring or socket queues, in order."""
        if self._closed:
            raise PeerLost(f"rank {self.rank}: send to rank {dst} after close()", rank=dst)
        length = payload.nbytes if isinstance(payload, memoryview) else len(payload)
        link = self._links.get(dst) or self.connect(dst)
        if length <= _INLINE_BYTES:
            # Small: ZeroMQ copies it anyway, so the buffer is free at once (no tracking).
            # Straight to the link: this is the path of every latency-bound operation.
            if link.send((encode_header(DATA, self.rank, channel, seq, op, dtype, shape, nbytes,
                                        offset, length), bytes(payload)), None):
                self._command(("flush", link))
            return None
        if link.ring is not None:
            ticket = SendTicket() if track else None
            fields = (SHM, self.rank, channel, seq, op, dtype, shape, nbytes, offset, length)
            queued, wake = link.post_shm(fields, payload, ticket)
            if link.closed:
                raise PeerLost(f"rank {self.rank}: send to rank {dst} after close()", rank=dst)
            if not queued:
                ticket = None  # copied already: the buffer is free
            if wake:
                self._command(("flush", link))
            return ticket
        ticket = SendTicket() if track else None
        self.send(dst, encode_header(DATA, self.rank, channel, seq, op, dtype, shape, nbytes,
                                     offset, length), payload, ticket=ticket)
        return ticket

    def chunk_bytes(self, dst: int) -> int:
        """How big the chunks sent to ``dst`` are: shared-memory slots are cheap to fill in
        bigger pieces (fewer messages per byte); socket chunks stay small enough for the
        receiver's allocator to recycle."""
        return self.config.shm_chunk_bytes if dst in self._shm_peers else self.config.chunk_bytes

    def recv(self, src: int, channel: int, seq: int, *, deadline: float,
             operation: Any) -> tuple[Header, Any, Any]:
        """The next message in slot ``(src, channel, seq)`` as (header, payload, release):
        ``payload`` is a buffer (a ZeroMQ frame or a shared-memory slot), ``release`` is None
        or a callable to invoke once the payload has been consumed. Raises PeerLost /
        ProtocolError / OperationTimeout naming this rank, ``src``, its address and
        ``operation``."""
        if src not in self._links:
            self.connect(src)
        key = (src, channel, seq)
        item = self.inbox.take(key)
        if item is None and self._pump(key, deadline):
            item = self.inbox.get(key, deadline)
        elif item is None:
            with self._rx_count_lock:
                self._rx_waiting += 1
            try:
                item = self.inbox.get(key, deadline)
            finally:
                with self._rx_count_lock:
                    self._rx_waiting -= 1
        if type(item) is tuple:
            return item
        raise self._wait_error(item, src, operation)

    def wait_any(self, keys, deadline: float):
        """The first of the inbox slots ``keys`` that holds a message or an error, or None at
        ``deadline`` or on close (see Inbox.wait_any). Counted as a waiting caller, so a
        caller that reads the socket hands it back to the I/O thread when it is done."""
        with self._rx_count_lock:
            self._rx_waiting += 1
        try:
            return self.inbox.wait_any(keys, deadline)
        finally:
            with self._rx_count_lock:
                self._rx_waiting -= 1

    def abort(self, dsts, channel: int, seq: int, reason: str,
              lost_rank: int | None = None) -> None:
        """Tell peers that operation ``(channel, seq)`` is abandoned, so they raise instead of
        waiting out their timeout; with ``lost_rank`` they raise PeerLost naming that rank."""
        if lost_rank is not None:
            reason = f"lost:{lost_rank}|{reason}"
        header = encode_header(ABORT, self.rank, channel, seq, reason[:250])
        for dst in dsts:
            if dst != self.rank and self.inbox.lost(dst) is None:
                try:
                    self.send(dst, header)
                except PeerLost:
                    pass

    def retire(self, channel: int, seq: int, srcs) -> None:
        for src in srcs:
            for item in self.inbox.retire((src, channel, seq)):
                if type(item) is tuple and item[2] is not None:
                    item[2]()  # free the shared-memory slot of a message never consumed

    def is_lost(self, rank: int) -> bool:
        return self.inbox.lost(rank) is not None

    def reached(self, rank: int) -> bool:
        """True once a connection to ``rank`` was established (it may have dropped since):
        until then what is sent to it only waits in a queue."""
        return rank in self._connected

    def lost_ranks(self) -> dict[int, str]:
        return {r: lost.reason for r, lost in self.inbox.lost_ranks().items()}

    def stats(self) -> dict:
        return {
            "rank": self.rank,
            "endpoints": dict(self.endpoints),
            "peers": {r: vars(c).copy() for r, c in enumerate(self.counters)
                      if c.messages_sent or c.messages_received},
            "bytes_sent": sum(c.bytes_sent for c in self.counters),
            "bytes_received": sum(c.bytes_received for c in self.counters),
            "messages_sent": sum(c.messages_sent for c in self.counters),
            "messages_received": sum(c.messages_received for c in self.counters),
            "dropped": self.dropped,
            "dropped_by_reason": dict(self.dropped_by_reason),
            "lost": self.lost_ranks(),
            "authentication_denied": self._zap.denied if self._zap else 0,
        }

    def close(self, timeout: float = 1.0) -> None:
        """Say goodbye to connected peers, stop the I/O thread, close every socket with
        linger 0 and remove the ipc socket file. Idempotent; returns within about ``timeout``
        even with traffic in flight."""
        with self._close_lock:
            if self._closed:
                return
            self._closed = True
        # A receiver maps our ring through /proc/<our pid>/fd when it first hears of it; if we
        # exit before that, what we left in the ring is gone. Wait (briefly) for live peers.
        end = time.monotonic() + timeout / 2
        for rank, mapped in list(self._ring_mapped.items()):
            while (not mapped.is_set() and self.inbox.lost(rank) is None
                   and time.monotonic() < end):
                mapped.wait(0.01)
        self._command(("close",))
        self._thread.join(timeout)
        if self._thread.is_alive():
            log.warning("rank %d: I/O thread did not stop within %.1fs", self.rank, timeout)
        self.inbox.close()
        try:
            self.context.destroy(linger=0)
        except zmq.ZMQError:
            pass
        for fd in (self._wake_r, self._wake_w):
            try:
                os.close(fd)
            except OSError:
                pass
        if self._ipc_path:
            try:
                os.unlink(self._ipc_path)
            except FileNotFoundError:
                pass

    @property
    def closed(self) -> bool:
        return self._closed

    # ------------------------------------------------------------------ errors
    def _wait_error(self, item, src: int, operation: Any) -> Exception:
        operation = str(operation)  # a string, or an object worded only now (a p2p Call)
        where = f"rank {self.rank}: {operation}: rank {src} at {self.address(src)}"
        if isinstance(item, SlotError):
            if item.lost_rank is not None:
                # Lead with the rank that was lost; the peer that relayed the news comes second.
                lost = item.lost_rank
                return PeerLost(f"rank {self.rank}: {operation}: lost rank {lost} at "
                                f"{self.address(lost)} (reported by rank {src}): {item.message}",
                                rank=lost, address=self.address(lost), operation=operation)
            return ProtocolError(f"{where}: {item.message}")
        if isinstance(item, Lost):
            if item.kind == "auth":
                return AuthenticationError(f"{where}: {item.reason}")
            return PeerLost(f"{where}: {item.reason}", rank=src, address=self.address(src),
                            operation=operation)
        # Deadline passed: a peer we never reached (for as long as a silent peer is given) is
        # lost; one that answers heartbeats is merely late (still computing, or it never made
        # the matching call).
        link = self._links.get(src)
        connecting = (link is not None and time.monotonic() - link.created
                      < self.config.effective_heartbeat_timeout)
        if src not in self._connected and not connecting:
            return PeerLost(f"{where}: never reachable within the timeout", rank=src,
                            address=self.address(src), operation=operation)
        return OperationTimeout(f"{where}: alive but sent nothing for this operation within "
                                f"the timeout (is it still computing, or did it make a "
                                f"different call?)", rank=src, address=self.address(src),
                                operation=operation)

    # ------------------------------------------------------------------ I/O thread
    def _command(self, cmd: tuple) -> None:
        self._cmds.append(cmd)
        # The I/O thread sets _asleep before its last look at the queue, so either it sees
        # this command or we see _asleep and wake it: no lost wake-up.
        if self._asleep:
            try:
                os.write(self._wake_w, b"x")
            except (BlockingIOError, OSError):
                pass  # pipe full (a wake-up is pending anyway) or already closed

    def _run(self) -> None:
        poller = self._poller
        poller.register(self._rx_fd, zmq.POLLIN)
        poller.register(self._wake_r, zmq.POLLIN)
        if self._zap:
            poller.register(self._zap.socket, zmq.POLLIN)
        try:
            while True:
                if not self._drain_commands():
                    break
                self._asleep = True
                if self._cmds:
                    self._asleep = False
                    continue
                timeout = (0 if self._rx_more else 1 if self._shm_blocked
                           else self._rx_park_s * 1000 if self._rx_parked
                           else 50 if self._suspects else 100)
                events = dict(poller.poll(timeout))
                self._asleep = False
                if self._suspects:
                    self._declare_lost()
                if self._shm_blocked:
                    for link in list(self._shm_blocked):
                        self._flush(link)
                if self._wake_r in events:
                    try:
                        os.read(self._wake_r, 4096)
                    except BlockingIOError:
                        pass
                if self._rx_more or self._rx_parked or self._rx_fd in events:
                    self._io_receive()
                if self._zap and self._zap.socket in events:
                    self._zap.handle()
                for sock in events:
                    rank = self._monitors.get(sock)
                    if rank is not None:
                        self._monitor_event(sock, rank)
                    elif sock in self._pollout:
                        self._flush(self._pollout[sock])
        except Exception:  # the I/O thread must never die silently
            log.exception("rank %d: I/O thread failed", self.rank)
            for r in range(self.world_size):
                self.inbox.mark_lost(r, Lost("this peer's I/O thread failed (see log)"))
        finally:
            self._shutdown_sockets()

    def _drain_commands(self) -> bool:
        cmds = self._cmds
        while cmds:
            cmd = cmds.popleft()
            kind = cmd[0]
            if kind == "flush":
                self._flush(cmd[1])
            elif kind == "watch":
                link = cmd[1]
                self._monitors[link.monitor] = link.rank
                self._poller.register(link.monitor, zmq.POLLIN)
                self._flush(link)
            elif kind == "rx":
                self._io_receive()
            elif kind == "close":
                for link in list(self._links.values()):
                    self._flush(link)  # what was queued before close() still goes out
                self._say_goodbye()
                return False
        return True

    def _flush(self, link: Link) -> None:
        lost = self.inbox.lost(link.rank)
        state = link.flush(None if lost is None else _failer(PeerLost(
            f"rank {self.rank}: send to rank {link.rank} at {self.address(link.rank)}: "
            f"{lost.reason}", rank=link.rank)))
        self._shm_blocked.discard(link)
        if state == "slot":
            self._shm_blocked.add(link)  # wait for a CREDIT, or the next millisecond's look
            now = time.monotonic()
            if now - link.starved_since > _STARVED_REPEAT:
                # Slots may be held by chunks of operations the receiver has not started:
                # ask it to copy those out, or they could block this one for good.
                if link.send_urgent((encode_header(STARVED, self.rank, 0, 0),)):
                    link.starved_since = now
        if state == "pollout":
            if link.sock not in self._pollout:
                self._pollout[link.sock] = link
                self._poller.register(link.sock, zmq.POLLOUT)
        elif link.sock in self._pollout:
            # Unregistered under no lock: only the I/O thread polls, and a calling thread
            # sends directly only once the queue is empty, which this flush just made it.
            del self._pollout[link.sock]
            self._poller.unregister(link.sock)

    def _say_goodbye(self) -> None:
        bye = (encode_header(BYE, self.rank, 0, 0),)
        for link in list(self._links.values()):
            link.send(bye, None)
            for ticket in link.pending_tickets():
                ticket.error = PeerLost(f"rank {self.rank}: closed with a send to rank "
                                        f"{link.rank} still queued", rank=link.rank)
                ticket.queued.set()

    def _shutdown_sockets(self) -> None:
        with self._links_lock:
            links = list(self._links.values())
        for link in links:
            # A short linger lets the goodbye out; a dead peer cannot hold us longer.
            link.close(linger_ms=50)
        # A caller may be reading the socket: it lets go within _PUMP_SLICE_S once closed.
        with self._rx_lock:
            self._router.close(linger=0)
            for view in self._views.values():
                view.close()
            self._views.clear()
        if self._zap:
            self._zap.close()


def _failer(error: Exception):
    """What a lost peer's queued sends get instead of going out: their error."""
    def fail(ticket) -> None:
        if ticket is not None:
            ticket.error = error
            ticket.queued.set()
    return fail
