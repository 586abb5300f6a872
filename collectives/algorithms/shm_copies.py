"""The collectives that move data without reducing it, and reduce_scatter, among peers on one
host (issue #37): broadcast, allgather, alltoall, gather, scatter and reduce_scatter read
what each peer needs straight out of the others' arrays (transport/cma.py), one copy per
byte, with no ZeroMQ message and no arena between them. Where one peer would copy alone
while the others wait, they write instead (process_vm_writev, ``put``): a gather's peers
write their parts into the root's output at once, and a broadcast's root writes a share of
every peer's array while they read the rest (where the peers have a CPU each).

A call is entered through the peers' small arenas as the on-host allreduces are
(shm_entry.py): the slot header carries the address of the array this peer's readers read
(its ``x``; the root's for broadcast and scatter), the entry compares every peer's call
(operation, root, dtype, shape) before anyone reads anything, and says whether every peer can
read every other's memory. Then each peer copies what it needs, shm_direct.READ_BYTES at a
time (faster than one read of a large array), leaves
the call (shm_entry.py's counter: done reading the others), and returns once the peers that
read or write its arrays left it too: none returns (and lets its caller change or free its
array) while another still reads or writes it, and none waits for peers that touch nothing
of it (a gather's peers return once their part is written; only the root waits). A call
that fails on a peer keeps the array the others write into alive (``held``) until a later
call has seen every peer past it: a peer that comes late still writes into memory that is
this call's, never into memory freed and used again.
Where some peer
cannot read the others (ptrace rules, another user), the call runs the operation's ZeroMQ
algorithm instead, the same on every peer: the entry's flag is every peer's.

Small calls (what any peer announces fits in its slot of the entry, 64 KiB:
``slot_bytes``) go through the slots instead: each peer writes what it announces into its own
slot as it enters, every peer copies (or reduces) what it needs out of the others' slots, and
leaves; nobody waits for its readers, since a peer writes its slot again only once every other
left its previous call (the entry's first wait). One wait per call instead of two, and no
system call per read (issue #37, item 3).

An alltoall with send counts (``exchange``) is entered the same way, once: each peer's counts
travel in its slot with the entry, its array after them where both fit, so every peer knows
every block's size and place once it entered, and the blocks come out of the slots (every
array fits its slot) or out of the senders' arrays; no message ahead of the entry.

What a peer reads of another counts as bytes that other sent it (transport.counters), as the
messages would. Only with shared counters (x86-64) and every peer on this host with shared
memory (choice.py's ``on_host_copies``).
"""
from __future__ import annotations

from typing import Any, Callable, Protocol

import numpy as np

from collectives.algorithms.p2p import Call
from collectives.algorithms import shm_direct
from collectives.algorithms.shm_direct import (address_of, read_range, reduce_aside,
                                               write_range)
from collectives.algorithms.shm_entry import PID, WORDS, SharedEntry, count_shared
from collectives.arrays.adapter import ArrayAdapter
from collectives.transport import cma

__all__ = ["OnHostCopies", "CallArrays", "PeerArrays", "SlotArrays"]


class CallArrays(Protocol):
    """What an operation's ``move`` reads the other peers' arrays through: PeerArrays
    (straight out of their memory) or SlotArrays (out of their slots)."""

    notes: dict[int, int]

    def copy(self, j: int, start: int, into: Any, lo: int, hi: int) -> None: ...

    def put(self, j: int, start: int, src: Any, lo: int, hi: int) -> None: ...

    def reduce(self, op: str, into: Any, at: int, start: int, stop: int,
               others: list[int], *, divide_by: int = 0) -> None: ...

    def scratch(self, name: str, count: int) -> Any: ...


