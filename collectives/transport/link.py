"""One peer's outgoing connection to another: its DEALER socket and the queue of messages waiting
to go out, in order.

The transport's I/O thread owns the socket. To keep latency low, a calling thread may borrow
it for one send, under the link's lock, when nothing is queued: the message then leaves at once
instead of waking the I/O thread. When something is queued (the socket is at its high-water
mark, or a staged message waits for a free shared-memory slot), every later message queues
behind it, so order is kept, and only the I/O thread touches the socket: it polls the socket
only while the queue is non-empty, and no calling thread sends then. The lock is the memory
fence that lets the socket move between threads, as ZeroMQ requires.

A queued entry is either ``(frames, ticket)`` or a *staged* message: an object with a
``ticket``, an ``nbytes`` (its payload's length) and a ``stage(retry)`` method that returns its
frames once the resource it needs is free (None: not yet). The shared-memory chunks of
collectives/transport/shm.py are the staged messages; the link knows nothing else about them.

Messages also queue while the receiver asked this peer to pause or while the send window is
full (flow_control.py: HOLD, and the bytes sent and not yet acknowledged). Control messages that
unblock the other side (HOLD, ACK) go ahead of all that (``send_control``): one pending per
purpose, the newest replacing an older one, sent before anything queued.

With link emulation (emulation.py, GOSSIP_LINK) the link has a ``pacer`` that stamps every
message it sends or queues with its release time, kept in ``dues`` beside the queue (one per
entry); a message goes only once its time has come (``flush`` returns "paced" until then, and
the I/O thread polls with the next release time as its timeout). Without one, ``pacer`` is None
and ``dues`` stays empty: one attribute check on the hot path.
"""
from __future__ import annotations

import threading
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Any, Callable

import zmq

from collectives.errors import PeerLost
from collectives.transport.emulation import Pacer
from collectives.transport.flow_control import SendWindow, message_cost
from collectives.transport.wire import stamp_number

__all__ = ["Link", "SendTicket"]

_NOBLOCK, _SNDMORE = int(zmq.NOBLOCK), int(zmq.SNDMORE)
_HEADER_ONLY = message_cost(())  # a staged (shared-memory) message: its SHM header only


@dataclass
class SendTicket:
    """Completion of one queued send: ``queued`` is set once libzmq has the message; then
    ``tracker`` (if tracking was asked for) says when libzmq no longer reads the buffer."""
    queued: threading.Event = field(default_factory=threading.Event)
    tracker: Any = None
    error: Exception | None = None

    def done(self) -> bool:
        """True when the buffer may be reused, without waiting. Raises the send's error."""
        if not self.queued.is_set():
            return False
        if self.error is not None:
            raise self.error
        return self.tracker is None or self.tracker.done

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


