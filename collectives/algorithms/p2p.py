"""Chunked array messages over a Transport: the point-to-point primitives every algorithm is
written with.

``post_range`` queues elements ``[start, stop)`` of a flat array to one peer as chunks (zero-copy);
``recv_range`` walks the chunks of the same range arriving from one peer, checking each header
against what this peer's own call expects, so peers that made different calls get a
ProtocolError naming both calls instead of silent garbage. ``wait_sent`` and ``wait_reached``
are the two ways a sender waits: for its buffer to be free, and for its peer to exist.
"""
from __future__ import annotations

import time
from typing import Any, Iterator

from collectives import defaults
from collectives.arrays.adapter import ArrayAdapter
from collectives.errors import PeerLost, ProtocolError
from collectives.notices import LongWait
from collectives.transport.link import SendTicket
from collectives.transport.transport import Transport
from collectives.transport.wire import DATA, Header, payload_layout

__all__ = ["Call", "post_range", "recv_range", "chunk_elements", "wait_sent", "wait_reached"]

_tuple_new = tuple.__new__


class Call:
    """What one peer's operation expects of every message in its mailbox: the same signature,
    dtype and shape on every peer, or the peers made different calls."""

    __slots__ = ("transport", "channel", "seq", "signature", "dtype", "shape", "nbytes",
                 "itemsize", "frame_dtype", "deadline", "start")

    def __init__(self, transport: Transport, channel: int, seq: int, signature: str,
                 dtype: str, shape: tuple[int, ...], deadline: float) -> None:
        self.transport = transport
        self.channel = channel
        self.seq = seq
        self.signature = signature
        self.dtype = dtype
        self.shape = tuple(shape)
        # A codec's payload (dtype "codec:..."): bytes, read as uint8 (wire.payload_layout).
        self.itemsize, self.nbytes, self.frame_dtype = payload_layout(dtype, self.shape)
        self.deadline = deadline
        self.start = time.monotonic()   # (its timeout: deadline - start; notices.LongWait)

    @property
    def timeout(self) -> float:
        """Seconds the call was given (from its start to its deadline)."""
        return self.deadline - self.start

    def header(self, kind: int, offset: int = 0, length: int = 0, slot: int = 0) -> Header:
        """The header of this peer's message of ``kind`` in this call (a chunk: bytes
        ``[offset, offset + length)`` of the array; ``slot``: a PLAN's bits). Made for every
        chunk sent: straight from its fields (tuple.__new__, as Header's own constructor does
        after a Python call more)."""
        return _tuple_new(Header, (kind, self.transport.rank, self.channel, self.seq,
                                   self.signature, self.dtype, self.shape, self.nbytes, offset,
                                   length, slot, 0))

    def describe(self) -> str:
        """The call as errors word it: signature, dtype, shape and sequence number."""
        return f"{self.signature} {self.dtype} {self.shape} at sequence {self.seq}"

    __str__ = describe  # the transport words its errors with str(operation), only on error

    def mismatch(self, src: int, header: Header, what: str) -> ProtocolError:
        """The ProtocolError for a ``header`` from ``src`` that does not fit this call, naming both
        calls (``what``: the part that does not fit)."""
        theirs = f"{header.op} {header.dtype} {header.shape} at sequence {header.seq}"
        return ProtocolError(f"rank {self.transport.rank}: called {self.describe()}, but rank "
                             f"{src} sent {what} for {theirs}: the peers made different calls")


