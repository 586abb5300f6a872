"""The shared-memory protocol between peers on one host, both ends of it: the payload path that
skips the kernel.

Over a socket every byte is copied twice by the kernel (into the socket buffer and out of it)
and crosses two libzmq threads. Between peers on one host the sender instead copies a chunk
once into a slot of a shared-memory ring it owns, and tells the receiver through the usual
ZeroMQ message (kind SHM, a header only), so ordering, operation matching, validation and
liveness are exactly those of the socket path. The receiver reduces or copies straight out of
the slot, then marks it free.

The ring's memory (an anonymous memfd the receiver maps through /proc, busy flags, slots) is
shm_ring.py's; this module is what the peers say about it.

Messages (all ZeroMQ, on the ordinary connection; see wire.py):

- SHM_OPEN: the first message on a link to a peer on this host announces the sender's ring
  (pid, fd, geometry); the receiver maps it (a ShmView) and answers SHM_MAPPED, after which the
  sender may exit without taking queued chunks with it (close() waits briefly for that).
- SHM: one chunk, left in a slot; the receiver hands the slot's bytes to the operation, and a
  _Releaser frees the slot once they are consumed.
- CREDIT: sends never block on a full ring: chunks that find no free slot wait, in order, in the
  link's queue (a _Chunk, staged when a slot frees up), and the sender raises its "waiting"
  flag; the receiver, when it frees a slot and sees the flag, sends a CREDIT that wakes the
  sender's I/O thread. (The I/O thread also re-checks every SLOT_RETRY while chunks wait, so a
  wake-up lost to store/load reordering between the two flags costs at most that.)
- STARVED: slots may be held by chunks of operations the receiver has not started; a blocked
  sender says so (at most every STARVED_REPEAT) and the receiver copies those chunks out to
  private memory, freeing their slots, or they could block the running operation for good.
"""
from __future__ import annotations

import logging
import threading
import time
from collections import deque
from typing import Any, Callable

from collectives import defaults
from collectives.transport.inbox import Inbox, Lost
from collectives.transport.shm_ring import (ShmRing, ShmView, parse_open, ring_name,
                                             shm_supported)
from collectives.transport.wire import (CREDIT, SHM, SHM_MAPPED, SHM_OPEN, STARVED, Channel,
                                        Header, encode_header)

__all__ = ["SharedMemory", "PREPARED_RINGS"]

log = logging.getLogger("collectives")

#: The most rings a transport makes ahead of its first messages (see SharedMemory.prepare).
PREPARED_RINGS = 8
#: How long a first message waits for its prepared ring's pages (4 MiB: milliseconds).
PREPARE_WAIT = 2.0


class _Chunk:
    """A chunk on its way into a ring, a staged message of the link's queue (see link.py): its
    SHM header (the slot filled in once it has one), the caller's buffer (read once a slot is
    free), its ticket."""

    __slots__ = ("ring", "header", "payload", "ticket", "counters", "nbytes")

    def __init__(self, ring: ShmRing, header: Header, payload: Any, ticket, counters) -> None:
        self.ring, self.header, self.payload, self.ticket = ring, header, payload, ticket
        self.counters = counters
        self.nbytes = header.length  # its payload's length: what link emulation paces it by

    def stage(self, retry: bool) -> tuple | None:
        """Copy into the lowest free slot and return the SHM header; None if none is free. A
        retry (the I/O thread, the chunk queued) raises the ring's waiting flag, so the
        receiver answers the next free slot with a CREDIT."""
        ring = self.ring
        with ring.lock:
            slot = ring.try_acquire()
            if slot is None and retry:
                ring.want_credit()
                slot = ring.try_acquire()  # a slot freed before the flag went up
            if slot is None:
                return None
        self.counters.bytes_sent += ring.write(slot, self.payload)
        if retry and self.ticket is not None:
            self.ticket.queued.set()  # the buffer was copied: reusable now
        return (encode_header(self.header._replace(slot=slot)),)


class _Releaser:
    """Frees one shared-memory slot, once (a retired message may be released twice), and
    wakes the sender with a CREDIT if it was waiting for a slot."""

    __slots__ = ("protocol", "src", "view", "slot")

    def __init__(self, protocol: "SharedMemory", src: int, view: ShmView, slot: int) -> None:
        self.protocol, self.src, self.slot = protocol, src, slot
        self.view: ShmView | None = view   # None once released

    def __call__(self) -> None:
        view, self.view = self.view, None
        if view is not None and view.release(self.slot):
            self.protocol.credit(self.src)


def _copy_out(item):
    """A shared-memory message moved to private memory, its slot freed."""
    header, payload, release = item
    if release is None:
        return item
    copy = memoryview(bytearray(payload))
    release()
    return header, copy, None