class PeerArrays:
    """The arrays the peers of one call announced (each peer's ``read`` and its ``target``,
    where it announced them): ``copy`` reads a run of a peer's ``read`` into a run of an array
    here; ``put`` writes a run of an array here into a peer's ``target``; ``reduce`` reduces
    runs of the others' ``read`` into one here. ``notes``: the number each peer announced with
    its arrays (what only it decides and the others must follow: the share of a broadcast its
    root writes)."""

    def __init__(self, call: Call, adapter: ArrayAdapter, headers: dict[int, np.ndarray],
                 reader: cma.Reader, buffers: dict[str, np.ndarray]) -> None:
        self.call, self.adapter, self.reader = call, adapter, reader
        self._buffers = buffers
        self.pid = {j: int(h[PID]) for j, h in headers.items()}
        self.read = {j: int(h[WORDS]) for j, h in headers.items()}
        self.target = {j: int(h[WORDS + 1]) for j, h in headers.items()}
        self.notes: dict[int, int] = {j: int(h[WORDS + 2]) for j, h in headers.items()}

    def copy(self, j: int, start: int, into: Any, lo: int, hi: int) -> None:
        """Elements [start, start + hi - lo) of rank j's ``read`` array into ``into[lo:hi]``
        (a flat array of the call's adapter)."""
        if hi <= lo:
            return
        size = self.call.itemsize
        nbytes = (hi - lo) * size
        count_shared(self.call.transport, j, nbytes)
        read_range(self.reader, self.call, j, (self.pid[j], self.read[j]), start * size,
                   address_of(self.adapter, into, lo), nbytes)

    def put(self, j: int, start: int, src: Any, lo: int, hi: int) -> None:
        """``src[lo:hi]`` (a flat array of the call's adapter here) into elements
        [start, start + hi - lo) of rank j's ``target`` (process_vm_writev): the copy a peer
        that would otherwise wait makes for a peer that would otherwise make it (a broadcast's
        root writes a share of every reader's array while they read the rest; a gather's peers
        write their parts into the root's output at once instead of the root reading them one
        after the other). Rank j returns only once this peer left the call."""
        if hi <= lo:
            return
        size = self.call.itemsize
        nbytes = (hi - lo) * size
        count_shared(self.call.transport, j, nbytes)
        write_range(self.reader, self.call, j, (self.pid[j], self.target[j]), start * size,
                    address_of(self.adapter, src, lo), nbytes)

    def scratch(self, name: str, count: int) -> Any:
        """An array of ``count`` elements of the call (its adapter's family) for this call
        alone, kept from call to call under ``name``: a loop of one call faults no fresh pages
        in (a fresh 1 MiB buffer a call cost a 4 MiB reduce of 4 peers 0.4 ms a peer)."""
        nbytes = count * self.call.itemsize
        return self.adapter.from_frame(self._bytes(name, nbytes)[:nbytes],
                                       self.call.frame_dtype, count)

    def _bytes(self, name: str, nbytes: int) -> np.ndarray:
        buffer = self._buffers.get(name)
        if buffer is None or buffer.size < nbytes:
            buffer = self._buffers[name] = np.empty(nbytes, np.uint8)
        return buffer

    def reduce(self, op: str, into: Any, at: int, start: int, stop: int,
               others: list[int], *, divide_by: int = 0) -> None:
        """``into[at:at + stop - start]`` reduced by ``op`` with elements [start, stop) of
        every peer in ``others`` (in that order), then divided by ``divide_by`` if given (op
        "mean"), block by block, each block aside and written whole (shm_direct.reduce_aside:
        a peer lost half-way leaves each element as it was or at its result)."""
        size = self.call.itemsize
        for j in others:
            count_shared(self.call.transport, j, (stop - start) * size)
        scratch = self._bytes("block", 2 * min(shm_direct.BLOCK_BYTES,
                                               max(1, stop - start) * size))
        reduce_aside(self.reader, self.call, self.adapter, op, into, at=at, start=start,
                     stop=stop, where={j: (self.pid[j], self.read[j]) for j in others},
                     scratch=scratch, divide_by=divide_by)


