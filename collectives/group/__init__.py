"""The view-change protocol of a group whose membership changes: versioned views of named
members (view.py), each member's door (door.py), and how the members of view v agree on view
v + 1 at one step boundary without a fixed leader (changes.py, with the coordinator's side in
coordinator.py, its records in proposal.py and the boundary's margin in margin.py).

A process takes part through ViewChanges, and answers what the protocol asks of it through a
MemberProcess (gossip's Peer does, in gossip/membership/)."""
from collectives.group.changes import MemberProcess, MemberReplaced, ViewChanges
from collectives.group.coordinator import Coordinator
from collectives.group.door import Door
from collectives.group.margin import BoundaryMargin
from collectives.group.proposal import Departure, Proposal, Switch
from collectives.group.view import Member, View, ViewError

__all__ = ["ViewChanges", "MemberProcess", "MemberReplaced", "Coordinator", "Door", "BoundaryMargin",
           "Departure", "Proposal", "Switch", "Member", "View", "ViewError"]