class SharedMemory:
    """One peer's side of the protocol with every peer on its host: the rings it sends
    through (by destination), the views of the rings it receives from (by source), the links
    blocked on a full ring, and the handlers of the five message kinds.

    Wiring: ``send_quietly(rank, header)`` sends a control message whose loss only costs time;
    ``loop`` is the I/O loop (flush/request_flush/in_loop); ``drops`` counts refused messages;
    ``links`` and ``addresses`` are the sockets' tables, read only.
    """

    def __init__(self, rank: int, config, *, inbox: Inbox, counters: list, drops, loop,
                 links: dict, addresses: dict,
                 send_quietly: Callable[[int, bytes], None]) -> None:
        self.rank = rank
        self._config = config
        self._inbox = inbox
        self._counters = counters
        self._drops = drops
        self._loop = loop
        self._links = links
        self._addresses = addresses
        self._send_quietly = send_quietly
        self.peers: set[int] = set()               # ranks whose payloads go through shm
        self._rings: dict[int, ShmRing] = {}       # our rings, by destination
        self._mapped: dict[int, threading.Event] = {}  # our rings the receiver has mapped
        self._views: dict[int, ShmView] = {}       # peers' rings, by source (I/O thread)
        self.blocked: set = set()                  # links waiting for a free slot (I/O thread)
        self._starved_at: dict[int, float] = {}    # when we last sent STARVED, by destination
        self._unanswered: deque = deque()          # rings mapped before we had the table
        self._prepared: dict[int, tuple[ShmRing, threading.Thread]] = {}  # see prepare()
        self._credit = encode_header(Header(CREDIT, rank, Channel.LINK, 0))
        self._closed = False

    # -- sender side ------------------------------------------------------------------------
    def prepare(self, ranks, world_size: int) -> None:
        """Make the rings to ``ranks`` (peers expected on this host, of ``world_size``) now,
        their first slot's pages committed in a thread: a view's transport is made when its
        proposal comes, and its first messages (a joiner's state, the first step's
        collective) leave once the commit does, into warm memory instead of faulting it in
        then (4 MiB: 2-6 ms on this project's 2-core machine, 0.1 ms warm)."""
        if self._config.transport not in ("auto", "shm") or not shm_supported():
            return
        # The nearest ranks around this one (ring neighbours first: rings and rank-ordered
        # graphs talk to them; a joiner's rank n-1 is rank 0's neighbour), at most
        # PREPARED_RINGS: each commits a slot of memory whether or not it is ever used.
        n, me = world_size, self.rank
        ranks = sorted((r for r in ranks if r != me and r not in self._rings),
                       key=lambda r: min((r - me) % n, (me - r) % n))
        for dst in ranks[:PREPARED_RINGS]:
            if dst in self._prepared:
                continue
            ring = ShmRing(self._config.shm_slots, self._config.shm_chunk_bytes,
                           ring_name(self.rank, dst))
            thread = threading.Thread(target=ring.first_slot().fill, args=(0,), daemon=True,
                                      name=f"gossip-shm-prepare-r{self.rank}")
            thread.start()
            self._prepared[dst] = (ring, thread)

    def _take_prepared(self, dst: int) -> ShmRing | None:
        """The prepared ring to ``dst``, once its pages are committed (its zeros must land
        before our first chunk does); None if there is none, or if committing them took
        longer than PREPARE_WAIT (a fresh ring is made instead)."""
        ring, thread = self._prepared.pop(dst, (None, None))
        if thread is None or ring is None:   # (prepared together)
            return None
        thread.join(PREPARE_WAIT)
        if thread.is_alive():
            log.warning("rank %d: committing the ring to rank %d took over %gs: a fresh "
                        "one is made", self.rank, dst, PREPARE_WAIT)
            ring.close()   # (its thread's view keeps the mapping until the thread ends)
            return None
        return ring

    def open_ring(self, link) -> None:
        """Give a new link to a peer on this host its ring; called before the link is
        published, so its SHM_OPEN is the link's first message and precedes every chunk."""
        ring = self._take_prepared(link.rank) or ShmRing(
            self._config.shm_slots, self._config.shm_chunk_bytes,
            ring_name(self.rank, link.rank))
        self._rings[link.rank] = ring
        self._mapped[link.rank] = threading.Event()
        link.send((encode_header(Header(SHM_OPEN, self.rank, Channel.LINK, 0,
                                        ring.announcement())),), None)

    def has_ring(self, dst: int) -> bool:
        return dst in self._rings

    def post(self, link, header: Header, payload: Any, ticket) -> tuple[bool, bool]:
        """A chunk (``header``: its SHM header, the slot to be filled in) into the ring to
        ``link``'s peer: copied now into a free slot, or queued until one frees up. Returns
        (queued, wake the I/O thread), as Link.post."""
        return link.post(_Chunk(self._rings[link.rank], header, payload, ticket,
                                self._counters[link.rank]))

    def on_blocked(self, link) -> None:
        """The I/O thread's flush found ``link``'s head chunk without a slot."""
        self.blocked.add(link)  # re-flushed every SLOT_RETRY, and on a CREDIT
        now = time.monotonic()
        if now - self._starved_at.get(link.rank, 0.0) > defaults.STARVED_REPEAT:
            if link.send_urgent((encode_header(Header(STARVED, self.rank, Channel.LINK, 0)),)):
                self._starved_at[link.rank] = now

    def wait_mapped(self, until: float) -> None:
        """Until ``until`` at most, wait for every live receiver to have mapped our ring: it
        maps it through /proc/<our pid>/fd, so what we left in it is gone if we exit first."""
        for rank, mapped in list(self._mapped.items()):
            while (not mapped.is_set() and self._inbox.lost(rank) is None
                   and time.monotonic() < until):
                mapped.wait(0.01)

    def credit(self, src: int) -> None:
        """Tell ``src`` we freed a slot it was waiting for (from a _Releaser)."""
        if not self._closed:
            self._send_quietly(src, self._credit)

    # -- receiver side: the handlers of the arrivals table ----------------------------------
    def on_shm(self, src: int, header: Header, payload) -> bool | str:
        view = self._views.get(src)
        if view is None or header.slot >= view.nslots or header.length > view.slot_bytes:
            self._drops.drop("malformed", f"rank {src} named shared-memory slot {header.slot} "
                                          f"of {header.length} bytes outside its ring")
            return False
        release = _Releaser(self, src, view, header.slot)
        # Counted as held like any message (its Python objects; the payload stays in the
        # sender's ring): a flood of headers naming one slot cannot grow this process either.
        put = self._inbox.put((src, header.channel, header.seq),
                              (header, view.chunk(header.slot, header.length), release),
                              defaults.HELD_OVERHEAD)
        if put is not True:
            release()
            return put  # the arrivals say why (stale, or over a bound)
        self._counters[src].bytes_received += header.length
        return True

    def on_open(self, src: int, header: Header, payload) -> bool:
        """Map ``src``'s ring; False if the announcement was malformed (and dropped)."""
        announcement = header.op
        parsed = parse_open(announcement)
        if parsed is None:
            self._drops.drop("malformed", f"rank {src} announced a shared-memory ring as "
                                          f"{announcement[:60]!r}")
            return False
        old = self._views.pop(src, None)
        if old is not None:
            old.close()
        try:
            self._views[src] = ShmView(*parsed, name=ring_name(src, self.rank))
        except ValueError as exc:  # not a gossip ring: a forged announcement
            self._drops.drop("foreign", f"rank {src}: {exc}")
            return False
        except OSError as exc:
            self._inbox.mark_lost(src, Lost(
                f"cannot map its shared-memory ring ({exc}); run with GOSSIP_TRANSPORT=ipc "
                "if peers on this host cannot read each other's /proc/<pid>/fd"))
            return True
        # From now on the ring outlives its sender: tell it that it may exit. A peer that got
        # the address table before us may be heard from before we can answer it.
        if src in self._addresses:
            self._send_quietly(src, encode_header(Header(SHM_MAPPED, self.rank, Channel.LINK, 0)))
        else:
            self._unanswered.append(src)
        return True

    def answer_unanswered(self) -> None:
        """The address table arrived: answer the rings mapped before it."""
        while self._unanswered:
            self._send_quietly(self._unanswered.popleft(),
                               encode_header(Header(SHM_MAPPED, self.rank, Channel.LINK, 0)))

    def on_mapped(self, src: int, header: Header, payload) -> bool:
        mapped = self._mapped.get(src)
        if mapped is not None:
            mapped.set()
        return True

    def on_starved(self, src: int, header: Header, payload) -> bool:
        # Copies count as held (payload bytes): past the bounds they stay in the ring, and the
        # sender waits for the operations to start (or is paused, past the pause threshold).
        self._inbox.replace_unclaimed(src, _copy_out)
        return True

    def on_credit(self, src: int, header: Header, payload) -> bool:
        link = self._links.get(src)
        if link is not None:
            # Flushing belongs to the I/O thread (it owns the blocked set and the poller).
            if self._loop.in_loop():
                if link in self.blocked:
                    self._loop.flush(link)
            else:
                self._loop.request_flush(link)
        return True

    def handlers(self) -> dict:
        """Kind -> handler, for the arrivals table."""
        return {SHM: self.on_shm, SHM_OPEN: self.on_open, SHM_MAPPED: self.on_mapped,
                STARVED: self.on_starved, CREDIT: self.on_credit}

    # -- shutdown ---------------------------------------------------------------------------
    def closing(self) -> None:
        self._closed = True  # no more CREDITs

    def close_views(self) -> None:
        """Unmap the peers' rings (with the ROUTER's reader excluded: a message being handled
        may be reading a view)."""
        for view in self._views.values():
            view.close()
        self._views.clear()

    def close_rings(self) -> None:
        """Close our rings (after the links: no caller stages into them any more)."""
        for ring in self._rings.values():
            ring.close()
        self.drop_prepared(set())

    def drop_prepared(self, keep: set) -> None:
        """Close the prepared rings to ranks outside ``keep`` (not on this host after all, or
        the transport closing) at once: nobody reads them, and a thread still committing one
        holds a view that keeps its mapping until the thread ends."""
        for dst in [d for d in self._prepared if d not in keep]:
            ring, _ = self._prepared.pop(dst)
            ring.close()