class SlotArrays:
    """PeerArrays' reads for a call small enough for the slots: rank j's ``read`` array is
    the start of its slot. Nothing is written into another peer's array this way (a gather
    through the slots is read by the root, out of every slot)."""

    def __init__(self, call: Call, adapter: ArrayAdapter, entry: SharedEntry,
                 offset: int = 0) -> None:
        self.call, self.adapter, self.entry = call, adapter, entry
        self.offset = offset   # where the arrays start in the slots (after shared words)
        self.notes: dict[int, int] = {}   # (nothing is announced with the slots)

    def part(self, j: int, start: int, count: int) -> Any:
        """Elements [start, start + count) of what rank j wrote into its slot."""
        size, at = self.call.itemsize, self.offset
        return self.adapter.from_frame(
            self.entry.slot(j)[at + start * size:at + (start + count) * size],
            self.call.frame_dtype, count)

    def put(self, j: int, start: int, src: Any, lo: int, hi: int) -> None:
        """Never: a peer writes only its own slot (a move that puts checks for SlotArrays)."""
        raise ValueError("a call through the slots writes into no other peer's array")

    def copy(self, j: int, start: int, into: Any, lo: int, hi: int) -> None:
        """As PeerArrays.copy, out of rank j's slot."""
        if hi <= lo:
            return
        count_shared(self.call.transport, j, (hi - lo) * self.call.itemsize)
        self.adapter.copy(self.adapter.slice(into, lo, hi), self.part(j, start, hi - lo))

    def reduce(self, op: str, into: Any, at: int, start: int, stop: int,
               others: list[int], *, divide_by: int = 0) -> None:
        """As PeerArrays.reduce, out of the others' slots (in the order of ``others``), in
        place: the slots are in memory already, so nothing can fail half-way."""
        if stop <= start:
            return
        mine = self.adapter.slice(into, at, at + stop - start)
        for j in others:
            count_shared(self.call.transport, j, (stop - start) * self.call.itemsize)
            self.adapter.reduce(op, mine, self.part(j, start, stop - start))
        if divide_by:
            self.adapter.divide(mine, divide_by)

    def scratch(self, name: str, count: int) -> Any:
        """An array of ``count`` elements of the call for this call (small: made anew)."""
        return self.adapter.from_frame(np.empty(count * self.call.itemsize, np.uint8),
                                       self.call.frame_dtype, count)


