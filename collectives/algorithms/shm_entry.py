"""How peers on one host enter and leave a shared-memory call without ZeroMQ (issue #18), and
the waits every shared-memory algorithm uses.

Each peer owns one small arena (transport/shm_arena.py, kind "small"), mapped by the others
once, at the first shared-memory call, with one announcement over ZeroMQ
(``exchange_arenas``); after that no call of the on-host allreduces (shm_allreduce.py,
shm_small.py) or barrier touches ZeroMQ unless something goes wrong. The arena's data starts
with a slot header of 16 int64 words: the call's sequence number, a CRC of its signature,
dtype and shape, its byte count; the owner's pid, whether it can read every other peer's
memory directly (transport/cma.py: probed once, at the addresses the arenas were announced
with) and its step counter (``SharedEntry.steps``) as the call began; then ``SLOT_WORDS`` of
the algorithm's own (the large allreduce's data arena and array address). The counter in the
arena's header says how far its owner got, in absolute terms of the communicator's sequence
numbers: 2s + 1, header written for call s; 2s + 2, done with call s (done reading the
others' memory, or failed), so a call that failed half-way leaves nothing to resynchronise.

``enter`` waits until every other peer is done with this peer's previous call, writes the
header (and the algorithm's slot), publishes 2s + 1, waits for the others' 2s + 1 and
compares their headers: a peer that made another call at this sequence number (another
operation, size, dtype or algorithm, a barrier included) is a ProtocolError on every peer,
before anyone reads another's data, naming both calls (each arena's header page also holds
its owner's call in words, rewritten only when the call changes). ``leave`` publishes 2s + 2.

Waits (``wait_counters``) yield the CPU, then sleep on the awaited counter until it moves
(transport/futex.py: woken by the peer that bumps it, at most a millisecond), check the
call's ZeroMQ mailboxes every millisecond for what a peer sent instead (an abort, a chunk of
another algorithm's call) or its loss, and end at the call's deadline with the transport's
own timeout. Counters
in shared memory rely on stores becoming visible in program order (x86-64: SHARED_COUNTERS);
elsewhere the large allreduce announces and synchronises over ZeroMQ and the others are not
chosen (choice.py).
"""
from __future__ import annotations

import functools
import math
import os
import platform
import threading
import time
import zlib
from typing import Any, Callable

import numpy as np

from collectives import defaults
from collectives.algorithms.p2p import Call, post_range, recv_range, wait_sent
from collectives.arrays.adapter import ArrayAdapter, adapter_for
from collectives.errors import PeerLost, ProtocolError
from collectives.notices import LongWait
from collectives.transport import cma, futex
from collectives.transport.link import SendTicket
from collectives.transport.shm_arena import HEADER_BYTES, ArenaViews, ShmArena, counter_of
from collectives.transport.wait_errors import describe_wait

__all__ = ["SharedEntry", "SLOT_HEADER", "SLOT_WORDS", "SHARED_COUNTERS", "ANNOUNCEMENT_BYTES",
           "spin_seconds", "crowded",
           "PID", "DIRECT", "STEPS", "WORDS", "READ_MARK_SOURCES", "SharedBarrier",
           "shared_barrier", "exchange_arenas", "map_arena", "wait_counters", "check_mailbox",
           "await_abort", "count_shared"]

