"""The runtime's error tree, re-exported from the layers that raise them.

GossipError is the one base. MemberReplaced (a member whose name the group gave to a restart
in its place: it stops) is raised by the view-change protocol, collectives/group/. TopologyError is also a ValueError; the topologies layer (pure
math, numpy only) raises topologies.TopologyError, and gossip re-raises it as this subclass,
which is both, wherever a topology enters the runtime. The snapshot errors (SnapshotError and
its two kinds) are raised by gossip.snapshot and the checkpoint helpers only.
"""
from collectives.errors import (AuthenticationError, ExchangeIncomplete, GossipError, LeftOut,
                                OperationTimeout, PeerLost, ProtocolError, RendezvousError,
                                UnsupportedDtype, ViewChanging)
from collectives.group import MemberReplaced
from topologies.errors import TopologyError as _PureTopologyError

__all__ = ["GossipError", "PeerLost", "ExchangeIncomplete", "ViewChanging", "LeftOut",
           "OperationTimeout", "RendezvousError", "ProtocolError", "AuthenticationError",
           "UnsupportedDtype",
           "MemberReplaced", "TopologyError", "SnapshotError", "SnapshotMismatch", "SnapshotCorrupt"]


class TopologyError(_PureTopologyError, GossipError):
    """A topology, its weights or its spec string is invalid (also a ValueError)."""


class SnapshotError(GossipError):
    """A snapshot or checkpoint cannot be used (base of SnapshotMismatch and SnapshotCorrupt;
    raised itself for a malformed manifest or a checkpoint another rank failed to write or
    read). ``tensor``: the name of the array concerned, when there is one."""

    def __init__(self, message: str, *, tensor: str | None = None) -> None:
        super().__init__(message)
        self.tensor = tensor


class SnapshotMismatch(SnapshotError, ValueError):
    """Two descriptions of a training state disagree: a tensor's name, shape or dtype (the
    first such tensor is named, with what each side has), or the checkpoint each rank holds.
    Also a ValueError: it is the caller's model or optimizer that does not fit."""


class SnapshotCorrupt(SnapshotError):
    """Bytes that do not match their digest, or a file cut short: a torn or corrupted file, a
    bad chunk from a donor. ``tensor`` names the first corrupted array; ``offset`` and
    ``nbytes`` are its range in the snapshot's byte space (to fetch again), when known."""

    def __init__(self, message: str, *, tensor: str | None = None, offset: int | None = None,
                 nbytes: int | None = None) -> None:
        super().__init__(message, tensor=tensor)
        self.offset = offset
        self.nbytes = nbytes
