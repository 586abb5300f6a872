"""Flow control between a sender and one receiver, both ends of it: the pause a receiver asks
for when it holds too much for operations it has not started (HOLD, ``Holds``), and the send
window that bounds in bytes what each link has in flight (ACK: ``SendWindow`` is one link's
account, ``Acks`` one peer's side of the protocol).

Pause and resume. One ROUTER reads every link, so a receiver cannot stop reading just one
sender and let libzmq's high-water mark push back on it. It asks instead: once what it holds
for unstarted operations from one source passes HELD_PAUSE, it sends that source HOLD
(pause); once that falls below HELD_RESUME (an operation started and claimed its messages, or
retired them) it sends HOLD (resume). A paused sender keeps its messages to this peer in its
link's queue (link.py), so its sends wait, as for a full shared-memory ring
(STARVED/CREDIT). What was in flight when it paused (its libzmq queue, the kernel's) still
lands: at most one send window, within the hard bound HELD_PER_LINK that the inbox enforces;
a sender that ignores the pause meets that bound and is cut (dispatch.py).

An operation under way that waits on a paused source resumes it (its own messages may be
queued behind the held ones, on another channel); the hard bound still applies then.

HOLD travels ahead of queued data and of a full send window (Link.send_control). Pause and
resume are decided under the inbox lock but sent after it, possibly from two threads: each
carries a generation in ``seq``, and the sender keeps only the newest.

The send window: how many bytes a sender may have on their way to one peer, counted in bytes,
not messages, and the acknowledgements (ACK) that free them. libzmq bounds only the sender's
pipe, in messages (send_hwm), not the receiver's (sockets.py says why), and the kernel adds
its buffers, so without a window what a sender has in flight once its receiver asks it to
pause would depend on message sizes and on how fast the receiver reads: the sender's pipe
alone holds 64 whole 4 MiB messages, 256 MiB, all the receiver may hold from one source
(HELD_PER_LINK) before what the receiver's side already holds, and an honest sender would be
cut as a hostile one. So every link counts what it sent (payload bytes plus HELD_OVERHEAD per
message, the units the receiver's held bound counts in) and keeps its later messages in its
own queue (link.py) while that, less what the receiver acknowledged, would pass
SEND_WINDOW; the receiver's ROUTER reader counts what it read from each source and
acknowledges every ACK_EVERY bytes. A message may always go while less than ACK_EVERY is
unacknowledged: the receiver owes no ACK then, and a message larger than the window still
travels.

An ACK names the *message number* of the last message read from that source (wire.py: numbers
are stamped by the link as its socket takes them, 1, 2, 3, ...), not a byte count: the sender
maps numbers to its own running total, so a message lost with a dropped connection is
forgiven by the next one read, and nothing needs resetting per connection. The sender checks
an ACK before it trusts it: one naming a message not sent yet, or one going backwards, is
dropped and counted as a strike (dispatch.py); one from a peer this peer has no link to opens
nothing and is ignored (as HOLD is).

While a receiver has a source paused it sends it no ACK, so once it pauses, what can still
land is at most one window: the bound of defaults.py's table (HELD_PAUSE + one message +
SEND_WINDOW under HELD_PER_LINK). The resume first acknowledges what was read meanwhile. ACKs
travel ahead of queued data and of a pause (Link.send_control), so two peers both sending
heavily never wait on each other's data for the acknowledgement that would unblock it.

Shared-memory chunks count only their header-only SHM message (HELD_OVERHEAD): their payload is
bounded by the ring's slots, not by this window.

Without a cluster key a paused source is also judged by its window (``Acks.past_window``):
what was read from it since the last ACK sent to it, counting only the messages its window
constrains (not WINDOW_FREE: ACK, HOLD, BYE, STARVED go whatever the window), is at most what
it may have unacknowledged, since its window counts from the last ACK it received, which is
no later. A source past that ignores HOLD: its message is refused as a strike (dispatch.py),
and it is cut long before the hard bound.

The figures are one value, ``HeldBounds``: with a cluster key the defaults' HELD_* and
SEND_WINDOW (``KEYED_BOUNDS``); without one, where anyone who reaches the port can send as a free
rank, smaller ones (``OPEN_BOUNDS``: 64 MiB held in total, all links together), where a source
is also paused while the total is past the pause threshold, so that honest sources together
stay inside the total (the derivation is in defaults.py).
"""
from __future__ import annotations