#: Bytes of the slot header at the start of each small arena's data (16 int64 words).
SLOT_HEADER = 128
#: The header's words (after seq, CRC and byte count): the owner's pid, its direct-read flag,
#: its step counter at the call's start; the algorithm's words from WORDS on, SLOT_WORDS.
PID, DIRECT, STEPS, WORDS = 3, 4, 5, 6
SLOT_WORDS = SLOT_HEADER // 8 - WORDS
#: Where each small arena's header page holds its step counter (a cache line of its own).
_STEPS_OFFSET = 64
#: Where it holds its owner's read marks (neighbor_direct.py): per source rank below
#: READ_MARK_SOURCES, four int64 words: the sequence number of the neighbour exchange in
#: which the owner reads that source's array, then a futex pair (transport/futex.py: how many
#: of its elements the owner has read so far, and whether the source sleeps on it), then one
#: unused (32 bytes a source).
_MARKS_OFFSET = 128
#: Where it describes its owner's call in words (two int64: the call's CRC, the text's length;
#: then the text), so a peer whose call differs names it, not its CRC. Rewritten only when the
#: owner's call differs from its last one: a loop of one call writes it once.
_CALL_OFFSET = 2048
_CALL_TEXT_MAX = HEADER_BYTES - _CALL_OFFSET - 16
#: The sources whose reads a peer marks: ranks 0-59 (the words between the step counter and
#: the call in words).
READ_MARK_SOURCES = (_CALL_OFFSET - _MARKS_OFFSET) // 32
#: (pid, fd, size, counter, address) as int64: an arena's announcement.
ANNOUNCEMENT_BYTES = 40
#: How long a wait yields the CPU in a loop before it sleeps, when the peers have a CPU each:
#: a peer that sleeps wakes tens of microseconds late (timer slack), which every small call
#: would pay; longer, it takes CPU from the caller's other threads (4 KiB, n = 2, `gossip
#: bench`: 0.2 ms, 24-72 us, median 26 of 6 invocations; 2 ms, 42-55 us). With more peers
#: than CPUs, spinning takes the CPU the awaited peer needs: 50 us.
SPIN_SECONDS = 0.0002
_SPIN_CROWDED = 5e-5
_CPUS = len(os.sched_getaffinity(0))   # (as the process started)
#: Barriers through the arenas' counters (x86-64's ordered stores), else over ZeroMQ.
SHARED_COUNTERS = platform.machine() in ("x86_64", "AMD64")


def spin_seconds(peers: int) -> float:
    """How long a wait of ``peers`` on this host yields the CPU before it sleeps."""
    return _SPIN_CROWDED if crowded(peers) else SPIN_SECONDS


def crowded(peers: int) -> bool:
    """Whether ``peers`` on this host outnumber its CPUs (as this process started): then a
    peer that waits takes the CPU of one that works, and a copy shared out to a peer that
    would otherwise wait gains nothing."""
    return peers > _CPUS


