"""Flow control for messages a receiver holds for operations it has not started.

One ROUTER reads every link, so a receiver cannot stop reading just one sender and let
libzmq's high-water mark push back on it. It asks instead: once what it holds for unstarted
operations from one source passes HELD_PAUSE, it sends that source HOLD (pause); once that
falls below HELD_RESUME (an operation started and claimed its messages, or retired them) it
sends HOLD (resume). A paused sender keeps its messages to this peer in its link's queue
(link.py), so its sends wait, as for a full shared-memory ring (STARVED/CREDIT). What was in
flight when it paused (its libzmq queue, the kernel's) still lands: at most one send window
(window.py), within the hard bound HELD_PER_LINK that the inbox enforces; a sender that ignores
the pause meets that bound and is cut (arrivals.py).

An operation under way that waits on a paused source resumes it (its own messages may be
queued behind the held ones, on another channel); the hard bound still applies then.

HOLD travels ahead of queued data and of a full send window (Link.send_control). Pause and
resume are decided under the inbox lock but sent after it, possibly from two threads: each
carries a generation in ``seq``, and the sender keeps only the newest. What a paused source
still has in flight is bounded in bytes by its send window (window.py): this peer sends it no
ACK while it is paused, and a resume first acknowledges what was read meanwhile.
"""
from __future__ import annotations

import logging

from collectives.errors import PeerLost
from collectives.transport.channels import Channel
from collectives.transport.wire import HOLD, Header, encode_header

__all__ = ["Holds"]

log = logging.getLogger("collectives")


class Holds:
    """Both ends of the flow control of one peer: ``request(src, pause, generation)`` is the
    inbox's callback (receiver side), ``on_hold`` the HOLD handler (sender side)."""

    def __init__(self, rank: int, links: dict, connect, command, acks) -> None:
        self.rank = rank
        self._links = links        # rank -> Link, the transport's table
        self._connect = connect    # rank -> Link, opening it if needed
        self._command = command    # the I/O loop's command queue (to flush a resumed link)
        self._acks = acks          # window.Acks: a resume acknowledges what was read
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
