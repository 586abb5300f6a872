"""Point-to-point messages of one communicator: whole arrays sent by one peer and received by
another, in the order they were sent, on the communicator's point-to-point channel.

Each ordered pair of peers numbers its messages (a send sequence per destination, a receive
sequence per source), so a message's mailbox is ``(src, channel, seq)`` on both ends without
any agreement beyond the order of calls. ``probe`` and ``wait_any`` look at the next mailbox of
each source without consuming it, for receivers that serve several peers.

A message may carry a tag (an integer from 0, MPI's and torch.distributed's): it travels in the
message's signature ("send" for tag 0, what every untagged send sends; "send#7" for tag 7). A
receive for one tag gets the earliest message of that tag from its source, as MPI's matching
does: messages of other tags that came first are received whole on the way (into memory of
this peer, as MPI's unexpected messages are) and kept, in order, for the receives that ask for
them, so none of them holds a shared-memory slot or a flow-control window that the awaited
message might be queued behind. A receive without a tag (``tag=None``, MPI's ANY_TAG) takes
the next message whatever its tag.
"""
from __future__ import annotations

import threading
import time
from collections import deque
from dataclasses import dataclass
from typing import Any

import numpy as np

from collectives.algorithms.p2p import Call, post_range, recv_range, wait_reached, wait_sent
from collectives.arrays.interface import ArrayAdapter
from collectives.errors import OperationTimeout
from collectives.staging import contiguous_flat, flat_of
from collectives.transport.transport import Transport
from collectives.transport.wire import dtype_itemsize, send_signature, send_tag

__all__ = ["SendRequest", "PointToPoint", "Status", "SELF_LOOK", "MAX_TAG"]

#: How often a wait_any among other sources and this peer itself looks at its own queue.
SELF_LOOK = 0.01
#: The largest tag (MPI's MPI_TAG_UB is at least 32767; torch takes an int).
MAX_TAG = 2**31 - 1


def _check_tag(tag: int | None, rank: int, what: str, *, any_tag: bool) -> None:
    if tag is None and any_tag:
        return
    if isinstance(tag, bool) or not isinstance(tag, (int, np.integer)) \
            or not 0 <= tag <= MAX_TAG:
        raise ValueError(f"rank {rank}: {what} with tag {tag!r}: a tag is an integer from 0 to "
                         f"{MAX_TAG}" + (" (or None: any tag)" if any_tag else ""))


@dataclass
class Status:
    """What a ``recv`` received or a ``probe`` found waiting (MPI's Status): its source, its
    tag, its dtype, shape and size in bytes. Pass one as ``status=``; the call fills it (a
    probe only when it finds a message; an error in the mailbox leaves it as it was)."""

    source: int = -1
    tag: int = -1
    dtype: str = ""
    shape: tuple = ()
    nbytes: int = 0

    def set(self, source: int, tag: int, dtype: str, shape: tuple, nbytes: int) -> None:
        """Fill every field (the calls that take ``status=``)."""
        self.source, self.tag, self.dtype, self.shape, self.nbytes = \
            source, tag, dtype, tuple(shape), nbytes


