"""What one peer does with a message read from its ROUTER: validate it, then dispatch it by kind.

Validation comes first and is the same for every kind: the sender's identity names a rank of
the group (not this peer's own), the frames are a header and at most one payload, the header
decodes and passes wire.decode_header's checks against the payload, agrees with the identity,
and carries a message number above the last one heard from that source (replays and duplicates
are refused before anything reaches the inbox, so a chunk is never reduced twice). A message
that fails is dropped and counted (throttled_log.DropLog); one that passes goes to the handler
of its kind, from a table. A connection that keeps failing is cut (offenders.py): a rank's
identity after MAX_STRIKES malformed or over-bound messages, whatever connections they came on
(it stays cut: all it sends is dropped unread, and each new connection of it is cut again); a
connection under no rank of this group (a foreign or unparsable identity, one of another job)
after MAX_STRIKES of its own. The shared-memory kinds are handled by shm.SharedMemory, HOLD by
flow_control.Holds; the operation kinds (DATA, ABORT) and BYE here, and the two questions this
peer's I/O thread answers itself from its activity record (activity.py), so a peer busy in
Python or idle between calls still answers: PLAN (a neighbour exchange names this peer; if
this peer's call does not name the sender, the answer says so at once) and STATUS (which
operation this peer is inside). Every message that passes is counted for the send window's
acknowledgements, and an ACK that does not fit what this peer sent is a strike
(flow_control.py).
"""
from __future__ import annotations

import logging
from typing import Callable

from collectives import defaults
from collectives.config import TransportConfig
from collectives.transport.activity import Activity
from collectives.transport.flow_control import WINDOW_FREE
from collectives.transport.inbox import OVER_LINK, RETIRED, Inbox, Lost, MailboxError
from collectives.transport.offenders import Offenders
from collectives.transport.sockets import identity_of, job_of_identity, rank_of_identity
from collectives.transport.throttled_log import DropLog
from collectives.transport.wire import (ABORT, ACK, BYE, DATA, PLAN, PLAN_ANSWER, SHM, STATUS,
                                        Header, WireError, decode_header, encode_header)

__all__ = ["Arrivals", "status_channel"]

log = logging.getLogger("collectives")

# (src, header, payload) -> counted as received, or why the inbox kept nothing
Handler = Callable[[int, Header, object], "bool | str"]
_CHUNKS = (DATA, SHM, PLAN)  # the kinds that belong to an operation's call
# A STATUS answer waits for its asker in this mailbox: (src, status_channel(channel), seq).
# Negative, so no message's own channel (validated >= 0) can ever reach it.


def status_channel(channel: int) -> int:
    """The mailbox channel where the answer to a STATUS question about ``channel`` waits."""
    return -1 - channel


