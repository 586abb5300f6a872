"""The error tree of the runtime. One base, GossipError; every message names the rank, the
address and the operation it concerns, so a log line from one of 64 peers is enough to act on.

collectives/ is the lowest layer that raises runtime errors, so the tree is rooted here and
re-exported by gossip (gossip.GossipError is this class).
"""
from __future__ import annotations

from typing import Sequence

__all__ = [
    "GossipError",
    "PeerLost",
    "ExchangeIncomplete",
    "ViewChanging",
    "LeftOut",
    "OperationTimeout",
    "RendezvousError",
    "ProtocolError",
    "AuthenticationError",
    "UnsupportedDtype",
]


class GossipError(Exception):
    """Base of every error the runtime raises."""


class _AboutAPeer(GossipError):
    """An error about one other peer: ``rank``, ``address`` (its endpoint, if known) and the
    ``operation`` that was waiting on it."""

    def __init__(self, message: str, *, rank: int | None = None, address: str | None = None,
                 operation: str | None = None) -> None:
        super().__init__(message)
        self.rank = rank
        self.address = address
        self.operation = operation


class PeerLost(_AboutAPeer):
    """A peer died, closed, or went silent (no heartbeat) past the timeout."""


class ViewChanging(PeerLost):
    """The operation was ended because the group's view is changing (a join, a leave or a
    recovery proposed at once ends every member's waits): a membership change, not a failure.
    Raised where a peer heard of it from another before its own notice came; ``rank`` is
    None (nobody was lost)."""


class LeftOut(PeerLost):
    """The group went on in a view without this member, which it counted lost while it was
    alive (silent past the timeout: stopped, or cut off); the member may join again as the
    next incarnation of its name (gossip does, taking the state like a restarted peer)."""


class ExchangeIncomplete(PeerLost):
    """A neighbour exchange run with ``partial=True`` completed without some of its peers
    (lost, or silent past the timeout): the result is in place, combined over the peers that
    took part. ``missing``: rank -> the error that left it out; ``missing_destinations``: the
    destinations among them (sorted), whose shares, with ``dst_weights``, stayed with the
    sender. ``rank`` is the first missing rank."""

    def __init__(self, message: str, *, missing: dict, missing_destinations: list,
                 operation: str | None = None) -> None:
        first = min(missing) if missing else None
        super().__init__(message, rank=first, operation=operation)
        self.missing = dict(missing)
        self.missing_destinations = list(missing_destinations)


class OperationTimeout(_AboutAPeer, TimeoutError):
    """A peer is alive (its heartbeats arrive) but did not deliver what an operation waited
    for within the timeout: usually a peer that is still computing, or that never made the
    matching call. Also a TimeoutError, so generic timeout handling catches it."""


class RendezvousError(GossipError):
    """Peers could not find each other: a rank never came, a duplicate rank, a world size that
    disagrees, or the rendezvous address could not be bound or reached. ``address_in_use``:
    rank 0 could not bind the rendezvous address because something else holds it (a launcher
    may choose another port and start the job again)."""

    def __init__(self, message: str, *, address_in_use: bool = False) -> None:
        super().__init__(message)
        self.address_in_use = address_in_use


class ProtocolError(GossipError):
    """A malformed or foreign message, or peers that made different calls (operation, shape,
    dtype, root) in the same mailbox (channel, sequence)."""


class AuthenticationError(GossipError):
    """A cluster key is missing, unreadable or malformed, or a peer failed the CURVE handshake."""


class UnsupportedDtype(GossipError, TypeError):
    """An array of a dtype the wire does not carry (an object array, datetime64, a quantized
    tensor), refused before the call takes a sequence number. Also a TypeError (the caller's
    array is of the wrong type). ``dtype``, the ``allowed`` ones, and the ``rank`` and
    ``operation`` of the call that refused it (None until the communicator names them)."""

    def __init__(self, dtype: str, allowed: Sequence[str], *, rank: int | None = None,
                 operation: str | None = None) -> None:
        where = f"rank {rank}: {operation}: " if rank is not None else ""
        super().__init__(f"{where}an array of dtype {dtype} cannot travel on the wire; the "
                         f"dtypes allowed are {', '.join(allowed)}")
        self.dtype = dtype
        self.allowed = tuple(allowed)
        self.rank = rank
        self.operation = operation

    def named(self, rank: int, operation: str) -> "UnsupportedDtype":
        """The same refusal, naming the rank and the operation that made it."""
        return UnsupportedDtype(self.dtype, self.allowed, rank=rank, operation=operation)
