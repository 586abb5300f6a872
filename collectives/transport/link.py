"""One peer's outgoing connection to another: its DEALER socket, the queue of messages waiting
to go out, and (between peers on one host) the shared-memory ring its payloads travel in.

The transport's I/O thread owns the socket. To keep latency low, a calling thread may borrow
it for one send, under the link's lock, when nothing is queued: the message then leaves at once
instead of waking the I/O thread. When something is queued (the socket is at its high-water
mark, or a chunk waits for a free shared-memory slot), every later message queues behind it, so
order is kept, and only the I/O thread touches the socket: it polls the socket only while the
queue is non-empty, and no calling thread sends then. The lock is the memory fence that lets
the socket move between threads, as ZeroMQ requires.
"""
from __future__ import annotations

import threading
import time
from collections import deque
from typing import Any, Callable

import zmq

from collectives.errors import PeerLost
from collectives.transport.shm import ShmRing
from collectives.transport.wire import encode_header, stamp_number

__all__ = ["Link", "ShmPending"]

_NOBLOCK, _SNDMORE = int(zmq.NOBLOCK), int(zmq.SNDMORE)


class ShmPending:
    """A chunk for the shared-memory ring that found no free slot: its header fields (all but
    the slot), the caller's buffer (read when a slot frees up) and the caller's ticket."""

    __slots__ = ("fields", "payload", "ticket")

    def __init__(self, fields: tuple, payload: Any, ticket) -> None:
        self.fields, self.payload, self.ticket = fields, payload, ticket


class Link:
    def __init__(self, rank: int, sock: zmq.Socket, monitor: zmq.Socket,
                 on_sent: Callable[[int, int, int], None]) -> None:
        self.rank = rank
        self.sock = sock
        self.monitor = monitor
        self.lock = threading.Lock()
        self.queue: deque = deque()
        self.ring: ShmRing | None = None
        self.created = time.monotonic()
        self.starved_since = 0.0  # when the queue last told the receiver it had no free slot
        self.closed = False
        self.sent_number = 0  # number stamped on the last message the socket took
        self._on_sent = on_sent  # counters: (rank, messages, payload bytes)

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
            if not self.queue and self._send_now(frames, ticket):
                return False
            self.queue.append((frames, ticket))
            return len(self.queue) == 1

    def post_shm(self, fields: tuple, payload: Any, ticket) -> tuple[bool, bool]:
        """A chunk for the ring: copy it into a free slot and send its header now, or queue it
        until a slot frees up. Returns (queued, wake the I/O thread)."""
        ring = self.ring
        with self.lock:
            if self.closed:
                return False, False  # the caller sees `closed` and raises
            if not self.queue:
                with ring.lock:
                    slot = ring.try_acquire()
                if slot is not None:
                    self._on_sent(self.rank, 0, ring.write(slot, payload))
                    header = (encode_header(*fields, slot),)
                    if not self._send_now(header, None):
                        self.queue.append((header, None))
                        return False, len(self.queue) == 1
                    return False, False
            self.queue.append(ShmPending(fields, payload, ticket))
            return True, len(self.queue) == 1

    def send_urgent(self, frames: tuple) -> bool:
        """Send a control message ahead of the queue (it needs no order); False if the socket
        is full (the caller retries later)."""
        with self.lock:
            return not self.closed and self._send_now(frames, None)

    def _send_now(self, frames: tuple, ticket) -> bool:
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
        self._on_sent(self.rank, 1, len(frames[1]) if len(frames) > 1 else 0)
        if ticket is not None:
            ticket.tracker = tracker
            ticket.queued.set()
        return True

    def flush(self, fail: Callable[[Any], None] | None = None) -> str:
        """Drain the queue (I/O thread). Returns "done", "pollout" (the socket is full: poll
        it for POLLOUT) or "slot" (a chunk waits for a free shared-memory slot). With ``fail``
        (the peer is lost), every queued message is handed to it instead of being sent."""
        with self.lock:
            queue = self.queue
            while queue:
                entry = queue[0]
                if fail is not None:
                    queue.popleft()
                    fail(entry.ticket if type(entry) is ShmPending else entry[1])
                    continue
                if type(entry) is ShmPending:
                    if not self._stage(entry):
                        return "slot"
                    continue
                if not self._send_now(*entry):
                    return "pollout"
                queue.popleft()
            return "done"

    def _stage(self, pending: ShmPending) -> bool:
        """Copy the chunk at the head of the queue into a free slot and put its header in its
        place; False if no slot is free (the ring's waiting flag is then up)."""
        ring = self.ring
        with ring.lock:
            slot = ring.try_acquire()
            if slot is None:
                ring.waiting[0] = 1
                slot = ring.try_acquire()  # a slot freed before the flag went up
                if slot is None:
                    return False
        self._on_sent(self.rank, 0, ring.write(slot, pending.payload))
        if pending.ticket is not None:
            pending.ticket.queued.set()  # the buffer was copied: reusable now
        self.queue[0] = ((encode_header(*pending.fields, slot),), None)
        return True

    def pending_tickets(self) -> list:
        with self.lock:
            tickets = [e.ticket if type(e) is ShmPending else e[1] for e in self.queue]
            self.queue.clear()
            return [t for t in tickets if t is not None]

    def close(self, linger_ms: int) -> None:
        with self.lock:
            self.closed = True
            self.monitor.close(linger=0)
            self.sock.close(linger=linger_ms)
            if self.ring is not None:
                self.ring.close()