class Arrivals:
    """The validation and the dispatch table of one peer (run by whichever thread reads the
    ROUTER), of the group ``config`` names (its job, view and message bound).

    Wiring: ``inbox`` takes what passes; ``counters`` count it per peer and ``drops`` what
    does not; ``offenders`` cuts the connections that keep failing; ``handlers`` adds kinds
    handled elsewhere (shm.SharedMemory.handlers(), flow control's: a handler returns True if
    the message counts as received, False if not, or why the inbox kept nothing, one of
    inbox.RETIRED/OVER_LINK/OVER_TOTAL); ``activity`` answers PLAN and STATUS;
    ``answer(rank, header)`` sends a header-only message quietly; ``acks``
    (flow_control.Acks) acknowledges what is read."""

    def __init__(self, rank: int, world_size: int, config: TransportConfig, *, inbox: Inbox,
                 counters: list, drops: DropLog, offenders: Offenders,
                 handlers: dict[int, Handler], activity: Activity,
                 answer: Callable[[int, bytes], None], acks) -> None:
        self.rank = rank
        self._world_size = world_size
        self._job_id = job_id = config.job_id
        self._view = view = config.view
        self._max_bytes = config.max_message_bytes
        self._inbox = inbox
        self._counters = counters
        self._drops = drops
        self._offenders = offenders
        self._frames: list = []  # the message being handled (a strike cuts its connection)
        # Sources asked to wait (the inbox's live set), and whether a paused one is judged by
        # its send window (without a cluster key: flow_control.HeldBounds.judge_window).
        self._paused = inbox.paused
        self._judge_window = inbox.bounds.judge_window
        self._identity_ranks = {identity_of(job_id, r, view): r for r in range(world_size)}
        self._heard = [0] * world_size  # last message number accepted from each source
        # Malformed, foreign or over-bound messages per rank; at MAX_STRIKES it is cut:
        # ``_cut[src]`` is then the reason it was cut, and everything further from it is
        # dropped unread under that reason (a list lookup per message, nothing more).
        self._strikes = [0] * world_size
        self._cut: list[str | None] = [None] * world_size
        self.cut_dropped = [0] * world_size  # messages dropped unread after the cut
        self._activity = activity
        self._answer = answer  # send one header-only message to a rank, quietly
        self._acks = acks  # flow_control.Acks: what is read is acknowledged, ACKs are judged
        self._handlers: dict[int, Handler] = {DATA: self._data, ABORT: self._abort,
                                              BYE: self._bye, PLAN: self._plan,
                                              STATUS: self._status, ACK: self._ack, **handlers}

    def handle(self, frames: list) -> None:
        """Validate one message read from the ROUTER (``frames``: identity, header, payload if any)
        and dispatch it by kind; a message that fails is dropped and counted, never raised."""
        identity = frames[0].bytes
        src = self._identity_ranks.get(identity)  # the usual spelling, without parsing
        if src is None:
            src = rank_of_identity(identity, self._world_size, self._job_id, self._view)
        if src is None:
            self._foreign(frames, identity)
            return
        self._frames = frames
        cut = self._cut[src]
        if cut is not None:
            self.cut_dropped[src] += 1
            self._drops.drop(cut, f"rank {src}'s connection was cut; dropped unread")
            # A new connection of a cut rank (it reconnected) is cut again.
            self._offenders.strike(frames[1], identity, cut, f"rank {src} was cut")
            return
        if len(frames) not in (2, 3):
            self._strike(src, "malformed", f"{len(frames) - 1} frames from rank {src}")
            return
        payload = frames[2] if len(frames) == 3 else None
        try:
            header = decode_header(frames[1].buffer, world_size=self._world_size,
                                   max_bytes=self._max_bytes,
                                   payload_len=len(payload) if payload is not None else 0)
        except WireError as exc:
            self._strike(src, "malformed", f"from rank {src}: {exc}")
            return
        if header.src != src:
            self._strike(src, "foreign", f"header claims rank {header.src} on rank {src}'s "
                                         "connection")
            return
        if src == self.rank:
            # A peer never sends to itself: whoever uses our own identity is an intruder, and
            # what it sends would sit in mailboxes nobody reads.
            self._strike(src, "foreign", f"a connection uses this peer's own identity (rank "
                                         f"{src})")
            return
        # Replays and duplicates: one pipe per source never reorders or repeats, so numbers
        # only grow.
        if header.number <= self._heard[src]:
            self._drops.drop("replay", f"message number {header.number} from rank {src} after "
                                       f"{self._heard[src]} (a replay, a duplicate, or "
                                       "unnumbered)")
            return
        self._heard[src] = header.number
        kind = header.kind
        if src in self._paused and self._judge_window and kind not in WINDOW_FREE \
                and self._acks.past_window(src, len(payload) if payload is not None else 0):
            # Asked to wait, it sent past its window: no honest sender can (flow_control.py).
            self._strike(src, OVER_LINK, f"rank {src} sent past its send window while asked "
                                         "to wait (it ignores HOLD)")
            return
        # Every message is either dropped (and counted as such) or received, never both:
        # dropped + received accounts for every message that arrived.
        counted: bool | str
        if kind == DATA and not header.slot:  # the usual message, without the table
            counted = self._deliver(src, header, payload)
        else:
            handler = self._handlers.get(kind)
            counted = handler is None or handler(src, header, payload)
        if counted is True:
            self._counters[src].messages_received += 1
            if kind in _CHUNKS:
                self._check_call(src, header)
        elif counted:  # a handler's message the inbox refused (see the class docstring)
            self._refused(src, header, counted)
        # Read, so acknowledged (after the handler: a pause it decided holds this ACK back).
        self._acks.read(src, len(payload) if payload is not None else 0, header.number, kind)

    def _foreign(self, frames: list, identity: bytes) -> None:
        """A message under no rank of this group: dropped; its connection is cut after
        MAX_STRIKES, but for a peer of this job in another view (its messages are late, not
        hostile: a view change leaves old connections behind for a moment)."""
        group = job_of_identity(identity)
        job, _, view = (group or "").partition("#")
        if group is not None and job != self._job_id:
            # Two jobs met at one address (a reused port, a stale table): say which two.
            detail = (f"a peer of job {job or '(unnamed)'!r} ({identity[:80]!r}) reached this "
                      f"peer of job {self._job_id or '(unnamed)'!r}; its messages are dropped")
        elif group is not None and view != (str(self._view) if self._view else ""):
            self._drops.drop("stale", f"a message of view {view or 0} ({identity[:80]!r}) "
                             f"reached this peer's transport of view {self._view}")
            return
        else:
            detail = f"unknown sender identity {identity[:40]!r}"
        self._drops.drop("foreign", detail)
        self._offenders.strike(frames[1], identity, "foreign", detail)

    def _strike(self, src: int, reason: str, detail: str) -> None:
        """Drop a bad message from ``src``; at MAX_STRIKES, cut it: its identity for good, and
        the connection the message came on."""
        self._drops.drop(reason, detail)
        self._strikes[src] += 1
        if self._strikes[src] == defaults.MAX_STRIKES:
            self._cut[src] = reason
            freed = self._inbox.drop_unclaimed(src)
            log.error("rank %d: cut rank %d's connection after %d bad messages (last: %s): "
                      "everything further from it is dropped unread, and its connection shut "
                      "down (again whenever it reconnects); %d bytes it left for operations "
                      "not started were freed", self.rank, src, self._strikes[src], detail,
                      freed)
            frames = self._frames
            self._offenders.cut(frames[1], frames[0].bytes, reason, detail)

    def _refused(self, src: int, header: Header, why: str) -> None:
        """The inbox kept nothing of ``src``'s message (inbox.put's answer ``why``)."""
        if why == RETIRED:
            self._drops.stale(src, header)
        elif why == OVER_LINK:
            self._strike(src, why, f"rank {src} sent more for operations not started than "
                         f"this peer holds from one source (channel {header.channel}, seq "
                         f"{header.seq}; bounds {self._inbox.bounds.describe()})")
        else:  # over the total: not this source's fault alone, so no strike
            self._drops.drop(why, f"rank {src}'s message for an operation not started "
                             f"(channel {header.channel}, seq {header.seq}) would take what "
                             f"this peer holds past its bound "
                             f"({self._inbox.bounds.describe()})")

    def _data(self, src: int, header: Header, payload) -> bool:
        if header.slot:  # the first chunk of a neighbour exchange, with its plan
            return self._plan(src, header, payload)
        return self._deliver(src, header, payload)

    def _deliver(self, src: int, header: Header, payload) -> bool:
        size = len(payload) if payload is not None else 0
        put = self._inbox.put((src, header.channel, header.seq), (header, payload, None),
                              size + defaults.HELD_OVERHEAD)
        if put is not True:
            self._refused(src, header, put)
            return False
        self._counters[src].bytes_received += size
        return True

    def _abort(self, src: int, header: Header, payload) -> bool | str:
        reason, named = header.op, None
        if reason.startswith("view:"):
            posted = self._inbox.post_error((src, header.channel, header.seq), MailboxError(
                f"rank {src} left the operation for a change of the group's view: "
                f"{reason[5:]}", view_change=True))
            return True if posted is True or posted == RETIRED else posted
        if reason.startswith(("lost:", "late:")):
            rank_text, _, rest = reason[5:].partition("|")
            if rank_text.isdigit() and int(rank_text) < self._world_size:
                named, reason = int(rank_text), rest
        lost = named if header.op.startswith("lost:") else None
        late = named if header.op.startswith("late:") else None
        posted = self._inbox.post_error((src, header.channel, header.seq),
                                        MailboxError(f"rank {src} abandoned the operation: "
                                                     f"{reason}", lost, late))
        return True if posted is True or posted == RETIRED else posted

    def _ack(self, src: int, header: Header, payload) -> bool:
        wrong = self._acks.on_ack(src, header.seq)
        if wrong is None:
            return True
        self._strike(src, "malformed", wrong)  # never trusted: it could open our window
        return False

    def _bye(self, src: int, header: Header, payload) -> bool:
        cause = None
        if header.op.startswith("lost:"):   # it closed right after losing that rank
            rank_text, _, why = header.op[5:].partition("|")
            if rank_text.isdigit() and int(rank_text) < self._world_size \
                    and int(rank_text) not in (src, self.rank):
                cause = int(rank_text)
        reason = "it closed its peer (left the group)" if cause is None else \
            f"it closed its peer after its last operation failed for the loss of rank " \
            f"{cause}: {why}"
        self._inbox.mark_lost(src, Lost(reason, kind="closed", cause=cause))
        return True

    def _check_call(self, src: int, header: Header) -> None:
        # A chunk of another call for an operation under way here: the operation may never
        # read this mailbox (it waits on another peer), so wake it where it waits, at once.
        waiting_on = self._activity.arrived(src, header.channel, header.seq, header.op)
        if waiting_on is not None and waiting_on >= 0:
            message = self._activity.mismatch_of(header.channel, header.seq)
            if message is not None:
                self._inbox.post_error((waiting_on, header.channel, header.seq),
                                       MailboxError(message, local=True))

    def _plan(self, src: int, header: Header, payload) -> bool:
        channel, seq = header.channel, header.seq
        if header.slot == PLAN_ANSWER or self._activity.plan_arrived(src, channel, seq):
            return self._deliver(src, header, payload)  # ahead of the data that follows it
        # This peer's call at that sequence does not involve src: say so now (src waits for
        # it), and refuse what src sends there after the plan.
        self._inbox.retire((src, channel, seq))
        self._answer(src, encode_header(Header(PLAN, self.rank, channel, seq, header.op,
                                               header.dtype, header.shape, header.nbytes,
                                               slot=PLAN_ANSWER)))
        if header.kind == DATA:
            self._drops.stale(src, header)  # counted: a data chunk this call does not take
            return False
        return True

    def _status(self, src: int, header: Header, payload) -> bool | str:
        channel, seq = header.channel, header.seq
        if header.slot:  # an answer to this peer's question
            put = self._inbox.put((src, status_channel(channel), seq), (header, None, None),
                                  defaults.HELD_OVERHEAD)
            return True if put is True or put == RETIRED else put
        state, current, signature, waiting_on = self._activity.status(channel, seq)
        self._answer(src, encode_header(Header(STATUS, self.rank, channel, seq, signature[:200],
                                               offset=current + 1, length=waiting_on + 1,
                                               slot=state)))
        return True
