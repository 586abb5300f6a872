"""What the collector reads from a peer (gossip.Peer is one): its rank, its stats() snapshot
(the transport's counters, with the membership controller's) and its attached policies."""
from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

__all__ = ["MetricsSource"]


class MetricsSource(Protocol):
    """A peer, as the metrics see it. Every method is a snapshot that takes no collective."""

    @property
    def rank(self) -> int:
        """This peer's rank in the current view."""
        ...

    def stats(self) -> dict:
        """Peer.stats(): traffic per link and in total, drops, refusals, lost peers, the view
        (and, when the transport has them, ``ops`` and ``waited_seconds``)."""
        ...

    @property
    def policies(self) -> Sequence[object]:
        """The attached policies: each one's ``stats()`` (without ``consensus``) is read."""
        ...
