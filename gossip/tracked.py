"""What a peer carries for objects beside the model (``peer.track_state``): their state travels
with the state a member sends (a joiner's, a member behind after a recovery), and those that
follow the group's steps are told of each step boundary and of the boundary a view change
goes on from. gossip.ElasticSampler is both."""
from __future__ import annotations

from typing import Any, Protocol, runtime_checkable

__all__ = ["TrackedState", "StepTracked"]


@runtime_checkable
class TrackedState(Protocol):
    """An object whose state travels with a member's (plain values: msgpack, never a
    pickle)."""

    def state_dict(self) -> dict[str, Any]:
        """The state a member sends."""

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Load the state a source sent."""


@runtime_checkable
class StepTracked(TrackedState, Protocol):
    """A tracked object that hands something out per step (an ElasticSampler: the step's
    batch): it must know which of its hand-outs a step that a recovery cut off used, since
    that step is either completed or begun again."""

    def step_completed(self, step: int) -> None:
        """The boundary after step count ``step``: the oldest hand-out not yet completed is
        the completed step's (called by the peer at every boundary of the policy that
        drives the loop)."""

    def step_resumed(self, complete: bool) -> None:
        """A view change this member keeps its own state through: the step in progress is
        completed in the new view (``complete``: its hand-out stays the step's) or begun
        again (what was handed out since the last boundary is handed out again, cut from
        the new view's partition)."""