import logging
import threading
from collections import deque
from dataclasses import dataclass

from collectives import defaults
from collectives.errors import PeerLost
from collectives.transport.wire import ACK, BYE, HOLD, STARVED, Channel, Header, encode_header

__all__ = ["Holds", "SendWindow", "Acks", "message_cost", "HeldBounds", "KEYED_BOUNDS",
           "OPEN_BOUNDS", "held_bounds", "WINDOW_FREE"]

# The kinds a sender sends whatever its window (Link.send_control, send_urgent): they unblock
# the other side or end the link. Counted in the window like any message, they are the only
# ones that may take it past its limit, so a paused source is judged without them.
WINDOW_FREE = frozenset({ACK, HOLD, BYE, STARVED})

log = logging.getLogger("collectives")

_OVERHEAD = defaults.HELD_OVERHEAD


@dataclass(frozen=True)
class HeldBounds:
    """What a receiver holds for operations it has not started, and the flow control that
    keeps honest senders inside it (bytes: payloads plus HELD_OVERHEAD per message)."""
    per_link: int      # hard bound from one source: past it a message is a strike
    total: int         # hard bound, all sources together: past it a message is dropped
    pause: int         # a source holding more is asked to wait (HOLD) ...
    resume: int        # ... and to go on once it holds less
    # Every source that delivers while the total is past this is asked to wait too, and goes
    # on once the total is below ``total_resume`` (and its own below ``resume``); None: the
    # total alone pauses nobody.
    total_pause: int | None
    total_resume: int | None
    window: int        # bytes a link may have sent and not had acknowledged
    ack_every: int     # the receiver acknowledges this often
    # A paused source that sends past its window is not a gossip peer: strike it (without a
    # key; with one, every sender is a key holder).
    judge_window: bool = False

    def window_allowance(self, largest: int) -> int | None:
        """What an honest source can have sent since the last acknowledgement it was sent,
        its messages being at most ``largest`` bytes (payload and overhead): the window, or
        a message begun below ``ack_every`` (SendWindow.room); None if not judged."""
        if not self.judge_window:
            return None
        return max(self.window, self.ack_every + largest)

    def describe(self) -> str:
        """The bounds in a log line's words."""
        return (f"{self.per_link >> 20} MiB per link, {self.total >> 20} MiB in total")


# With a cluster key: only key holders send, and the bounds are for honest peers.
KEYED_BOUNDS = HeldBounds(
    per_link=defaults.HELD_PER_LINK, total=defaults.HELD_TOTAL, pause=defaults.HELD_PAUSE,
    resume=defaults.HELD_RESUME, total_pause=None, total_resume=None,
    window=defaults.SEND_WINDOW, ack_every=defaults.ACK_EVERY)
# Without one: anyone who reaches the port may send as a free rank (defaults.py's derivation).
OPEN_BOUNDS = HeldBounds(
    per_link=defaults.OPEN_HELD_PER_LINK, total=defaults.OPEN_HELD_TOTAL,
    pause=defaults.OPEN_HELD_PAUSE, resume=defaults.OPEN_HELD_PAUSE // 2,
    total_pause=defaults.OPEN_HELD_PAUSE, total_resume=defaults.OPEN_HELD_PAUSE // 2,
    window=defaults.OPEN_SEND_WINDOW, ack_every=defaults.OPEN_SEND_WINDOW // 4,
    judge_window=True)


def held_bounds(key) -> HeldBounds:
    """The bounds of a group with cluster key ``key`` (None: without one)."""
    return KEYED_BOUNDS if key is not None else OPEN_BOUNDS


def message_cost(frames: tuple) -> int:
    """What one message costs the window: its payload bytes plus HELD_OVERHEAD (the receiver
    counts the same for what it reads)."""
    if len(frames) < 2:
        return _OVERHEAD
    payload = frames[1]
    return _OVERHEAD + (payload.nbytes if type(payload) is memoryview else len(payload))