class SharedEntry:
    """A communicator's small arena, its mappings of the peers', and the last call through
    them. Used by one call at a time (choice.py's SequenceOrder). ``steps``: every peer's
    step counter (counter_of's pair; only its owner bumps it), for barriers within a call
    (SharedBarrier). ``direct``: every peer can read every other's memory, as the last
    entry's headers said (the same on every peer; None before the first entry); once True,
    it stays True. ``can_read``: this peer can read every other's."""

    #: Whether peers read each other's memory directly where the system lets them
    #: (transport/cma.py); tests turn it off to exercise the arenas.
    direct_reads = cma.available()

    def __init__(self, rank: int, data_bytes: int) -> None:
        self.arena = ShmArena(rank, kind="small")
        self.views = ArenaViews(kind="small")
        self.data_bytes = data_bytes   # what the slot holds after its header
        self.arenas: dict[int, np.ndarray] | None = None   # after the first exchange
        self.steps: dict[int, np.ndarray] = {}
        self.direct: bool | None = None   # (None: before the first entry)
        self.can_read = False   # this peer reads every other (probed as the arenas are mapped)
        self._others: list[int] = []   # every other rank (set by ready())
        self._counters: dict[int, np.ndarray] = {}   # views of their counters
        self._headers: dict[int, np.ndarray] = {}    # and of their slot headers
        self._last = -1
        #: The sequence number of the last call whose header this peer published: the
        #: others may have seen its words (the arrays they read or write) from then on.
        self.published = -1
        # The peers that read this peer's slot in its last call (None: every other).
        self._readers: list[int] | None = None
        self._pid = os.getpid()
        self._described = -1   # the CRC of the call this peer's arena describes in words
        self._parts: dict[tuple, list] = {}   # parts(): views by (family, dtype, count)
        #: Held by the neighbour exchange that writes this peer's read marks (one at a time).
        self.marks_lock = threading.Lock()

    def slot(self, j: int) -> np.ndarray:
        """Rank j's slot data (uint8), after its header."""
        if self.arenas is None:
            raise RuntimeError("the peers' slots are mapped by ready(), the first call's")
        start = HEADER_BYTES + SLOT_HEADER
        return self.arenas[j][start:start + self.data_bytes]

    def parts(self, adapter: ArrayAdapter, call: Call, count: int) -> list:
        """Every rank's slot data as an array of ``count`` elements of ``call``'s frame dtype
        in ``adapter``'s family, by rank: views made once per mapping and (family, dtype,
        count), so a loop of one small call makes none."""
        dtype = call.frame_dtype
        key = (adapter.kind, dtype, count)
        views = self._parts.get(key)
        if views is None:
            if self.arenas is None:
                raise RuntimeError("the peers' slots are mapped by ready(), the first call's")
            if len(self._parts) >= 64:   # (a program of many sizes: bounded)
                self._parts.clear()
            nbytes = count * call.itemsize
            views = self._parts[key] = [adapter.from_frame(self.slot(j)[:nbytes], dtype, count)
                                        for j in range(len(self.arenas))]
        return views

    def enter(self, call: Call, nbytes: int, words: Any = (),
              write: Callable[[], None] | None = None,
              among: list[int] | None = None,
              keep: bool = True) -> dict[int, np.ndarray]:
        """Enter ``call`` (see the module docstring): ``write`` fills this peer's slot once
        the others are done with the previous call. Returns every peer's header (16 int64,
        a copy; ``keep=False``: an empty dict, for a caller that reads none). Call ``leave``
        afterwards, whatever happens. ``among``: the only peers this
        call waits for and compares, and that read this peer's slot (a neighbour exchange's
        sources and destinations; every peer still enters the call, with its own); the next
        call waits for those of them that are not lost to be done with this one, not for
        every peer, and ``direct`` is not changed."""
        t = call.transport
        n, r, s = t.world_size, t.rank, call.seq
        self.ready(call)
        others = self._others if among is None else sorted(among)
        counters, headers = self._counters, self._headers
        crc, text = _crc(call.signature, call.dtype, call.shape)
        if self._last >= 0:   # everyone is done with this peer's last call
            readers = self._readers
            if readers is None:
                readers = self._others
            else:   # (a neighbour exchange's: a lost one reads nothing any more)
                lost = t.lost_ranks()
                readers = [j for j in readers if j not in lost]
            wait_counters(call, counters, {j: 2 * self._last + 2 for j in readers},
                          "the end of the previous call")
        self._readers = None if among is None else others
        if crc != self._described:
            self._describe(r, crc, text)
        header = headers[r]
        header[:WORDS] = (s, crc, nbytes, self._pid, self.can_read, self.steps[r][0])
        header[WORDS:WORDS + len(words)] = words
        if write is not None:
            write()
        futex.publish(counters[r], 2 * s + 1)   # after the header and the slot
        self.published = s
        wait_counters(call, counters, {j: 2 * s + 1 for j in others}, "the call")
        for j in others:
            seq, theirs, got = headers[j][:3].tolist()
            if among is not None and seq > s:
                # It went on past this call without waiting for this peer to leave it, which
                # it does only if its call did not name this one (the caller's pattern check
                # words it: moved_on).
                continue
            if (seq, theirs, got) != (s, crc, nbytes):
                if seq != s:   # it marked itself done without writing: it failed
                    await_abort(call, j)
                named = self._their_call(j, theirs) if seq == s else None
                other = (f"called {named} at that sequence" if named is not None else
                         f"was at its call of sequence {seq} instead" if seq != s else
                         f"made another call ({got} bytes, signature CRC {theirs:08x} against "
                         f"{crc:08x}) at that sequence")
                raise ProtocolError(f"rank {r}: called {call.describe()}, but rank {j} {other}"
                                    ": the peers made different calls")
        if among is not None:
            return {j: headers[j].copy() for j in [r] + others} if keep else {}
        if not self.direct:   # (once True it stays True: read until then)
            self.direct = all(headers[j][DIRECT] == 1 for j in range(n))
        return {j: headers[j].copy() for j in range(n)} if keep else {}

    def moved_on(self, call: Call, j: int) -> bool:
        """Whether peer ``j`` (one of ``enter(among=...)``'s) has gone on past ``call``: its
        call did not name this peer, and its slot may hold a later call's. Read after what
        was read of its slot, this says whether that was still ``call``'s (x86-64 keeps a
        peer's stores, header before slot, and this peer's loads in order)."""
        return int(self._headers[j][0]) > call.seq

    def _describe(self, rank: int, crc: int, text: bytes) -> None:
        """Write this peer's call in words into its arena's header page (before the call's
        header is published: x86-64 keeps the stores in order), stamped with its CRC."""
        assert self.arenas is not None   # (mapped by ready(), before any call)
        page = self.arenas[rank]
        words = page[_CALL_OFFSET:_CALL_OFFSET + 16].view(np.int64)
        words[0] = -1   # (no reader looks while it is rewritten: see their_call)
        page[_CALL_OFFSET + 16:_CALL_OFFSET + 16 + len(text)] = np.frombuffer(text, np.uint8)
        words[1] = len(text)
        words[0] = crc
        self._described = crc

    def _their_call(self, j: int, crc: int) -> str | None:
        """Rank j's call in words, if its arena describes the call of CRC ``crc`` (the one its
        header names; it rewrites the words only for a later call, after every peer left this
        one), else None."""
        assert self.arenas is not None   # (mapped by ready(), before any call)
        page = self.arenas[j]
        stamp, length = page[_CALL_OFFSET:_CALL_OFFSET + 16].view(np.int64).tolist()
        if stamp != crc or not 0 < length <= _CALL_TEXT_MAX:
            return None
        return bytes(page[_CALL_OFFSET + 16:_CALL_OFFSET + 16 + length]).decode(
            "utf-8", "replace")

    def read_marks(self, j: int) -> np.ndarray:
        """Rank j's read marks (four int64 words by source rank, READ_MARK_SOURCES of them:
        the sequence number of the exchange, the elements read and its futex flag; only j
        writes the first two). The arenas are mapped by the first entry, which every direct
        read comes after."""
        assert self.arenas is not None   # (mapped by ready(), before any call)
        return self.arenas[j][_MARKS_OFFSET:_CALL_OFFSET].view(np.int64)

    def await_readers(self, call: Call, readers: Any) -> None:
        """Once this peer left ``call``: return when every peer in ``readers`` (those that
        read this peer's arrays) left it too, so the caller may change its arrays."""
        if readers:
            wait_counters(call, self._counters, {j: 2 * call.seq + 2 for j in readers},
                          "the end of its readers' reads")

    def not_left(self, call: Call, ranks: Any) -> list[int]:
        """Those of ``ranks`` that have not left ``call`` yet (a lost one included: one
        declared lost may still run)."""
        return [j for j in ranks if self._counters[j][0] < 2 * call.seq + 2]

    def leave(self, call: Call) -> None:
        """Done with ``call`` (or failed in it): the others may reuse what they shared."""
        if self.arenas is not None:
            futex.publish(self._counters[call.transport.rank], 2 * call.seq + 2)
            self._last = call.seq

    def ready(self, call: Call) -> None:
        """Map the peers' arenas (over ZeroMQ, as the first such call's first elements) and
        probe whether their memory can be read directly; once per communicator."""
        if self.arenas is not None:
            return
        t = call.transport
        others = [j for j in range(t.world_size) if j != t.rank]
        if self.direct_reads:
            cma.allow_readers()   # before the others can know of this peer
        self.arenas, announced = exchange_arenas(call, others, self.arena, self.views,
                                                 SLOT_HEADER + self.data_bytes)
        reader = cma.Reader()
        self.can_read = self.direct_reads and all(
            reader.probe(int(announced[j][0]), int(announced[j][4])) for j in others)
        self._others = others
        self._counters = {j: counter_of(a) for j, a in self.arenas.items()}
        self.steps = {j: a[_STEPS_OFFSET:_STEPS_OFFSET + 16].view(np.int64)
                      for j, a in self.arenas.items()}
        self._headers = {j: a[HEADER_BYTES:HEADER_BYTES + SLOT_HEADER].view(np.int64)
                         for j, a in self.arenas.items()}
        self._described = -1
        self._parts = {}
        self.direct = None   # (until these mappings' first entry)

    def close(self) -> None:
        self.arenas, self._counters, self._headers, self.steps = None, {}, {}, {}
        self._parts = {}
        self.views.close()
        self.arena.close()


