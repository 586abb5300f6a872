"""What every policy does when the group's membership changes (gossip/membership.py): recover
from a death (elastic policies), hand its state to a joiner, take a joiner's state, follow the
new view. A mixin of Policy; the attributes it reads (_peer, _buckets, _step, ...) are Policy's.
"""
from __future__ import annotations

import logging
from typing import Any, ClassVar

import numpy as np

from gossip.errors import PeerLost

__all__ = ["MembershipHooks"]

log = logging.getLogger("gossip")


def _as_numpy(flat: Any) -> np.ndarray:
    """A numpy view of a bucket's flat buffer (a torch CPU tensor shares its memory)."""
    return flat if isinstance(flat, np.ndarray) else flat.detach().numpy()

log = logging.getLogger("gossip")


class MembershipHooks:
    """Policy's membership side. ``elastic`` and ``min_peers`` are set by the policies that
    can re-form their group."""

    elastic: bool = False
    min_peers: int = 1
    #: Whether the policy follows a view change (a join, a restart, an elastic recovery).
    #: Those that do not yet make the group refuse joiners while they are attached.
    follows_view_changes: ClassVar[bool] = True
    #: Whether the replicas are meant to hold the same state (synchronous policies): after
    #: a recovery, members a step behind then take the source's state too.
    replicated_state: ClassVar[bool] = True

    def _recover(self, exc: PeerLost) -> None:
        """A peer was lost mid-step: without ``elastic``, that is the step's error; with it,
        agree with the survivors on the next view and go on from the state of the survivor
        that completed most steps (the same on every survivor), below ``min_peers`` raise."""
        changing = getattr(self._peer, "changing_now", lambda: False)()
        if not self.elastic and not changing:
            raise exc   # a failure of the group; a planned change (a leave) any policy takes
        log.warning("rank %d: %s lost a peer in step %d (%s): re-forming the group",
                    self._peer.rank, self.name, self._step, exc)
        self._step = self._peer.recover(self, self._step)
        self._recovered = True
        if self._peer.world_size < self.min_peers:
            raise PeerLost(f"rank {self._peer.rank}: {self.name}: {self._peer.world_size} "
                           f"members left, fewer than min_peers={self.min_peers}") from exc

    def _transfer_state(self) -> Any:
        """What a member hands a joiner (gossip/state_transfer.py): the parameters' buckets
        and the step; policies with state of their own add it (``_transfer_values``)."""
        from gossip.state_transfer import TransferState
        self._buckets.copy_in()
        arrays = {f"bucket{b.index}": _as_numpy(b.flat) for b in self._buckets}
        return TransferState(arrays, self._transfer_values())

    def _transfer_values(self) -> dict:
        return {}

    def _load_transferred(self, step: int, values: dict) -> None:
        """The buckets were overwritten with the source's (in place): go on from ``step``."""
        self._buckets.copy_out()
        self._step = int(step)
        if self.nan_guard:
            self._guard.keep()

    def _view_changed(self) -> None:
        """The group's view changed (the peer has its new transport and topology): graph
        policies follow the topology; policies with per-peer state override this."""
        if self.default_topology is not None:
            from gossip.membership import resize_topology
            self._topology = resize_topology(self._topology, self._peer.world_size)
