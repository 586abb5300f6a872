"""What a policy may ask of the peer it is attached to: the PolicyHost contract.

gossip.Peer is the real implementation (gossip.simulation.SimHost the simulated one); a policy holds it as ``self._peer`` and asks it
nothing else. The membership side of the contract (at_boundary, recover, attached,
changing_now) is how a policy takes part in a view change: it calls the peer, the peer hands
the call to its membership controller (gossip/membership/), and the controller calls the
policy back only through its public hooks (gossip/membership/contracts.py's
MembershipParticipant).
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Any, Literal, Protocol, overload

if TYPE_CHECKING:
    from collectives import Communicator, NeighborPlan, Transport, Work
    from collectives.arrays import Array
    from collectives.codecs import CodecSpec
    from collectives.group import View
    from gossip.membership.contracts import MembershipParticipant
    from gossip.policies.base.concurrency import Concurrency
    from topologies import Topology

__all__ = ["PolicyHost"]


class PolicyHost(Protocol):
    """The peer as a policy sees it: identity, collectives, channels and membership."""

    # -- identity and settings --------------------------------------------------------------
    @property
    def rank(self) -> int:
        """This peer's rank in the current view, 0 to world_size - 1."""

    @property
    def world_size(self) -> int:
        """The number of members of the current view."""

    @property
    def timeout(self) -> float:
        """Default seconds of every blocking call (a policy's own timeout defaults to it)."""

    @property
    def topology(self) -> Topology:
        """The peer's graph (what PEER_TOPOLOGY stands for), recomputed at each view change."""

    @property
    def transport(self) -> Transport:
        """The current view's transport (its endpoints name this peer; ``interrupted`` says
        a view change at once ended its waits)."""

    @property
    def concurrency(self) -> Concurrency:
        """The threads, locks, conditions, events and clock of a background policy: the
        standard library's on a real peer, virtual ones on a simulated peer."""

    @property
    def view(self) -> View | None:
        """The current membership view (None for a peer without membership)."""

    @property
    def joining(self) -> bool:
        """True from a join until the running job's state arrived (at the first attach): a
        policy makes no collective call of its start then."""

    @property
    def closed(self) -> bool:
        """True once the peer's close() has begun."""

    def stats(self) -> dict[str, Any]:
        """The peer's traffic counters (bytes_sent, messages_sent, codec, ...)."""

    def lost_peers(self) -> dict[int, str]:
        """Ranks found dead or departed, with the reason."""

    # -- communication ----------------------------------------------------------------------
    def channel(self, number: int) -> Communicator:
        """An independent communicator for ``number`` (gossip/peer_channels.py's registry)."""

    # (Each call returns its result, or with wait=False a Work whose result it is: Peer's.)
    @overload
    def allreduce(self, x: Array, op: str = "sum", *, wait: Literal[True] = True,
                  timeout: float | None = None, algorithm: str = "auto",
                  compression: CodecSpec = None, residual: Array | None = None) -> Array: ...

    @overload
    def allreduce(self, x: Array, op: str = "sum", *, wait: Literal[False],
                  timeout: float | None = None, algorithm: str = "auto",
                  compression: CodecSpec = None, residual: Array | None = None) -> Work: ...

    def allreduce(self, x: Array, op: str = "sum", *, wait: bool = True,
                  timeout: float | None = None, algorithm: str = "auto",
                  compression: CodecSpec = None,
                  residual: Array | None = None) -> Array | Work:
        """Reduce ``x`` over every member in place (a Work handle with ``wait=False``)."""

    @overload
    def allgather(self, x: Array, *, out: Array | None = None, variable: Literal[False] = False,
                  wait: Literal[True] = True, timeout: float | None = None) -> Array: ...

    @overload
    def allgather(self, x: Array, *, out: Array | None = None, variable: Literal[True],
                  wait: Literal[True] = True, timeout: float | None = None) -> list[Array]: ...

    @overload
    def allgather(self, x: Array, *, out: Array | None = None, variable: bool = False,
                  wait: Literal[False], timeout: float | None = None) -> Work: ...

    def allgather(self, x: Array, *, out: Array | None = None, variable: bool = False,
                  wait: bool = True, timeout: float | None = None
                  ) -> Array | list[Array] | Work:
        """Every member's ``x`` in rank order (``variable=True``: sizes may differ)."""

    @overload
    def broadcast(self, x: Array, root: int = 0, *, wait: Literal[True] = True,
                  timeout: float | None = None) -> Array: ...

    @overload
    def broadcast(self, x: Array, root: int = 0, *, wait: Literal[False],
                  timeout: float | None = None) -> Work: ...

    def broadcast(self, x: Array, root: int = 0, *, wait: bool = True,
                  timeout: float | None = None) -> Array | Work:
        """Overwrite ``x`` with ``root``'s, in place."""

    @overload
    def neighbor_exchange(self, x: Array, plan: NeighborPlan, *, scratch: Array | None = None,
                          out: Array | None = None, wait: Literal[True] = True,
                          timeout: float | None = None) -> Array: ...

    @overload
    def neighbor_exchange(self, x: Array, plan: NeighborPlan, *, scratch: Array | None = None,
                          out: Array | None = None, wait: Literal[False],
                          timeout: float | None = None) -> Work: ...

    def neighbor_exchange(self, x: Array, plan: NeighborPlan, *, scratch: Array | None = None,
                          out: Array | None = None, wait: bool = True,
                          timeout: float | None = None) -> Array | Work:
        """One neighbour exchange as one value (a round's ``plan()``): weights, destinations
        and the exchange's options."""

    # -- membership ---------------------------------------------------------------------------
    def register_policy(self, policy: MembershipParticipant) -> None:
        """At attach: the peer closes ``policy`` first when it closes, and tells it of view
        changes."""

    def unregister_policy(self, policy: MembershipParticipant) -> None:
        """At close: forget ``policy``."""

    def attached(self, policy: MembershipParticipant) -> None:
        """At attach, after register_policy: a joiner takes the running job's state into
        ``policy`` now."""

    def at_boundary(self, policy: MembershipParticipant, step: int) -> bool:
        """After each step (``step`` completed): take a view change that takes effect at
        this boundary; True if the view changed."""

    def recover(self, policy: MembershipParticipant, step: int, pending: bool = False) -> int:
        """A peer was lost mid-step (an elastic policy): agree with the survivors on the next
        view and return the step count to go on from (``pending``: ``policy``'s state holds
        this member's update of step ``step``, not yet combined; the view change tells the
        policy through resume_at whether it completes that step)."""

    def changing_now(self) -> bool:
        """True while a change at once (a recovery, a leave) is proposed to this peer: a
        PeerLost meanwhile is that change, not a failure."""