class SendWindow:
    """The sender's account of one link (used under the link's lock): its running total of what
    the socket took, and the total at each message number not acknowledged yet."""

    __slots__ = ("limit", "every", "sent", "acked", "acked_number", "_marks", "_first")

    def __init__(self, limit: int = defaults.SEND_WINDOW,
                 every: int = defaults.ACK_EVERY) -> None:
        self.limit = limit
        self.every = every
        self.sent = 0            # cost of every message the socket took
        self.acked = 0           # ... up to and including message ``acked_number``
        self.acked_number = 0
        self._marks: deque = deque()  # ``sent`` after each message from number ``_first`` on
        self._first = 1

    @property
    def in_flight(self) -> int:
        """Bytes sent and not acknowledged."""
        return self.sent - self.acked

    def room(self, cost: int) -> bool:
        """May a message of ``cost`` go now? While less than ``every`` is unacknowledged the
        receiver may owe no ACK (it could have read everything), so it always may then."""
        in_flight = self.sent - self.acked
        return in_flight < self.every or in_flight + cost <= self.limit

    def on_sent(self, cost: int) -> None:
        """The socket took the next message (numbers are consecutive on a link)."""
        self.sent += cost
        self._marks.append(self.sent)

    def on_ack(self, number: int) -> None:
        """The receiver read every message up to ``number`` (checked by the caller)."""
        marks, acked = self._marks, self.acked
        while self._first <= number:
            acked = marks.popleft()
            self._first += 1
        self.acked = acked
        self.acked_number = number


class Acks:
    """Both ends of the protocol for one peer: ``read`` counts what the ROUTER's reader took
    from a source and acknowledges it (receiver side); ``check``/``on_ack`` judge and apply
    an ACK from a peer this peer sends to (sender side)."""

    def __init__(self, rank: int, world_size: int, links: dict, connect, command,
                 holding, *, every: int = defaults.ACK_EVERY,
                 allowance: int | None = None) -> None:
        self.rank = rank
        # HeldBounds.window_allowance: a source asked to wait that was read for more than this
        # since its last ACK ignored its window (read() says so); None: not judged.
        self._allowance = allowance if allowance is not None else float("inf")
        self._links = links        # rank -> Link, the transport's table
        self._connect = connect    # rank -> Link, opening it if needed
        self._command = command    # the I/O loop's command queue (to flush a freed link)
        self._holding = holding    # src -> True while this peer has asked it to pause
        self._every = every        # HeldBounds.ack_every: acknowledge this often
        # Receiver side. ``_read`` (bytes read from each source, payloads plus overhead) and
        # ``_last`` (the number of its last message) are written only by the ROUTER's reader
        # (one thread at a time), in that order; ``_sent`` (the number last acknowledged to
        # each source) and ``_acked_at`` (``_read`` then) under ``_lock``, which also keeps
        # ACKs to one source in order when a resume sends one from another thread: an ACK that
        # went backwards would be a strike. ``_send`` reads ``_last`` first, then ``_read``:
        # what it records as acknowledged covers at least the messages its number names, so
        # a source is never judged for more than it has in flight.
        self._read = [0] * world_size
        self._acked_at = [0] * world_size
        # The same for the messages the sender's window constrains (not WINDOW_FREE): what a
        # paused source is judged by (past_window).
        self._windowed = [0] * world_size
        self._windowed_at = [0] * world_size
        self._last = [0] * world_size
        self._sent = [0] * world_size
        self._lock = threading.Lock()
        self.sent = 0       # ACKs sent and received, for stats
        self.received = 0

    # -- receiver side ----------------------------------------------------------------------
    def read(self, src: int, nbytes: int, number: int, kind: int) -> None:
        """The ROUTER's reader took message ``number`` of ``kind`` with ``nbytes`` of payload
        from ``src``."""
        cost = nbytes + _OVERHEAD
        read = self._read[src] + cost
        self._read[src] = read
        if kind not in WINDOW_FREE:
            self._windowed[src] += cost
        self._last[src] = number
        if read - self._acked_at[src] >= self._every and not self._holding(src):
            self._send(src)

    def past_window(self, src: int, nbytes: int) -> bool:
        """Would a message of ``nbytes`` from ``src``, which this peer asked to wait, take what
        was read from it since its last ACK past its window? An honest sender cannot get there
        (its window counts from the last ACK it received, which is no later than the last
        one sent, and what goes whatever the window, WINDOW_FREE, is not counted): the caller
        refuses the message and counts a strike. (The caller asks only for a message the
        window constrains, while ``src`` is paused, and only where the bounds judge windows.)"""
        return (self._windowed[src] + nbytes + _OVERHEAD - self._windowed_at[src]
                > self._allowance)

    def resume(self, src: int) -> None:
        """``src`` may go on (Holds): acknowledge what was read while it was paused."""
        self._send(src)

    def _send(self, src: int) -> None:
        with self._lock:
            number = self._last[src]
            read = self._read[src]  # after the number: it covers that message's bytes
            windowed = self._windowed[src]
            if number <= self._sent[src]:
                return
            try:
                link = self._connect(src)
            except (PeerLost, ValueError) as exc:  # closing, or no address yet
                log.debug("rank %d: ACK to rank %d not sent: %s", self.rank, src, exc)
                return
            self._sent[src] = number
            self._acked_at[src] = read
            self._windowed_at[src] = windowed
            ack = encode_header(Header(ACK, self.rank, Channel.LINK, number))
            if link.send_control("ack", (ack,)):
                self._command(("flush", link))
            self.sent += 1

    # -- sender side ------------------------------------------------------------------------
    def on_ack(self, src: int, number: int) -> str | None:
        """Apply ``src``'s ACK of message ``number``; None if it was sound, else why it is not
        (the caller drops it and counts a strike)."""
        link = self._links.get(src)
        if link is None:
            # No window to open: ignored, as HOLD for a link that does not exist. Not a strike:
            # without a cluster key a squatter under this rank's identity at ``src`` makes
            # ``src`` acknowledge what the squatter sent, and ``src`` is honest.
            return None
        verdict = link.ack(number)
        if type(verdict) is str:
            return f"rank {src} acknowledged message {number}: {verdict}"
        self.received += 1
        if verdict:
            self._command(("flush", link))  # room again for what waits in its queue
        return None