def chunk_elements(chunk_bytes: int, itemsize: int) -> int:
    """Elements per chunk of ``chunk_bytes``; at least one, so an element wider than a chunk still
    travels."""
    return max(1, chunk_bytes // itemsize)


def post_range(call: Call, dst: int, adapter: ArrayAdapter, flat: Any, start: int, stop: int,
               *, track: bool = False, plan: int = 0, at: int = 0) -> SendTicket | None:
    """Queue elements [start, stop) of ``flat`` to ``dst``. With ``track``, returns a ticket that
    says when the buffer may be reused (the last chunk is tracked: one pipe keeps order); None
    means it may be reused at once (the chunks were copied, e.g. into shared memory).
    ``plan``: a neighbour exchange's PLAN bits, carried by the first chunk (pattern.py).
    ``at``: the element of the call's array that ``flat``'s first element stands for (a
    buffer holding part of it: elements [start, stop) are ``flat[start - at:stop - at]``)."""
    t = call.transport
    size = call.itemsize
    ticket = None
    if stop <= start:
        # An empty range still sends one empty chunk, so the receiver's walk stays in step.
        return t.post_chunk(dst, call.header(DATA, start * size, 0, plan), b"",
                            deadline=call.deadline, track=track)
    if (stop - start) * size <= t.whole_bytes(dst):
        step = stop - start
    else:
        step = chunk_elements(t.chunk_bytes(dst), size)
    for lo in range(start, stop, step):
        hi = min(lo + step, stop)
        ticket = t.post_chunk(dst, call.header(DATA, lo * size, (hi - lo) * size,
                                               plan if lo == start else 0),
                              adapter.send_buffer(flat, lo - at, hi - at),
                              deadline=call.deadline,
                              track=track and hi == stop)
    return ticket


def recv_range(call: Call, src: int, adapter: ArrayAdapter, start: int,
               stop: int) -> Iterator[tuple[int, int, Any]]:
    """Yield ``(lo, hi, chunk)`` for the chunks of elements [start, stop) from ``src``, in order,
    each a zero-copy array over the received bytes, valid until the next iteration (a
    shared-memory slot is then handed back to the sender)."""
    t = call.transport
    lo = start
    while True:
        header, payload, release = t.recv(src, call.channel, call.seq, deadline=call.deadline,
                                          operation=call)
        try:
            if (header.op != call.signature or header.dtype != call.dtype
                    or header.shape != call.shape):
                raise call.mismatch(src, header, "a chunk")
            # Chunks must tile the range in order, without gap or overlap; their sizes are the
            # sender's choice (each link has its own), so a forwarded chunk needs no re-cut.
            count = header.length // call.itemsize
            in_range = count == 0 if stop <= start else 0 < count <= stop - lo
            if header.offset != lo * call.itemsize or not in_range:
                raise call.mismatch(src, header, f"elements at byte offset {header.offset} "
                                                 f"(expected {lo * call.itemsize})")
            yield lo, lo + count, adapter.from_frame(payload, call.frame_dtype, count)
        finally:
            if release is not None:
                release()
        lo += count
        if lo >= stop:
            return


def wait_sent(call: Call, ticket) -> None:
    """Block until the zero-copy buffers of this operation are no longer read by libzmq, so the
    caller may modify the array as soon as the operation returns."""
    if ticket is None:
        return
    notice = LongWait(lambda: f"rank {call.transport.rank}: {call.describe()}: waiting for "
                              "the network to take its last chunk (is the receiver reading?)",
                      time.monotonic(), call.deadline, timeout=call.timeout)
    until = notice.until(call.deadline)
    done = ticket.wait(until)
    if not done and until < call.deadline:
        notice.check(max(time.monotonic(), until))
        done = ticket.wait(call.deadline)
    if not done:
        raise PeerLost(f"rank {call.transport.rank}: {call.describe()}: the last chunk was not "
                       "taken by the network within the timeout (is the receiver alive?)")


def wait_reached(call: Call, dst: int) -> None:
    """Return once this peer has reached ``dst`` at least once; PeerLost at the call's deadline.

    A send never blocks, so a message to a peer that died before any connection to it existed
    would only wait in a queue (small ones are not even tracked) and the send would seem to
    succeed. Only the first operations with a peer can wait here, while its connection is
    being set up (a millisecond on one host): woken as the handshake succeeds (a back-off poll
    woke 0.5-8 ms late, on the path of a joiner's first state chunk), and at least every
    REACH_POLL_MAX to see a loss or the deadline."""
    t = call.transport
    notice = None
    while not t.reached(dst):
        if notice is None:   # (made once it waits at all: most calls find dst reached)
            notice = LongWait(lambda: f"rank {t.rank}: {call.describe()}: waiting to reach "
                                      f"rank {dst} at {t.address(dst)} (no connection yet)",
                              time.monotonic(), call.deadline, timeout=call.timeout)
        notice.check()
        if t.is_lost(dst) or time.monotonic() >= call.deadline:
            reason = "lost" if t.is_lost(dst) else "never reachable within the timeout"
            raise PeerLost(f"rank {t.rank}: {call.describe()}: rank {dst} at {t.address(dst)} "
                           f"{reason}: the message could not be delivered", rank=dst,
                           address=t.address(dst), operation=call.describe())
        t.wait_reached(dst, min(defaults.REACH_POLL_MAX,
                                max(0.0, call.deadline - time.monotonic())))
