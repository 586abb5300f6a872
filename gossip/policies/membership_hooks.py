"""What every policy does when the group's membership changes (gossip/membership.py): recover
from a death (elastic policies), take the state a source sent it (gossip/state_transfer.py
builds and loads it), follow the new view. A mixin of Policy; the attributes it reads (_peer, _buckets, _step, ...) are Policy's.
"""
from __future__ import annotations

import logging
from typing import Any, ClassVar

from gossip.errors import PeerLost, ViewChanging

__all__ = ["MembershipHooks"]

log = logging.getLogger("gossip")


class MembershipHooks:
    """Policy's membership side. ``elastic`` and ``min_peers`` are set by the policies that
    can re-form their group."""

    elastic: bool = False
    min_peers: int = 1
    #: Whether the policy follows a view change (a join, a restart, an elastic recovery).
    #: Those that do not yet make the group refuse joiners while they are attached.
    follows_view_changes: ClassVar[bool] = True
    #: Whether ``peer.leave()`` must be planned at a step boundary the group agrees on, the
    #: leaver taking rounds until then and handing its state to a member there (push-sum's
    #: mass); False: the leave takes effect at once (collectives/membership/changes.py).
    hands_off_at_leave: ClassVar[bool] = False
    #: Whether part of the state is the same bytes on every member although the models are
    #: each their own (elastic averaging's replicated centre, local SGD's last average): after
    #: a recovery a member behind the source's step count takes the source's state, as
    #: identical replicas do. A member behind is one whose collective failed where the
    #: others' completed (its last send to it was lost with the dead peer): going on from its
    #: own state would leave it out of a round the others counted it in.
    shared_state: ClassVar[bool] = False

    def _recover(self, exc: PeerLost) -> None:
        """A peer was lost mid-step: without ``elastic``, that is the step's error; with it,
        agree with the survivors on the next view and go on from the state of the survivor
        that completed most steps (the same on every survivor), below ``min_peers`` raise."""
        # A change under way (a leave, a recovery at once), known here or heard of from a
        # member that it ended (ViewChanging: that member's notice came first).
        changing = getattr(self._peer, "changing_now", lambda: False)() or \
            isinstance(exc, ViewChanging)
        if not self.elastic and not changing:
            raise exc   # a failure of the group; a planned change (a leave) any policy takes
        log.warning("rank %d: %s lost a peer in step %d (%s): re-forming the group",
                    self._peer.rank, self.name, self._step, exc)
        self._step = self._peer.recover(self, self._step)
        self._recovered = True
        if self._peer.world_size < self.min_peers:
            raise PeerLost(f"rank {self._peer.rank}: {self.name}: {self._peer.world_size} "
                           f"members left, fewer than min_peers={self.min_peers}") from exc

    def max_drift(self) -> int | None:
        """The most steps a member of this policy's group can be ahead of another (a change is
        proposed that far ahead and a little more: collectives/membership/margin.py); None:
        not bounded by the policy (the view's size is taken)."""
        return None

    #: The torch optimizer whose state travels with the policy's (DistributedOptimizer sets
    #: it): a joiner's momentum must be the replicas', or its steps would differ.
    _transfer_optimizer: Any = None

    def _took_state(self, step: int) -> None:
        """The source's state was loaded into the buckets (state_transfer.load_state): push it
        to the user's arrays and go on from ``step``."""
        self._buckets.copy_out()
        self._step = int(step)
        # A residual is what its peer has not sent yet: taken over from the source, the
        # source's unsent error would reach the average twice. This peer starts without.
        self._compression.forget_residuals()
        if self.nan_guard:
            self._guard.keep()

    def _view_changing(self, switch: Any) -> None:
        """A committed view change, before the peer installs it (its transport is still the
        old view's): what the policy must finish or take in the old view (push-sum: the
        exchange in flight, a leaver's mass) and how its state follows the switch."""

    def _state_sent(self) -> None:
        """This member (the switch's source) sent its state to the receivers."""

    def _hand_off(self, to: int) -> None:
        """A planned leaver at its boundary: give what it holds to rank ``to`` of the view it
        leaves (-1: nobody takes it)."""

    def _settle_view(self) -> None:
        """Every member of the new view, joiners too, once the state moved and before the
        barrier that ends the switch (the new view's transport): a policy whose state is
        spread over the members (the sharded EASGD centre) moves it here, in collectives
        every member makes in the same order."""

    def _check_min_peers(self) -> None:
        """After a view change taken at a step boundary (not in _recover: a member that was
        not in a collective when a peer died hears of the recovery there): fewer members than
        ``min_peers`` is PeerLost, as in _recover."""
        if self.elastic and self._peer.world_size < self.min_peers:
            raise PeerLost(f"rank {self._peer.rank}: {self.name}: {self._peer.world_size} "
                           f"members left, fewer than min_peers={self.min_peers}")

    def _view_changed(self) -> None:
        """The group's view changed (the peer has its new transport and topology): graph
        policies follow the topology; policies with per-peer state override this."""
        if self.default_topology is not None:
            from gossip.membership import resize_topology
            self._topology = resize_topology(self._topology, self._peer.world_size)