class Holds:
    """Both ends of the flow control of one peer: ``request(src, pause, generation)`` is the
    inbox's callback (receiver side), ``on_hold`` the HOLD handler (sender side)."""

    def __init__(self, rank: int, links: dict, connect, command, acks) -> None:
        self.rank = rank
        self._links = links        # rank -> Link, the transport's table
        self._connect = connect    # rank -> Link, opening it if needed
        self._command = command    # the I/O loop's command queue (to flush a resumed link)
        self._acks = acks          # Acks: a resume acknowledges what was read
        self.sent = {"pause": 0, "resume": 0}
        self.received = {"pause": 0, "resume": 0}

    def request(self, src: int, pause: bool, generation: int) -> None:
        """Ask ``src`` to pause or resume its sends to this peer (any thread, no lock held)."""
        header = encode_header(Header(HOLD, self.rank, Channel.LINK, generation,
                                      "pause" if pause else "resume"))
        try:
            link = self._connect(src)
        except (PeerLost, ValueError) as exc:  # closing, or no address: the bound still holds
            log.debug("rank %d: HOLD to rank %d not sent: %s", self.rank, src, exc)
            return
        if not pause:
            self._acks.resume(src)  # first, so the resumed sender finds room in its window
        if link.send_control("hold", (header,)):
            self._command(("flush", link))  # its socket is full: out as soon as it has room
        self.sent["pause" if pause else "resume"] += 1

    def on_hold(self, src: int, header: Header, payload) -> bool:
        """HOLD from ``src``: pause or resume what this peer sends it."""
        pause = header.op == "pause"
        link = self._links.get(src)
        if link is None or not pause and header.op != "resume":
            return True  # nothing to hold (or an unknown request): received, ignored
        self.received["pause" if pause else "resume"] += 1
        if link.hold(pause, header.seq) is False:
            self._command(("flush", link))  # resumed with messages queued
        return True

    def handlers(self) -> dict:
        """Kind -> handler, for the arrivals table."""
        return {HOLD: self.on_hold}
