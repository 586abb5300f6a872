"""The I/O loop of one peer: the background thread that owns the sockets, the commands other
threads give it, and who reads the ROUTER when (leader/follower).

Commands (flush a link's queue, watch a new link, read the ROUTER, close) go on a lock-free
deque, with a pipe to wake the thread only when it is asleep. A calling thread may borrow an
outgoing connection for one send under its lock when nothing is queued on it (see link.py):
the common case leaves at once, without a wake-up of the I/O thread.

Who reads the ROUTER: the I/O thread, or a caller waiting in recv(). A waiting caller that finds
the socket free reads it itself (``pump``), so a message reaches the operation waiting for it
without a hand-off between threads (about 40 us of two thread wake-ups per message on a loaded
2-core machine); whatever else arrives meanwhile is handled as the I/O thread would.
``_rx_lock`` is the memory fence that lets the socket move between threads. The I/O thread
watches the socket's signalling file descriptor (not the socket, which it may not touch without
the lock); when a caller holds the socket the I/O thread stops watching it ("parks") until the
caller hands it back, and the caller always leaves the socket drained, so its descriptor
signals again on the next arrival.
"""
from __future__ import annotations

import logging
import math
import os
import threading
import time
from collections import deque
from typing import Any, Callable

import zmq

from collectives import defaults
from collectives.errors import PeerLost
from collectives.notices import events
from collectives.transport.inbox import Inbox, Lost
from collectives.transport.liveness import Liveness
from collectives.transport.sockets import Sockets
from collectives.transport.wire import BYE, Channel, Header, encode_header

__all__ = ["IoLoop"]

log = logging.getLogger("collectives")

_EVENTS, _POLLIN, _NOBLOCK = int(zmq.EVENTS), int(zmq.POLLIN), int(zmq.NOBLOCK)
_PUMP_SLICE_MS = int(defaults.PUMP_SLICE * 1000)
_SLOT_RETRY_MS = defaults.SLOT_RETRY * 1000
_SUSPECT_POLL_MS = defaults.SUSPECT_POLL * 1000
_IDLE_POLL_MS = defaults.IDLE_POLL * 1000