def shared_barrier(entry: SharedEntry, order: Any) -> Callable[[Call], None]:
    """The communicator's barrier on one host (choice.py): a call entered and left through
    ``entry``, in sequence order; it returns once every peer has entered it."""
    def barrier(call: Call) -> None:
        with order.turn(call):
            try:
                entry.enter(call, 0, keep=False)
            finally:
                entry.leave(call)
    return barrier


class SharedBarrier:
    """A call's barriers: ``barrier()`` returns once every peer reached it. A peer bumps its
    ``counters[j]`` (counter_of's pair: only it writes [0]) after its writes and waits until every
    other's reached the same step of this call, counted from ``bases[j]`` (their values as
    the call began, so a call that failed half-way on some peers leaves nothing out of step).
    Not x86-64: empty chunks of the call over ZeroMQ; ``tickets``, their sends, to see
    through before returning."""

    def __init__(self, call: Call, adapter: ArrayAdapter, flat: Any, others: list[int],
                 counters: dict[int, np.ndarray], bases: dict[int, int]) -> None:
        self.call, self.adapter, self.flat, self.others = call, adapter, flat, others
        self.counters, self.bases, self.step = counters, bases, 0
        self.tickets: list[SendTicket] = []

    def __call__(self) -> None:
        call, others = self.call, self.others
        if not SHARED_COUNTERS:   # empty chunks of the call, each way
            self.tickets += [tk for tk in (post_range(call, j, self.adapter, self.flat, 0, 0)
                                           for j in others) if tk is not None]
            for j in others:
                for _ in recv_range(call, j, self.adapter, 0, 0):
                    pass
            return
        self.step += 1
        me = call.transport.rank
        futex.publish(self.counters[me], self.bases[me] + self.step)   # after its writes
        wait_counters(call, self.counters, {j: self.bases[j] + self.step for j in others},
                      f"step {self.step} of the shared-memory allreduce")


