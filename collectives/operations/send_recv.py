"""Point-to-point messages of one communicator: whole arrays sent by one peer and received by
another, in the order they were sent, on the communicator's point-to-point channel.

Each ordered pair of peers numbers its messages (a send sequence per destination, a receive
sequence per source), so a message's mailbox is ``(src, channel, seq)`` on both ends without
any agreement beyond the order of calls. ``probe`` and ``wait_any`` look at the next mailbox of
each source without consuming it, for receivers that serve several peers.
"""
from __future__ import annotations

import threading
import time
from collections import deque
from typing import Any

import numpy as np

from collectives.algorithms.p2p import Call, post_range, recv_range, wait_reached, wait_sent
from collectives.arrays.interface import ArrayAdapter
from collectives.errors import OperationTimeout
from collectives.staging import contiguous_flat, flat_of
from collectives.transport.transport import Transport
from collectives.transport.wire import dtype_itemsize

__all__ = ["SendRequest", "PointToPoint", "SELF_LOOK"]

#: How often a wait_any among other sources and this peer itself looks at its own queue.
SELF_LOOK = 0.01


class PointToPoint:
    """send/recv/probe/wait_any of one communicator (its ``p2p_channel``)."""

    def __init__(self, transport: Transport, channel: int) -> None:
        self.transport = transport
        self.rank = transport.rank
        self.world_size = transport.world_size
        self.channel = channel
        self._lock = threading.Lock()
        self._send_seq = [0] * self.world_size
        self._recv_seq = [0] * self.world_size
        # Messages to this peer itself (MPI lets a rank send to itself): what a receiver
        # would get, as bytes with their dtype and shape, in the order they were sent.
        self._to_self: deque[tuple[str, tuple, bytes]] = deque()
        self._self_ready = threading.Condition()

    @property
    def timeout(self) -> float:
        """The transport's timeout in seconds, for calls given none."""
        return self.transport.config.timeout

    def send(self, dst: int, x: Any, *, timeout: float | None = None) -> None:
        """Send ``x`` to ``dst``; returns when ``x`` may be modified again. Messages between
        two peers arrive in the order they were sent."""
        self.isend(dst, x, timeout=timeout).wait()

    def isend(self, dst: int, x: Any, *, timeout: float | None = None) -> "SendRequest":
        """send's non-blocking twin (MPI's Isend): the message is queued now (this never
        blocks: a full ring or socket queues it, in order) and the request says when ``x``
        may be modified again; ``timeout`` (default the peer's) is its deadline."""
        if not 0 <= dst < self.world_size:
            raise ValueError(f"rank {self.rank}: cannot send to rank {dst} (world size "
                             f"{self.world_size})")
        stand_in, adapter, flat, dtype = contiguous_flat(x, read_only=True)   # (copy: sent)
        if dst == self.rank:   # a copy, queued here: x may change at once
            raw = bytes(adapter.send_buffer(flat, 0, adapter.size(flat)))
            with self._self_ready:
                self._to_self.append((dtype, tuple(x.shape), raw))
                self._self_ready.notify_all()
            self.transport.recorder.count("send", len(raw))
            return SendRequest(None, dst, None, done=True)
        with self._lock:
            seq = self._send_seq[dst]
            self._send_seq[dst] += 1
        deadline = time.monotonic() + (self.timeout if timeout is None else timeout)
        call = Call(self.transport, self.channel, seq, "send", dtype, tuple(x.shape),
                    deadline)
        ticket = post_range(call, dst, adapter, flat, 0, adapter.size(flat), track=True)
        self.transport.recorder.count("send", adapter.size(flat) * dtype_itemsize(dtype))
        return SendRequest(call, dst, ticket, stand_in)

    def recv(self, src: int, out: Any = None, *, timeout: float | None = None) -> Any:
        """Receive the next array ``src`` sent. Into ``out`` if given (its dtype and size must
        match), else a new numpy array (a single-chunk message is returned without a copy)."""
        self._check_source(src)
        # out's own checks (family, writable) come before anything is taken from the mailbox;
        # a non-contiguous out is filled through a contiguous stand-in.
        stand_in: Any = None
        target: tuple[ArrayAdapter, Any, str] | None = None
        if out is not None:
            stand_in, out_adapter, out_flat, out_dtype = contiguous_flat(out)
            target = (out_adapter, out_flat, out_dtype)
        deadline = time.monotonic() + (self.timeout if timeout is None else timeout)
        if src == self.rank:
            return self._from_self(out, stand_in, target, deadline)
        seq = self._recv_seq[src]
        t = self.transport
        record = t.recorder.begin(f"recv from rank {src}", self.channel, seq, (src,), 0)
        try:
            out = self._receive(src, seq, out, stand_in, target, deadline)
        except BaseException as exc:
            t.recorder.end(record, exc)
            raise
        t.recorder.end(record, nbytes=int(getattr(out, "nbytes", 0)))
        return out

    def _receive(self, src: int, seq: int, out: Any, stand_in: Any,
                 target: tuple[ArrayAdapter, Any, str] | None, deadline: float) -> Any:
        """recv's body: message ``seq`` of ``src`` into ``target`` (``out``'s flat view)."""
        t = self.transport
        channel = self.channel
        key = (src, channel, seq)
        # Nothing arrived (timeout, lost peer): the mailbox stays open, so a later recv (e.g. a
        # poll with timeout=0) waits for the same message and the sequence stays in step.
        item = t.recv(src, channel, seq, deadline=deadline,
                      operation=f"recv from rank {src}")
        header = item[0]
        if target is not None:
            adapter, flat, dtype = target
            if dtype != header.dtype or \
                    adapter.size(flat) * dtype_itemsize(dtype) != header.nbytes:
                # The caller's out does not fit: the message stays first in its mailbox, so a
                # recv with a fitting out still gets it and the sequence stays in step.
                t.inbox.unget(key, item)
                raise ValueError(f"rank {self.rank}: recv #{seq} from rank {src}: it sent "
                                 f"{header.dtype} {header.shape} but out is {dtype} "
                                 f"{tuple(out.shape)}")
        self._recv_seq[src] = seq + 1
        try:
            header, frame, release = item
            call = Call(t, channel, seq, "send", header.dtype, header.shape, deadline)
            if target is None:   # no out given
                if (release is None and header.offset == 0 and header.length == header.nbytes
                        and header.dtype != "bfloat16"):
                    # The whole array in one ZeroMQ frame: hand it over without a copy.
                    return np.frombuffer(frame, dtype=header.dtype).reshape(header.shape)
                out = _empty_for(header.dtype, header.shape)
                target = flat_of(out)
            adapter, flat, dtype = target
            t.inbox.unget(key, item)
            for lo, hi, chunk in recv_range(call, src, adapter, 0, adapter.size(flat)):
                adapter.copy(adapter.slice(flat, lo, hi), chunk)
            if stand_in is not None:
                adapter.write_back(out, stand_in)
            adapter.synchronize()
            return out
        finally:
            t.retire(channel, seq, [src])

    def _from_self(self, out: Any, stand_in: Any, target: tuple[ArrayAdapter, Any, str] | None,
                   deadline: float) -> Any:
        """The next message this peer sent itself (recv's body for ``src`` = this rank)."""
        with self._self_ready:
            while not self._to_self:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise OperationTimeout(f"rank {self.rank}: recv from rank {self.rank} "
                                           f"(itself): nothing sent within the timeout",
                                           rank=self.rank)
                self._self_ready.wait(left)
            dtype, shape, raw = self._to_self[0]
            if target is not None:
                adapter, flat, out_dtype = target
                if out_dtype != dtype or adapter.size(flat) * dtype_itemsize(dtype) != len(raw):
                    # (the message stays first, as a remote one does)
                    raise ValueError(f"rank {self.rank}: recv from rank {self.rank} (itself): "
                                     f"it sent {dtype} {shape} but out is {out_dtype} "
                                     f"{tuple(out.shape)}")
            self._to_self.popleft()
        if target is None:
            if dtype == "bfloat16":
                import torch
                return torch.frombuffer(bytearray(raw), dtype=torch.bfloat16).reshape(shape)
            return np.frombuffer(bytearray(raw), dtype=dtype).reshape(shape)
        adapter, flat, _ = target
        count = adapter.size(flat)
        adapter.copy(flat, adapter.from_frame(memoryview(raw), dtype, count))
        if stand_in is not None:
            adapter.write_back(out, stand_in)
        adapter.synchronize()
        return out

    def probe(self, src: int) -> bool:
        """True when a message from ``src`` is waiting (or its mailbox holds an error, e.g. a
        malformed message), so recv(src) returns or raises at once. A lost source with nothing
        queued is *not* ready: probe is False and recv raises PeerLost. What a source sent
        before it died stays receivable. Whether a source is gone: ``transport.is_lost``
        (``peer.lost_peers()``)."""
        self._check_source(src)
        return self.wait_any([src], 0.0) is not None

    def wait_any(self, sources, timeout: float | None = None) -> int | None:
        """Wait (without polling) until a message from one of ``sources`` is waiting, and
        return that source (the first of ``sources`` that has one); None after ``timeout``
        seconds (0: just look; None: the communicator's timeout) or once the peer is closed.
        Lost sources with nothing queued never count as ready (see probe)."""
        sources = [int(s) for s in sources]
        for src in sources:
            self._check_source(src)
        wait = self.timeout if timeout is None else max(0.0, float(timeout))
        deadline = time.monotonic() + wait
        channel, seqs = self.channel, self._recv_seq
        others = [src for src in sources if src != self.rank]
        if len(others) == len(sources):
            key = self.transport.wait_any([(src, channel, seqs[src]) for src in others],
                                          deadline)
            return None if key is None else key[0]
        while True:   # this peer itself among them: its own queue, then the others, in turns
            with self._self_ready:
                if self._to_self:
                    return self.rank
                if not others:
                    left = deadline - time.monotonic()
                    if left <= 0 or not self._self_ready.wait(left):
                        return self.rank if self._to_self else None
                    continue
            until = min(deadline, time.monotonic() + SELF_LOOK)
            key = self.transport.wait_any([(src, channel, seqs[src]) for src in others], until)
            if key is not None:
                return key[0]
            if time.monotonic() >= deadline:
                return self.rank if self._to_self else None

    def _check_source(self, src: int) -> None:
        if not 0 <= src < self.world_size:
            raise ValueError(f"rank {self.rank}: cannot receive from rank {src} (world size "
                             f"{self.world_size})")