class Link:
    """The DEALER to one peer, its monitor socket (liveness), and the send queue."""

    def __init__(self, rank: int, sock: zmq.Socket, monitor: zmq.Socket,
                 on_sent: Callable[[int, int, int], None], pacer: Pacer | None = None, *,
                 window: SendWindow | None = None) -> None:
        self.rank = rank
        self.sock = sock
        self.monitor = monitor
        self.lock = threading.Lock()
        self.queue: deque = deque()
        self.created = time.monotonic()
        self.closed = False
        self.sent_number = 0  # number stamped on the last message the socket took
        # The receiver asked us to hold our messages (flow_control.Holds): they queue, nothing
        # leaves but urgent control messages; ``hold_generation`` is that request's, the newest wins.
        self.paused = False
        self.hold_generation = -1
        # Bytes sent and not acknowledged (flow_control.SendWindow), and the control messages
        # waiting for room in the socket, by purpose ("hold", "ack"): they go before anything queued.
        self.window = window if window is not None else SendWindow()
        self.control: dict[str, tuple] = {}
        self._on_sent = on_sent  # counters: (rank, messages, payload bytes)
        # Link emulation (emulation.py): the release time of each queued entry, in order.
        self.pacer = pacer
        self.emulated = pacer  # kept after close() stops the pacing, for stats
        self.dues: deque = deque()

    def send(self, frames: tuple, ticket) -> bool:
        """Send now if nothing is queued, else queue. True if the I/O thread must be woken
        to flush the queue."""
        with self.lock:
            if self.closed:
                if ticket is not None:
                    ticket.error = PeerLost(f"send to rank {self.rank} after close()",
                                            rank=self.rank)
                    ticket.queued.set()
                return False
            if self.pacer is not None:
                return self._send_paced(frames, ticket)
            if not self.queue and not self.paused:
                cost = message_cost(frames)
                if self.window.room(cost) and self._send_now(frames, ticket, cost):
                    return False
            self.queue.append((frames, ticket))
            return len(self.queue) == 1 and not self.paused

    def _send_paced(self, frames: tuple, ticket) -> bool:
        # send() under link emulation: stamped in order, sent now only if already due.
        if self.pacer is None:
            raise RuntimeError("a paced send on a link without a pacer")
        due = self.pacer.due(_frames_bytes(frames))
        if not self.queue and not self.paused and due <= time.monotonic():
            cost = message_cost(frames)
            if self.window.room(cost) and self._send_now(frames, ticket, cost):
                return False
        self.queue.append((frames, ticket))
        self.dues.append(due)
        return len(self.queue) == 1 and not self.paused

    def post(self, staged) -> tuple[bool, bool]:
        """A staged message: sent now if nothing is queued and ``staged.stage(False)`` gets its
        resource, else queued until the I/O thread's flush can stage it. Returns (queued, wake
        the I/O thread)."""
        with self.lock:
            if self.closed:
                return False, False  # the caller sees `closed` and raises
            if self.pacer is not None:
                # Emulated: always queued, with its due time beside it; the I/O thread stages
                # it into a slot only once due, so the receiver cannot see it earlier.
                self.queue.append(staged)
                self.dues.append(self.pacer.due(staged.nbytes))
                return True, len(self.queue) == 1 and not self.paused
            if not self.queue and not self.paused and self.window.room(_HEADER_ONLY):
                frames = staged.stage(False)
                if frames is not None:
                    if not self._send_now(frames, None):
                        self.queue.append((frames, None))
                        return False, len(self.queue) == 1
                    return False, False
            self.queue.append(staged)
            return True, len(self.queue) == 1 and not self.paused

    def send_urgent(self, frames: tuple) -> bool:
        """Send a control message ahead of the queue (it needs no order); False if the socket
        is full (the caller retries later)."""
        with self.lock:
            return not self.closed and self._send_now(frames, None)

    def send_control(self, purpose: str, frames: tuple) -> bool:
        """A control message that must get out whatever is queued, paused or out of window
        (it is what unblocks the other side): sent now, or, while the socket is full or one of
        the same ``purpose`` already waits for it, kept as the one pending for that purpose
        (the newest says all an older one did), so two of one purpose never overtake each
        other. True if the I/O thread must flush."""
        with self.lock:
            if self.closed:
                return False
            if purpose not in self.control and self._send_now(frames, None):
                return False
            self.control[purpose] = frames
            return True

    def _send_now(self, frames: tuple, ticket, cost: int = 0) -> bool:
        # Every message is numbered here, under the lock, in the order the socket takes it
        # (urgent control messages included), so the receiver can refuse a replayed or
        # duplicated message by its number alone (see collectives/transport/wire.py).
        number = self.sent_number + 1
        frames = (stamp_number(frames[0], number), *frames[1:])
        # The raw send, part by part, not send_multipart (its per-part type checks cost more
        # than the send of a small message). The header goes as a copy; the payload without
        # one (pyzmq still copies parts below its copy threshold unless tracked). Only the
        # first part can fail on a full socket: ZeroMQ then takes the rest of the message.
        send = self.sock.send
        try:
            if len(frames) == 1:
                tracker = send(frames[0], _NOBLOCK, copy=False, track=ticket is not None)
            else:
                send(frames[0], _NOBLOCK | _SNDMORE)
                tracker = send(frames[1], _NOBLOCK, copy=False, track=ticket is not None)
        except zmq.Again:
            return False
        self.sent_number = number
        self.window.on_sent(cost or message_cost(frames))
        self._on_sent(self.rank, 1, len(frames[1]) if len(frames) > 1 else 0)
        if ticket is not None:
            ticket.tracker = tracker
            ticket.queued.set()
        return True

    def flush(self, fail: Callable[[Any], None] | None = None) -> str:
        """Drain the queue (I/O thread). Returns "done", "pollout" (the socket is full: poll
        it for POLLOUT), "blocked" (a staged message waits for its resource), "held" (the
        receiver asked us to pause) or "windowed" (the send window is full; both
        flow_control.py) or "paced" (link emulation: the head is not due yet, see
        ``next_due``). With ``fail`` (the peer is lost), every queued message's ticket is
        handed to it instead."""
        with self.lock:
            control = self.control
            while control and fail is None:
                purpose = next(iter(control))
                if not self._send_now(control[purpose], None):
                    return "pollout"
                del control[purpose]
            queue, window, dues = self.queue, self.window, self.dues
            if self.paused and fail is None:
                return "held"  # nothing to poll for: a resume flushes it
            while queue:
                entry = queue[0]
                if fail is not None:
                    queue.popleft()
                    if dues:
                        dues.popleft()
                    fail(entry[1] if type(entry) is tuple else entry.ticket)
                    continue
                if dues and dues[0] > time.monotonic():
                    return "paced"  # the I/O thread polls until next_due()
                if not window.room(message_cost(entry[0]) if type(entry) is tuple
                                   else _HEADER_ONLY):
                    return "windowed"  # nothing to poll for: an ACK flushes it
                if type(entry) is not tuple:
                    frames = entry.stage(True)
                    if frames is None:
                        return "blocked"
                    queue[0] = (frames, None)
                    continue
                if not self._send_now(*entry):
                    return "pollout"
                queue.popleft()
                if dues:
                    dues.popleft()
            return "done"

    def next_due(self) -> float:
        """When the head of the queue may go (link emulation); 0 when nothing is paced."""
        dues = self.dues
        return dues[0] if dues else 0.0

    def unpace(self) -> None:
        """Stop emulating (close() began): what is held goes out with the next flush, as it
        would be in flight on a real network, and nothing later is delayed."""
        with self.lock:
            self.pacer = None
            self.dues.clear()

    def hold(self, pause: bool, generation: int) -> bool | None:
        """The receiver's HOLD: pause or resume (a request older than the last one is
        ignored: None). False when a resume leaves messages queued, to be flushed."""
        with self.lock:
            if generation <= self.hold_generation:
                return None
            self.hold_generation = generation
            self.paused = pause
            return pause or not self.queue

    def ack(self, number: int) -> bool | str:
        """The receiver's ACK of every message up to ``number``: why it cannot be (a string: it
        names a message not sent yet, or goes backwards), else True when messages wait in the
        queue and may now have room (to be flushed)."""
        with self.lock:
            window = self.window
            if number > self.sent_number:
                return f"only {self.sent_number} were sent"
            if number < window.acked_number:
                return f"after message {window.acked_number} was acknowledged"
            window.on_ack(number)
            return bool(self.queue) and not self.paused and not self.closed

    def backlog(self) -> tuple[int, int]:
        """What waits in the queue: (messages, bytes, headers included)."""
        with self.lock:
            nbytes = sum(_frames_bytes(e[0]) if type(e) is tuple else e.nbytes
                         for e in self.queue)
            return len(self.queue), nbytes

    def pending_tickets(self) -> list:
        """Empty the queue and return the tickets of what it held, for the caller to fail: none of
        it will go out any more."""
        with self.lock:
            tickets = [e[1] if type(e) is tuple else e.ticket for e in self.queue]
            self.queue.clear()
            self.dues.clear()
            return [t for t in tickets if t is not None]

    def close(self, linger_ms: int) -> None:
        """Close both sockets; under the lock, so once this returns no caller is staging or
        sending on this link, and what it staged into (a ring) may be closed."""
        with self.lock:
            self.closed = True
            self.monitor.close(linger=0)
            self.sock.close(linger=linger_ms)


def _frames_bytes(frames: tuple) -> int:
    """What one message costs an emulated link: every byte of it, header included."""
    total = 0
    for frame in frames:
        total += frame.nbytes if type(frame) is memoryview else len(frame)
    return total