@functools.lru_cache(maxsize=256)
def _crc(signature: str, dtype: str, shape: tuple) -> tuple[int, bytes]:
    """What a slot header says of its call (besides its sequence number and bytes), and the
    call in words (SharedEntry._describe), cut to what the header page holds."""
    text = f"{signature} {dtype} {shape}".encode()
    return zlib.crc32(text), text[:_CALL_TEXT_MAX]


def exchange_arenas(call: Call, others: list[int], arena: ShmArena, views: ArenaViews,
                    nbytes: int) -> tuple[dict[int, np.ndarray], dict[int, np.ndarray]]:
    """Announce this peer's ``arena`` (grown to ``nbytes`` of data) over ZeroMQ and map the
    others' into ``views``; their announcements also say they finished the call before (no
    one still reads here). Returns every peer's arena bytes and its announcement (int64:
    pid, fd, size, counter, address)."""
    t = call.transport
    mine = arena.buffer(nbytes)
    # The announcement travels as the call's first elements (its 40 bytes read as the
    # call's dtype), so a peer whose call differs (op, dtype, shape) fails here, before a
    # byte of anyone's memory is read.
    k = -(-ANNOUNCEMENT_BYTES // call.itemsize)
    note = np.zeros(k * call.itemsize, dtype=np.uint8)
    note[:ANNOUNCEMENT_BYTES] = arena.announcement().view(np.uint8)
    note = note.view(np.dtype(call.dtype))
    na = adapter_for(note)
    tickets = [post_range(call, j, na, note, 0, k, track=True) for j in others]
    arenas = {t.rank: mine}
    announced = {t.rank: arena.announcement()}
    for j in _arrivals(call, others):   # in arrival order: a lost peer is named at once
        got = np.empty(k, dtype=np.dtype(call.dtype))
        for lo, hi, chunk in recv_range(call, j, na, 0, k):
            got[lo:hi] = chunk
        announced[j] = got = got.view(np.uint8)[:ANNOUNCEMENT_BYTES].view(np.int64).copy()
        arenas[j] = map_arena(call, views, j, got, nbytes)
    for ticket in tickets:
        wait_sent(call, ticket)
    return arenas, announced


def map_arena(call: Call, views: ArenaViews, j: int, announced: np.ndarray,
              nbytes: int) -> np.ndarray:
    """Rank j's arena as ``announced`` (pid, fd, size), holding at least ``nbytes`` of data:
    PeerLost if its process is gone, ProtocolError if it cannot be mapped or is too small."""
    r = call.transport.rank
    try:
        arena = views.view(j, announced)
    except FileNotFoundError:
        raise PeerLost(f"rank {r}: {call.describe()}: rank {j} ended (process "
                       f"{int(announced[0])}) before its shared-memory arena was mapped",
                       rank=j, operation=call.describe()) from None
    except (OSError, ValueError) as exc:
        raise ProtocolError(f"rank {r}: {call.describe()}: cannot map rank {j}'s "
                            f"shared-memory arena: {exc}") from None
    if arena.size < nbytes + HEADER_BYTES:
        raise ProtocolError(f"rank {r}: {call.describe()}: rank {j}'s arena holds "
                            f"{arena.size} bytes, {nbytes} needed")
    return arena


def count_shared(transport: Any, rank: int, nbytes: int) -> None:
    """``nbytes`` of this peer's arena that ``rank`` reads, in the traffic counters."""
    transport.counters[rank].bytes_sent += nbytes


def _long_wait(call: Call, pending: list[int], what: str, start: float) -> LongWait:
    """The notice of a shared-memory wait of ``call`` since ``start`` on the ``pending``
    ranks (notices.LongWait), worded with what the first of them is doing."""
    def words() -> str:
        on = f"rank {pending[0]}" if len(pending) == 1 else f"ranks {pending}"
        return describe_wait(call.transport, pending[0], call, call.channel, call.seq,
                             f"waiting on {on} to reach {what} (shared memory)")
    return LongWait(words, start, call.deadline, timeout=call.timeout)


def _arrivals(call: Call, others: list[int]):
    """The ranks of ``others`` as their first message of the call arrives (or their loss is
    known, or this peer closes: their recv raises); past the deadline, the first still silent
    (its recv raises the transport's timeout, which asks it where it is). Reads the socket
    in this thread while it waits, as a recv does (no hand-off to the I/O thread)."""
    t = call.transport
    pending = list(others)
    notice = _long_wait(call, pending, "the arenas' exchange", time.monotonic())
    while pending:
        ready = [j for j in pending if t.inbox.poll((j, call.channel, call.seq))]
        now = time.monotonic()
        notice.check(now)
        if ready or now >= call.deadline:
            j = (ready or pending)[0]
            pending.remove(j)
            yield j
            continue
        until = min(call.deadline, now + 0.005)
        if not t.pump((pending[0], call.channel, call.seq), until):   # another thread reads
            t.wait_any([(j, call.channel, call.seq) for j in pending], until)


def wait_counters(call: Call, counters: dict[int, np.ndarray], targets: dict[int, int],
                  what: str) -> None:
    """Return once ``counters[j][0] >= targets[j]`` for every j: yielding the CPU, then
    sleeping on the first awaited counter (futex.wait, woken as it moves), checking the call's
    mailboxes every millisecond for what a peer we wait for sent instead (an abort: raised
    as the transport words it; a chunk: ProtocolError) or its loss (PeerLost), and raising
    OperationTimeout at the call's deadline."""
    pending = [j for j, target in targets.items() if counters[j][0] < target]
    if not pending:   # (a small call's first wait, as a rule: nothing to wait for)
        return
    now = start = time.monotonic()
    spin_until = now + spin_seconds(call.transport.world_size)
    check_at = now + 0.001
    # (The notice is made only if it is due: a call of 26 us makes no object for it.)
    notice_at = start + defaults.LONG_WAIT if call.deadline > start + defaults.LONG_WAIT \
        else math.inf
    waited_on = pending
    while pending:
        if now >= check_at:
            _check(call, pending, now, what)
            check_at = now + 0.001
            if now >= notice_at:
                notice_at = math.inf
                _long_wait(call, pending, what, start).check(now)
        if now < spin_until:
            os.sched_yield()
        else:   # a long wait: sleep until the first awaited counter moves, or the next check
            futex.wait(counters[pending[0]], targets[pending[0]], max(1e-5, check_at - now))
        waited_on = pending
        pending = [j for j in pending if counters[j][0] < targets[j]]
        now = time.monotonic()
    if now > start:   # the wait was on the last to arrive (the flight recorder's waits)
        recorder = call.transport.recorder
        for j in waited_on:
            recorder.waited_on(j, now - start)


def _check(call: Call, pending: list[int], now: float, what: str) -> None:
    check_mailbox(call, pending)
    if now >= call.deadline:
        # The transport's own timeout, which asks the peer where it is ("has not started
        # allreduce ... idle since ..."), as any wait on it would.
        t = call.transport
        header, _, release = t.recv(pending[0], call.channel, call.seq,
                                    deadline=call.deadline, operation=call)
        if release is not None:
            release()
        raise call.mismatch(pending[0], header, f"a message instead of reaching {what}")


def check_mailbox(call: Call, ranks: list[int]) -> None:
    """Raise what one of ``ranks`` sent for this call over ZeroMQ while we wait for it in
    shared memory (an abort, as the transport words it; a chunk: ProtocolError), or its loss
    (PeerLost); return if nothing came."""
    t = call.transport
    for j in ranks:
        if t.inbox.poll((j, call.channel, call.seq)):
            header, _, release = t.recv(j, call.channel, call.seq, deadline=call.deadline,
                                        operation=call)
            if release is not None:
                release()
            raise call.mismatch(j, header, "a message during a shared-memory wait")


def await_abort(call: Call, j: int, grace: float = 0.2) -> None:
    """Raise the abort rank ``j`` sent for this call (it failed), if it comes within
    ``grace`` seconds; else return. Empty chunks it sent before (a neighbour exchange's
    "done") are passed over; any other chunk is a ProtocolError."""
    t = call.transport
    deadline = time.monotonic() + grace
    while time.monotonic() < deadline:
        if not t.inbox.poll((j, call.channel, call.seq)):
            time.sleep(0.001)
            continue
        header, _, release = t.recv(j, call.channel, call.seq, deadline=call.deadline,
                                    operation=call)   # (an abort raises here)
        if release is not None:
            release()
        if header.length:
            raise call.mismatch(j, header, "a message during a shared-memory wait")
