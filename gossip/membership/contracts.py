"""The membership controller's two contracts: what it needs from an attached policy
(MembershipParticipant: gossip.policies.Policy is one) and from the peer that owns it
(MembershipHost: gossip.Peer is one). The controller asks nothing else of either."""
from __future__ import annotations

from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from collectives import Communicator, Transport
    from collectives.group import Switch
    from gossip.policies.base.buckets import BucketSet

__all__ = ["MembershipParticipant", "MembershipHost"]


class MembershipParticipant(Protocol):
    """A policy attached to a peer, as a view change sees it: what its state is, how it
    travels, and the hooks the controller calls, in this order at a committed switch:
    view_changing, view_changed, state_sent (the source) or took_state (a receiver),
    resume_at, settle_view; hand_off at a planned leaver's boundary."""

    # -- what it is ---------------------------------------------------------------------------
    @property
    def name(self) -> str:
        """The policy's registry name (logs, refusals)."""

    @property
    def timeout(self) -> float:
        """Seconds any wait of the policy may take: also a state transfer's."""

    @property
    def closed(self) -> bool:
        """True after the policy's close()."""

    @property
    def identical_replicas(self) -> bool:
        """Every member holds the same bytes after a step: members at the source's step may
        all donate the state."""

    @property
    def shared_state(self) -> bool:
        """Part of the state is the same bytes on every member: a member behind the source's
        step takes the source's state after a recovery."""

    @property
    def own_steps(self) -> bool:
        """Each member's step count is its own: a change takes each at its next boundary."""

    @property
    def hands_off_at_leave(self) -> bool:
        """A leave must be planned at an agreed boundary, where the leaver hands its state
        over (hand_off); False: a leave takes effect at once."""

    @property
    def follows_view_changes(self) -> bool:
        """The policy follows a view change; False: joiners are refused while it is
        attached."""

    def max_drift(self) -> int | None:
        """The most steps a member can be ahead of another (None: not bounded)."""

    # -- its state ----------------------------------------------------------------------------
    @property
    def buckets(self) -> BucketSet:
        """The packed parameters: what a state transfer sends and receives into."""

    @property
    def transfer_optimizer(self) -> Any:
        """The torch optimizer whose state travels with the policy's (None: none does)."""

    def state_dict(self) -> dict:
        """The policy's own state, sent with the parameters."""

    def load_state_dict(self, state: dict) -> None:
        """Load the state a source sent."""

    def after_step(self) -> None:
        """One more round (a planned leaver takes rounds until its boundary)."""

    def close(self) -> None:
        """Stop the policy's threads (the peer closes its policies before its sockets)."""

    # -- the hooks of a view change -------------------------------------------------------------
    def view_changing(self, switch: Switch) -> None:
        """A committed change, on the old view's transport: finish what must end there."""

    def view_changed(self) -> None:
        """The new view's transport and topology are installed."""

    def state_sent(self) -> None:
        """This member, the switch's source, sent its state to the receivers."""

    def took_state(self, step: int) -> None:
        """The source's state was loaded into the buckets: go on from ``step``."""

    def resume_at(self, step: int, *, complete: bool = False) -> None:
        """Go on from step count ``step``, the new view's; ``complete``: the state holds an
        update of step ``step`` not yet combined (this member's own, cut off by a recovery,
        or the source's, taken with its state): complete that step (its communication, no
        local update, counted) before the next one, instead of beginning it again."""

    def settle_view(self) -> None:
        """Every member of the new view, before the barrier that ends the switch: move state
        spread over the members (collectives every member makes in the same order)."""

    def hand_off(self, to: int) -> None:
        """A planned leaver at its boundary: give what it holds to rank ``to`` of the view it
        leaves (-1: nobody takes it)."""


class MembershipHost(Protocol):
    """The peer that owns a membership controller, as the controller sees it."""

    @property
    def rank(self) -> int:
        """This peer's rank in the current view."""

    @property
    def timeout(self) -> float:
        """Default seconds of every blocking call."""

    @property
    def policies(self) -> list[MembershipParticipant]:
        """The policies attached and not yet closed."""

    def channel(self, number: int) -> Communicator:
        """An independent communicator (the state transfer's: PeerChannel.MEMBERSHIP)."""

    def barrier(self, timeout: float | None = None) -> None:
        """Every member meets (the end of a switch)."""

    def close(self) -> None:
        """Close the peer (a joiner whose state did not come)."""

    def install_transport(self, transport: Transport) -> tuple[Transport, list[Communicator]]:
        """Take a new view's transport: a new communicator, the channels made afresh, the
        earlier view's traffic added to the totals, the topology recomputed over the new
        size. Returns the old transport and communicators, for the caller to close once the
        new view is settled."""

    def tracked_states(self) -> dict[str, Any]:
        """The tracked objects' state dicts (an ElasticSampler's cursor), by name: they
        travel with the state a member sends."""

    def load_tracked_states(self, states: dict[str, Any]) -> None:
        """Load received tracked states into the objects registered under their names (the
        others wait for their registration)."""

    def resume_tracked(self, complete: bool) -> None:
        """A view change this member keeps its own state through: tell the tracked objects
        that follow steps (an ElasticSampler) whether the step in progress is completed
        (``complete``) or begun again (what they handed out for it is handed out again)."""