class IoLoop:
    """The I/O thread and the ROUTER's reader lock. Made first, started once the arrivals
    handler and the shared-memory protocol exist (``start``)."""

    def __init__(self, rank: int, world_size: int, sockets: Sockets, inbox: Inbox,
                 liveness: Liveness) -> None:
        self.rank = rank
        self._world_size = world_size
        self._sockets = sockets
        self._inbox = inbox
        self._liveness = liveness
        self._handle: Callable[[list], None] | None = None  # what arrives (Arrivals.handle)
        self._ticks: tuple[Callable[[], None], ...] = ()  # the throttled logs' (start)
        self._shm: Any = None
        self._closing = False
        # "lost:<rank>|<why>" while this peer's last operation failed for a lost peer: the
        # goodbye carries it, so a peer still waiting on this one blames the rank that was
        # lost, not this one for leaving (Transport.abort sets it, a success clears it).
        self.goodbye_cause = ""
        self._cmds: deque = deque()
        self._asleep = False
        self._wake_r, self._wake_w = os.pipe()
        os.set_blocking(self._wake_r, False)
        os.set_blocking(self._wake_w, False)
        self._router = sockets.router
        self._rx_lock = threading.Lock()
        self._rx_fd = self._router.getsockopt(zmq.FD)
        self._rx_parked = False
        self._rx_park_s = 0.0  # how long the parked I/O thread waits before it looks again
        self._rx_waiting = 0  # callers waiting on the inbox while another reads the socket
        self._rx_count_lock = threading.Lock()
        self._rx_more = True  # read once at start: the descriptor only signals changes
        # Owned by the I/O thread from here on.
        self._poller = zmq.Poller()
        self._pollout: dict[zmq.Socket, Any] = {}  # links whose socket is full
        # Links whose head message is held by link emulation (emulation.py), by release time:
        # the poll's timeout is the earliest, so nothing spins and nothing is late.
        self._paced: dict[Any, float] = {}
        self._thread = threading.Thread(target=self._run, name=f"gossip-io-r{rank}", daemon=True)

    def start(self, handle: Callable[[list], None], shm,
              ticks: tuple[Callable[[], None], ...] = ()) -> None:
        """Run the I/O thread: ``handle(frames)`` for every message read from the ROUTER;
        ``shm`` (SharedMemory) for links blocked on a full ring and its mappings at exit;
        ``ticks``, the throttled logs' (their summaries due), at least every IDLE_POLL."""
        self._handle = handle
        self._shm = shm
        self._ticks = ticks
        self._blocked = shm.blocked
        self._thread.start()

    # ------------------------------------------------------------------ any thread
    def command(self, cmd: tuple) -> None:
        """Queue ``cmd`` for the I/O thread (from any thread, without a lock), waking the thread if
        it sleeps."""
        self._cmds.append(cmd)
        # The I/O thread sets _asleep before its last look at the queue, so either it sees
        # this command or we see _asleep and wake it: no lost wake-up.
        if self._asleep:
            try:
                os.write(self._wake_w, b"x")
            except (BlockingIOError, OSError):
                pass  # pipe full (a wake-up is pending anyway) or already closed

    def request_flush(self, link) -> None:
        """Ask the I/O thread to flush ``link``: from another thread, as flushing is the I/O
        thread's."""
        self.command(("flush", link))

    def in_loop(self) -> bool:
        """True in the I/O thread itself, where flush() may be called directly."""
        return threading.get_ident() == self._thread.ident

    def wait_on_inbox(self, wait: Callable, *args) -> Any:
        """``wait(*args)`` counted as a caller waiting on the inbox, so a caller that reads the
        socket hands it back to the I/O thread when it is done."""
        with self._rx_count_lock:
            self._rx_waiting += 1
        try:
            return wait(*args)
        finally:
            with self._rx_count_lock:
                self._rx_waiting -= 1

    def pump(self, key, deadline: float) -> bool:
        """Read the ROUTER in this thread until mailbox ``key`` has something (or an error),
        ``deadline`` passes or the transport closes; False at once if another thread is
        reading it (that thread, or the I/O thread, delivers to the inbox)."""
        if not self._rx_lock.acquire(blocking=False):
            return False
        more = False
        taken = time.monotonic()
        try:
            router, inbox = self._router, self._inbox
            ready = False
            while not self._closing:
                drained = self._receive(ready)
                if inbox.poll(key):
                    break
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    break
                ready = False
                if drained:
                    # zmq_poll itself: Socket.poll builds a Poller per call.
                    ready = bool(zmq.zmq_poll([(router, _POLLIN)],
                                              int(min(remaining * 1000, _PUMP_SLICE_MS)) + 1))
            else:
                return True
            # Leave it drained, so its descriptor fires again: a _receive that returned drained
            # read "nothing" from EVENTS last, which settled the descriptor already.
            more = not drained and not self._receive()
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
            if more or self._rx_waiting or time.monotonic() - taken > defaults.PARK_MAX / 4:
                self.command(("rx",))

    def closing(self) -> None:
        """close() began: a caller reading the ROUTER lets go within PUMP_SLICE, and what link
        emulation holds goes out now (it was sent; on a real network it would be in flight),
        before close() waits for receivers to map our rings (their announcements may be held
        too)."""
        self._closing = True
        self.command(("unpace",))

    def stop(self, timeout: float) -> None:
        """Flush what was queued, say goodbye, close the sockets and end the thread."""
        self.command(("close",))
        self._thread.join(timeout)
        if self._thread.is_alive():
            log.warning("rank %d: I/O thread did not stop within %.1fs", self.rank, timeout)

    def close_pipe(self) -> None:
        """Close the wake-up pipe (last: a late command's wake-up finds it closed, harmless)."""
        for fd in (self._wake_r, self._wake_w):
            try:
                os.close(fd)
            except OSError:
                pass

    # ------------------------------------------------------------------ the ROUTER
    def _receive(self, ready: bool = False) -> bool:
        """Read what the ROUTER holds (the caller holds ``_rx_lock``); True once drained.
        ``ready``: zmq_poll just said it holds a message, so the first EVENTS read (a getsockopt
        and an enum conversion in pyzmq, ~1 us) is skipped."""
        # The raw socket calls, not pyzmq's recv_multipart/getsockopt sugar: per 4 KiB
        # allreduce these were ~20 us of enum conversions, RCVMORE lookups and zmq.Again
        # exceptions, on the critical path of every small operation.
        router = self._router
        get, recv, handle = router.get, router.recv, self._handle
        for _ in range(1024):  # bounded, so commands and monitors are not starved
            # Reading EVENTS also settles the socket's signalling descriptor (ZeroMQ's
            # edge-triggered ZMQ_FD): once it says "nothing", the descriptor fires again only
            # on a later arrival.
            if ready:
                ready = False
            elif not get(_EVENTS) & _POLLIN:  # type: ignore[operator]  # stub: EVENTS gives an int
                return True
            try:
                frames = [recv(_NOBLOCK, copy=False)]
                while frames[-1].more:  # the parts of one message arrive together
                    frames.append(recv(_NOBLOCK, copy=False))
            except zmq.Again:
                continue
            if handle is None:
                raise RuntimeError("a message was read before the I/O loop started")
            handle(frames)
        return False

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
            self._rx_park_s = min(2 * self._rx_park_s, defaults.PARK_MAX)
        else:
            self._poller.unregister(self._rx_fd)
            self._rx_parked = True
            self._rx_park_s = defaults.PARK_MIN

    # ------------------------------------------------------------------ the I/O thread
    def _run(self) -> None:
        poller, zap = self._poller, self._sockets.zap
        refusals = self._sockets.refusals
        suspects, monitors, blocked = self._liveness.suspects, self._liveness.monitors, \
            self._blocked
        poller.register(self._rx_fd, zmq.POLLIN)
        poller.register(self._wake_r, zmq.POLLIN)
        poller.register(refusals.monitor, zmq.POLLIN)
        if zap:
            poller.register(zap.socket, zmq.POLLIN)
        next_tick = 0.0
        try:
            while True:
                if not self._drain_commands():
                    break
                self._asleep = True
                if self._cmds:
                    self._asleep = False
                    continue
                timeout = (0 if self._rx_more else _SLOT_RETRY_MS if blocked
                           else self._rx_park_s * 1000 if self._rx_parked
                           else _SUSPECT_POLL_MS if suspects else _IDLE_POLL_MS)
                paced = self._paced
                if paced:
                    # Rounded up: zmq_poll counts whole milliseconds, and 0 would spin.
                    wait = min(paced.values()) - time.monotonic()
                    timeout = min(timeout, max(0, math.ceil(wait * 1000)))
                events = dict(poller.poll(int(timeout)))   # (whole ms, as zmq_poll takes)
                self._asleep = False
                if not events or timeout >= _IDLE_POLL_MS:
                    # Idle, or a long wait: the throttled logs' summaries (a cheap look each).
                    now = time.monotonic()
                    if now >= next_tick:
                        next_tick = now + defaults.IDLE_POLL
                        for tick in self._ticks:
                            tick()
                if paced:
                    now = time.monotonic()
                    for link, due in list(paced.items()):
                        if due <= now:
                            self.flush(link)
                if suspects:
                    # What a suspect sent before it went may sit in the ROUTER still: deliver
                    # it first, or a waiter woken by the loss finds its mailbox empty (under
                    # load, past DISCONNECT_GRACE, a peer's last barrier message was lost so).
                    if self._rx_lock.acquire(blocking=False):
                        try:
                            self._rx_more = not self._receive()
                        finally:
                            self._rx_lock.release()
                    self._liveness.declare_lost()
                if blocked:
                    for link in list(blocked):
                        self.flush(link)
                if self._wake_r in events:
                    try:
                        os.read(self._wake_r, 4096)
                    except BlockingIOError:
                        pass
                if self._rx_more or self._rx_parked or self._rx_fd in events:
                    self._io_receive()
                if zap and zap.socket in events:
                    zap.handle()
                if refusals.monitor in events:
                    refusals.on_events()
                for sock in events:
                    rank = monitors.get(sock)
                    if rank is not None:
                        self._liveness.on_events(sock, rank)
                    elif sock in self._pollout:
                        self.flush(self._pollout[sock])
        except Exception:  # the I/O thread must never die silently
            log.exception("rank %d: I/O thread failed", self.rank)
            for r in range(self._world_size):
                self._inbox.mark_lost(r, Lost("this peer's I/O thread failed (see log)"))
        finally:
            self._shutdown()

    def _drain_commands(self) -> bool:
        cmds = self._cmds
        while cmds:
            cmd = cmds.popleft()
            kind = cmd[0]
            if kind == "flush":
                self.flush(cmd[1])
            elif kind == "watch":
                self._poller.register(self._liveness.watch(cmd[1]), zmq.POLLIN)
                self.flush(cmd[1])
            elif kind == "rx":
                self._io_receive()
            elif kind == "unpace":
                for link in list(self._sockets.links.values()):
                    if link.pacer is not None:
                        link.unpace()
                        self.flush(link)
            elif kind == "close":
                for link in list(self._sockets.links.values()):
                    link.unpace()     # held by link emulation: in flight, it goes now too
                    self.flush(link)  # what was queued before close() still goes out
                self._say_goodbye()
                return False
        return True

    def flush(self, link) -> None:
        """Send what ``link`` has queued, as far as its socket and ring allow (I/O thread)."""
        lost = self._inbox.lost(link.rank)
        blamed = link.rank if lost is None or lost.cause is None else lost.cause
        state = link.flush(None if lost is None else _failer(PeerLost(
            f"rank {self.rank}: send to rank {link.rank} at "
            f"{self._sockets.address(link.rank)}: {lost.reason}", rank=blamed,
            address=self._sockets.address(blamed))))
        self._blocked.discard(link)
        if state == "paced":
            self._paced[link] = link.next_due()
        elif self._paced:
            self._paced.pop(link, None)
        if state == "blocked":
            self._shm.on_blocked(link)  # wait for a CREDIT, or the next SLOT_RETRY's look
        elif state == "pollout":
            if link.sock not in self._pollout:
                self._pollout[link.sock] = link
                self._poller.register(link.sock, zmq.POLLOUT)
            return
        if link.sock in self._pollout:
            # Unregistered under no lock: only the I/O thread polls, and a calling thread
            # sends directly only once the queue is empty, which this flush just made it.
            del self._pollout[link.sock]
            self._poller.unregister(link.sock)

    def _say_goodbye(self) -> None:
        bye = (encode_header(Header(BYE, self.rank, Channel.LINK, 0,
                                    self.goodbye_cause[:250])),)
        for link in list(self._sockets.links.values()):
            # A link with messages still queued (its receiver paused it, or its send window is
            # full: flow_control.py) would keep the goodbye behind them, and they are
            # failed just below: it goes ahead instead.
            messages, nbytes = link.backlog()
            if not link.send_urgent(bye):
                link.send(bye, None)
            if messages and self._inbox.lost(link.rank) is None:
                # A send returns once queued: its caller was told it went. Never silently.
                events.warning("rank %d: closed with %d messages (%d bytes) to rank %d still "
                               "queued: they are dropped (rank %d did not take them; a recv "
                               "there for them raises PeerLost)", self.rank, messages, nbytes,
                               link.rank, link.rank)
            for ticket in link.pending_tickets():
                ticket.error = PeerLost(f"rank {self.rank}: closed with a send to rank "
                                        f"{link.rank} still queued", rank=link.rank)
                ticket.queued.set()

    def _shutdown(self) -> None:
        self._sockets.close_links(lost=self._inbox.lost_ranks())
        self._shm.close_rings()  # after the links: nobody stages into them any more
        # A caller may be reading the socket: it lets go within PUMP_SLICE once closing.
        with self._rx_lock:
            self._sockets.close_router()
            self._shm.close_views()
        self._sockets.close_zap()


def _failer(error: Exception):
    """What a lost peer's queued sends get instead of going out: their error."""
    def fail(ticket) -> None:
        if ticket is not None:
            ticket.error = error
            ticket.queued.set()
    return fail
