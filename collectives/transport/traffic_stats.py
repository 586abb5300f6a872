"""What Transport.stats() reports: the peer's traffic, drops, losses, refusals, flow control
and link emulation, gathered from the transport's parts (one place that reads them all)."""
from __future__ import annotations

from typing import Any

from collectives.transport.emulation import emulation_stats

__all__ = ["traffic_stats"]


def traffic_stats(t: Any) -> dict:
    """A snapshot of transport ``t``'s traffic: endpoints, counters per peer and in total,
    drops, lost ranks and refused CURVE clients."""
    stats = {
        "rank": t.rank,
        "endpoints": dict(t.endpoints),
        "peers": {r: vars(c).copy() for r, c in enumerate(t.counters)
                  if c.messages_sent or c.messages_received},
        "bytes_sent": sum(c.bytes_sent for c in t.counters),
        "bytes_received": sum(c.bytes_received for c in t.counters),
        "messages_sent": sum(c.messages_sent for c in t.counters),
        "messages_received": sum(c.messages_received for c in t.counters),
        "dropped": t._drops.count,
        "dropped_by_reason": dict(t._drops.by_reason),
        "lost": t.lost_ranks(),
        "authentication_denied": t._sockets.zap.denied if t._sockets.zap else 0,
        # Every refused handshake: ZAP's denials, those libzmq refuses before ZAP
        # (no CURVE, another server key), and peers refusing this one ("outbound").
        "handshakes_refused": dict(t._sockets.refusals.by_reason),
        # Flow control of messages for operations not started (holds.py).
        "holds_sent": dict(t._holds.sent),
        "holds_received": dict(t._holds.received),
        "held_peak": t.inbox.held_peak,
        # The send window (window.py): acknowledgements sent and received.
        "acks_sent": t._acks.sent,
        "acks_received": t._acks.received,
    }
    if t.config.link is not None:
        # Link emulation (emulation.py): what its pacing held back, all links together.
        stats["link_emulation"] = emulation_stats(
            t.config.link, [link.emulated for link in list(t._links.values())])
    return stats