def _empty_for(dtype: str, shape: tuple) -> Any:
    if dtype == "bfloat16":
        import torch
        return torch.empty(shape, dtype=torch.bfloat16)
    return np.empty(shape, dtype=dtype)


class SendRequest:
    """An isend in flight: ``test()`` never blocks, ``wait()`` blocks until the message's
    buffer may be modified again and its destination was reached at least once (a peer
    never reached, e.g. dead before any connection existed, would leave the message in a
    queue and the send would seem to succeed). Both raise PeerLost if the destination is
    lost or the request's deadline passes first."""

    __slots__ = ("_call", "_dst", "_ticket", "_done", "_stand_in")

    def __init__(self, call: Call | None, dst: int, ticket: Any, stand_in: Any = None, *,
                 done: bool = False) -> None:
        """``done``: complete already (a message to this peer itself, copied as it was sent;
        ``call`` None)."""
        self._call, self._dst, self._ticket, self._done = call, dst, ticket, done
        self._stand_in = stand_in   # a non-contiguous x's copy: sent zero-copy, kept alive

    def test(self) -> bool:
        """True once complete (then always); False while in flight."""
        if self._done:
            return True
        assert self._call is not None   # (only a request made done has none)
        t = self._call.transport
        if (self._ticket is None or self._ticket.done()) and t.reached(self._dst):
            self._done = True
            return True
        if t.is_lost(self._dst) or time.monotonic() >= self._call.deadline:
            self.wait()   # raises the error that names why
        return False

    def wait(self) -> None:
        """Block until complete (at most until the request's deadline)."""
        if not self._done:
            assert self._call is not None   # (only a request made done has none)
            wait_sent(self._call, self._ticket)
            wait_reached(self._call, self._dst)
            self._done = True