#: A message held whole on this peer (sent to itself, or received while looking for another
#: tag): (dtype, shape, its bytes, its tag).
_Held = tuple[str, tuple, Any, int]


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
        # would get, as bytes with their dtype, shape and tag, in the order they were sent.
        self._to_self: deque[_Held] = deque()
        self._self_ready = threading.Condition()
        # Per source, the messages received whole while a receive looked for another tag, in
        # the order they were sent (all of them before the source's next mailbox).
        self._early: dict[int, deque[_Held]] = {}

    @property
    def timeout(self) -> float:
        """The transport's timeout in seconds, for calls given none."""
        return self.transport.config.timeout

    def send(self, dst: int, x: Any, *, tag: int = 0, timeout: float | None = None) -> None:
        """Send ``x`` to ``dst`` with ``tag``; returns when ``x`` may be modified again.
        Messages between two peers arrive in the order they were sent."""
        self.isend(dst, x, tag=tag, timeout=timeout).wait()

    def isend(self, dst: int, x: Any, *, tag: int = 0,
              timeout: float | None = None) -> "SendRequest":
        """send's non-blocking twin (MPI's Isend): the message is queued now (this never
        blocks: a full ring or socket queues it, in order) and the request says when ``x``
        may be modified again; ``timeout`` (default the peer's) is its deadline."""
        if not 0 <= dst < self.world_size:
            raise ValueError(f"rank {self.rank}: cannot send to rank {dst} (world size "
                             f"{self.world_size})")
        _check_tag(tag, self.rank, f"send to rank {dst}", any_tag=False)
        tag = int(tag)
        stand_in, adapter, flat, dtype = contiguous_flat(x, read_only=True)   # (copy: sent)
        if dst == self.rank:   # a copy, queued here: x may change at once
            raw = bytes(adapter.send_buffer(flat, 0, adapter.size(flat)))
            with self._self_ready:
                self._to_self.append((dtype, tuple(x.shape), raw, tag))
                self._self_ready.notify_all()
            self.transport.recorder.count("send", len(raw))
            return SendRequest(None, dst, None, done=True)
        with self._lock:
            seq = self._send_seq[dst]
            self._send_seq[dst] += 1
        deadline = time.monotonic() + (self.timeout if timeout is None else timeout)
        call = Call(self.transport, self.channel, seq, send_signature(tag), dtype,
                    tuple(x.shape), deadline)
        ticket = post_range(call, dst, adapter, flat, 0, adapter.size(flat), track=True)
        self.transport.recorder.count("send", adapter.size(flat) * dtype_itemsize(dtype))
        return SendRequest(call, dst, ticket, stand_in)

    def recv(self, src: int, out: Any = None, *, tag: int | None = None,
             status: Status | None = None, timeout: float | None = None) -> Any:
        """Receive the next array ``src`` sent with ``tag`` (None: whatever its tag). Into
        ``out`` if given (its dtype and size must match), else a new numpy array (a
        single-chunk message is returned without a copy). ``status`` (a Status) gets its
        source, tag, dtype and shape."""
        self._check_source(src)
        _check_tag(tag, self.rank, f"recv from rank {src}", any_tag=True)
        tag = None if tag is None else int(tag)
        # out's own checks (family, writable) come before anything is taken from the mailbox;
        # a non-contiguous out is filled through a contiguous stand-in.
        stand_in: Any = None
        target: tuple[ArrayAdapter, Any, str] | None = None
        if out is not None:
            stand_in, out_adapter, out_flat, out_dtype = contiguous_flat(out)
            target = (out_adapter, out_flat, out_dtype)
        deadline = time.monotonic() + (self.timeout if timeout is None else timeout)
        if src == self.rank:
            return self._from_self(out, stand_in, target, deadline, tag, status)
        t = self.transport
        what = f"recv from rank {src}" + ("" if tag is None else f" (tag {tag})")
        record = t.recorder.begin(what, self.channel, self._recv_seq[src], (src,), 0)
        try:
            while True:
                held = self._take_held(self._early.get(src), tag, out, target, src)
                if held is not None:
                    if status is not None:
                        status.set(src, held[3], held[0], held[1], len(held[2]))
                    out = self._deliver(held, out, stand_in, target)
                    break
                seq = self._recv_seq[src]
                # Nothing arrived (timeout, lost peer): the mailbox stays open, so a later
                # recv (e.g. a poll with timeout=0) waits for the same message and the
                # sequence stays in step.
                item = t.recv(src, self.channel, seq, deadline=deadline, operation=what)
                header = item[0]
                theirs = send_tag(header.op)
                if tag is None or theirs is None or theirs == tag:
                    out = self._receive(src, seq, item, out, stand_in, target, deadline)
                    if status is not None:
                        status.set(src, -1 if theirs is None else theirs, header.dtype,
                                   header.shape, header.nbytes)
                    break
                self._hold_early(src, seq, item, theirs, deadline)   # (another tag's: kept)
        except BaseException as exc:
            t.recorder.end(record, exc)
            raise
        t.recorder.end(record, nbytes=int(getattr(out, "nbytes", 0)))
        return out

    def _receive(self, src: int, seq: int, item: tuple, out: Any, stand_in: Any,
                 target: tuple[ArrayAdapter, Any, str] | None, deadline: float) -> Any:
        """recv's body: message ``seq`` of ``src``, whose first chunk is ``item``, into
        ``target`` (``out``'s flat view)."""
        t = self.transport
        channel = self.channel
        key = (src, channel, seq)
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
            # (the signature the chunks must carry: the first one's, where a send made it)
            signature = header.op if send_tag(header.op) is not None else "send"
            call = Call(t, channel, seq, signature, header.dtype, header.shape, deadline)
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

    def _hold_early(self, src: int, seq: int, item: tuple, tag: int, deadline: float) -> None:
        """Receive message ``seq`` of ``src`` (of ``tag``, not the one asked for; ``item``
        its first chunk) whole and keep it for the receive that asks for its tag. Its chunks
        are on their way: they get the communicator's timeout at least, whatever the asking
        call's (a probe's is now; a message cut off half-way would be lost)."""
        deadline = max(deadline, time.monotonic() + self.timeout)
        array = self._receive(src, seq, item, None, None, None, deadline)
        with self._lock:
            self._early.setdefault(src, deque()).append(
                (str(array.dtype).removeprefix("torch."), tuple(array.shape),
                 _bytes_of(array), tag))

    def _take_held(self, held: "deque[_Held] | None", tag: int | None, out: Any,
                   target: tuple[ArrayAdapter, Any, str] | None, src: int) -> _Held | None:
        """The first message of ``held`` with ``tag`` (any, if None), taken out of it; None if
        there is none. ValueError if it does not fit ``target`` (``out``'s flat view; it
        stays, as a message in a mailbox does)."""
        if not held:
            return None
        with self._lock:
            for k, message in enumerate(held):
                dtype, shape, raw, theirs = message
                if tag is not None and theirs != tag:
                    continue
                if target is not None:
                    adapter, flat, out_dtype = target
                    if out_dtype != dtype or \
                            adapter.size(flat) * dtype_itemsize(dtype) != len(raw):
                        who = " (itself)" if src == self.rank else ""
                        raise ValueError(f"rank {self.rank}: recv from rank {src}{who}: it "
                                         f"sent {dtype} {shape} but out is {out_dtype} "
                                         f"{tuple(out.shape)}")
                del held[k]
                return message
        return None

    def _deliver(self, message: _Held, out: Any, stand_in: Any,
                 target: tuple[ArrayAdapter, Any, str] | None) -> Any:
        """A message held whole here, as recv returns it (into ``target`` if given)."""
        dtype, shape, raw, _ = message
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

    def _from_self(self, out: Any, stand_in: Any, target: tuple[ArrayAdapter, Any, str] | None,
                   deadline: float, tag: int | None, status: Status | None) -> Any:
        """The next message this peer sent itself with ``tag`` (recv's body for ``src`` =
        this rank)."""
        with self._self_ready:
            while True:
                message = self._take_held(self._to_self, tag, out, target, self.rank)
                if message is not None:
                    break
                left = deadline - time.monotonic()
                if left <= 0:
                    raise OperationTimeout(f"rank {self.rank}: recv from rank {self.rank} "
                                           f"(itself)" + ("" if tag is None else
                                                          f" with tag {tag}")
                                           + ": nothing sent within the timeout",
                                           rank=self.rank)
                self._self_ready.wait(left)
        if status is not None:
            status.set(self.rank, message[3], message[0], message[1], len(message[2]))
        return self._deliver(message, out, stand_in, target)

    def probe(self, src: int, *, tag: int | None = None, status: Status | None = None) -> bool:
        """True when a message from ``src`` (with ``tag``; None: any) is waiting (or its
        mailbox holds an error, e.g. a malformed message), so recv(src, tag=tag) returns or
        raises at once. A lost source with nothing queued is *not* ready: probe is False and
        recv raises PeerLost. What a source sent before it died stays receivable. Whether a
        source is gone: ``transport.is_lost`` (``peer.lost_peers()``). ``status`` (a Status)
        gets the waiting message's source, tag, dtype and shape."""
        self._check_source(src)
        if self.wait_any([src], 0.0, tag=tag) is None:
            return False
        if status is not None:
            self._describe(src, tag, status)
        return True

    def _describe(self, src: int, tag: int | None, status: Status) -> None:
        """``status`` filled for the message of ``src`` (with ``tag``) that recv would take
        next, held here or first in its mailbox (unchanged where that is an error)."""
        held = self._to_self if src == self.rank else self._early.get(src)
        with self._lock:
            for dtype, shape, raw, theirs in held or ():
                if tag is None or theirs == tag:
                    status.set(src, theirs, dtype, shape, len(raw))
                    return
        if src == self.rank:
            return
        t = self.transport
        key = (src, self.channel, self._recv_seq[src])
        item = t.inbox.take(key)
        if item is None:
            return
        t.inbox.unget(key, item)
        if type(item) is tuple:
            header = item[0]
            found = send_tag(header.op)
            status.set(src, -1 if found is None else found, header.dtype, header.shape,
                       header.nbytes)

    def wait_any(self, sources, timeout: float | None = None, *,
                 tag: int | None = None) -> int | None:
        """Wait (without polling) until a message from one of ``sources`` (with ``tag``;
        None: any) is waiting, and return that source (the first of ``sources`` that has
        one); None after ``timeout`` seconds (0: just look; None: the communicator's timeout)
        or once the peer is closed. Lost sources with nothing queued never count as ready
        (see probe). Looking for a tag receives the messages of other tags that come first
        (recv keeps them for their own receives)."""
        sources = [int(s) for s in sources]
        for src in sources:
            self._check_source(src)
        _check_tag(tag, self.rank, "wait_any", any_tag=True)
        wait = self.timeout if timeout is None else max(0.0, float(timeout))
        deadline = time.monotonic() + wait
        channel, seqs = self.channel, self._recv_seq
        others = [src for src in sources if src != self.rank]
        mine = len(others) < len(sources)
        while True:
            for src in sources:   # what is held whole here already
                held = self._to_self if src == self.rank else self._early.get(src)
                if held and self._has(held, tag):
                    return src
            if mine and not others:   # this peer alone: its own queue, woken by its sends
                with self._self_ready:
                    left = deadline - time.monotonic()
                    if self._has(self._to_self, tag):
                        return self.rank
                    if left <= 0:
                        return None
                    self._self_ready.wait(left)
                continue
            # (this peer itself among them: its own queue looked at every SELF_LOOK)
            until = min(deadline, time.monotonic() + SELF_LOOK) if mine else deadline
            key = self.transport.wait_any([(src, channel, seqs[src]) for src in others],
                                          until)
            if key is not None:
                if tag is None or self._next_is(key, tag, deadline):
                    return key[0]
                continue
            if time.monotonic() >= deadline:
                return self.rank if mine and self._has(self._to_self, tag) else None

    def _has(self, held: "deque[_Held]", tag: int | None) -> bool:
        with self._lock:
            return any(tag is None or message[3] == tag for message in held)

    def _next_is(self, key: tuple[int, int, int], tag: int, deadline: float) -> bool:
        """Whether the message waiting in mailbox ``key`` has ``tag`` (or is an error, which
        its receive raises at once); if not, it is received whole and kept (False)."""
        t = self.transport
        item = t.inbox.take(key)
        if item is None:
            return False
        theirs = send_tag(item[0].op) if type(item) is tuple else None
        if theirs is None or theirs == tag:   # (an error: its receive raises it)
            t.inbox.unget(key, item)
            return True
        self._hold_early(key[0], key[2], item, theirs, deadline)
        return False

    def _check_source(self, src: int) -> None:
        if not 0 <= src < self.world_size:
            raise ValueError(f"rank {self.rank}: cannot receive from rank {src} (world size "
                             f"{self.world_size})")


def _bytes_of(array: Any) -> Any:
    """The bytes of a received array (numpy, or torch for bfloat16), without a copy."""
    if isinstance(array, np.ndarray):
        return np.ascontiguousarray(array).reshape(-1).view(np.uint8).data
    import torch
    return array.reshape(-1).view(torch.uint8).numpy().data


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