class OnHostCopies:
    """A communicator's on-host copies: its entry (shared with the allreduces), their order,
    a reader (and writer), and the arrays of failed calls it keeps alive (``held``)."""

    def __init__(self, entry: SharedEntry, order: Any) -> None:
        self.entry = entry
        self.order = order   # choice.py's SequenceOrder: one shared-memory call at a time
        self.reader = cma.Reader()
        #: The ``target`` arrays of failed calls that a peer may still write into: kept
        #: alive until the next call's entry has seen every peer past them.
        self.held: list[Any] = []
        #: PeerArrays.scratch's buffers, by name (one call at a time uses them).
        self.buffers: dict[str, np.ndarray] = {}

    def __call__(self, call: Call, adapter: ArrayAdapter, read: Any,
                 move: Callable[[CallArrays], None], fallback: Callable[[], Any],
                 readers: Any = None, *, slot_bytes: int, target: Any = None,
                 note: int = 0) -> None:
        """Run ``call``: announce ``read`` (the flat array this peer's readers read, or None)
        and ``target`` (the one the others write into with ``put``, or None), then ``move``
        (the copies of this peer, through a PeerArrays or a SlotArrays) once every peer
        entered; leave the call, and return once the peers that read or write this peer's
        arrays (``readers``: every other peer if None) left it too. ``fallback`` (the ZeroMQ
        algorithm) where some peer cannot read the others. ``slot_bytes``: the most bytes any
        peer of the call announces as ``read`` (the same on every peer, from the call's agreed
        sizes): up to a slot's size (``fits``) the call goes through the slots (the module
        docstring), and ``target`` is not used. ``note``: a number the others' ``move`` sees
        (PeerArrays.notes)."""
        t = call.transport
        touching = [j for j in range(t.world_size) if j != t.rank] if readers is None \
            else list(readers)
        with self.order.turn(call):
            try:
                if self.fits(slot_bytes):
                    self._through_slots(call, adapter, read, move)
                    return
                try:
                    self._direct(call, adapter, read, move, fallback, touching=touching,
                                 target=target, note=note)
                except BaseException:
                    # A peer that writes into ``target`` may not have left the call yet (this
                    # one failed on another's loss, or timed out, maybe before that peer even
                    # entered and saw the address): the array stays alive, not freed under
                    # its write, until a later call's entry has seen every peer past this one.
                    # Only a call whose header went out (a peer may have seen the address);
                    # so at most one array a call, and a later call that fails before
                    # publishing (a peer still in this one) holds nothing more.
                    if target is not None and self.entry.published == call.seq and \
                            self.entry.not_left(call, touching):
                        self.held.append(target)
                    raise
            finally:
                self.entry.leave(call)

    def _direct(self, call: Call, adapter: ArrayAdapter, read: Any,
                move: Callable[[CallArrays], None], fallback: Callable[[], Any], *,
                touching: list[int], target: Any, note: int) -> None:
        headers = self.entry.enter(call, call.nbytes,
                                   (_address(adapter, read), _address(adapter, target), note))
        self.held.clear()   # every peer left every call before this one
        if not self.entry.direct:
            fallback()
            return
        move(PeerArrays(call, adapter, headers, self.reader, self.buffers))
        self.entry.leave(call)   # done reading (and writing) the others' arrays
        self.entry.await_readers(call, touching)

    def exchange(self, call: Call, adapter: ArrayAdapter, read: Any, words: np.ndarray,
                 move: Callable[[CallArrays, np.ndarray], None],
                 fallback: Callable[[np.ndarray], Any]) -> bool:
        """Run a call whose sizes only each peer knows of itself (an alltoall with send
        counts), in one entry: each peer writes ``words`` (int64, as many on every peer) into
        its slot as it enters, its ``read`` array after them where both fit the slot, and
        announces ``read``. Once every peer entered, ``move(peers, rows)`` runs with every
        peer's words (``rows[j]``): out of the slots where every peer's array is in its slot,
        else out of the peers' arrays (this peer then returns once the others left the
        call), or ``fallback(rows)`` (the ZeroMQ algorithm) where some peer cannot read the
        others. So the sizes travel with the entry, not in messages ahead of it. Returns
        whether the call went through the slots."""
        t = call.transport
        n, r = t.world_size, t.rank
        head = -(-words.nbytes // 64) * 64   # (the array after the words, a cache line on)
        if head > self.entry.data_bytes:
            raise ValueError(f"rank {r}: {call.describe()}: {words.nbytes} bytes of words do "
                             f"not fit a slot of {self.entry.data_bytes}")
        nbytes = 0 if read is None else adapter.size(read) * call.itemsize
        in_slot = head + nbytes <= self.entry.data_bytes

        def write() -> None:
            slot = self.entry.slot(r)
            slot[:words.nbytes] = words.view(np.uint8)
            if in_slot and nbytes:
                count = adapter.size(read)
                adapter.copy(adapter.from_frame(slot[head:head + nbytes], call.frame_dtype,
                                                count), read)
        with self.order.turn(call):
            try:
                headers = self.entry.enter(call, call.nbytes,
                                           (_address(adapter, read), 0, 0, int(in_slot)),
                                           write=write)
                self.held.clear()   # every peer left every call before this one
                # (A copy: the slots are only rewritten once every peer left this call.)
                rows = np.stack([self.entry.slot(j)[:words.nbytes].view(np.int64)
                                 for j in range(n)])
                if all(headers[j][WORDS + 3] == 1 for j in range(n)):
                    move(SlotArrays(call, adapter, self.entry, offset=head), rows)
                    return True
                if not self.entry.direct:
                    fallback(rows)
                    return False
                move(PeerArrays(call, adapter, headers, self.reader, self.buffers), rows)
                self.entry.leave(call)   # done reading the others' arrays
                self.entry.await_readers(call, [j for j in range(n) if j != r])
                return False
            finally:
                self.entry.leave(call)

    def fits(self, slot_bytes: int) -> bool:
        """Whether a call whose peers announce at most ``slot_bytes`` goes through the slots."""
        return slot_bytes <= self.entry.data_bytes

    def _through_slots(self, call: Call, adapter: ArrayAdapter, read: Any,
                       move: Callable[[CallArrays], None]) -> None:
        def write() -> None:
            if read is not None:
                count = adapter.size(read)
                slot = self.entry.slot(call.transport.rank)[:count * call.itemsize]
                adapter.copy(adapter.from_frame(slot, call.frame_dtype, count), read)
        self.entry.enter(call, call.nbytes, write=write, keep=False)
        move(SlotArrays(call, adapter, self.entry))


def _address(adapter: ArrayAdapter, flat: Any) -> int:
    return 0 if flat is None else address_of(adapter, flat)
