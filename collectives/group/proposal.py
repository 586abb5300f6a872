"""The records of a view change: a coordinator's proposal, a committed switch as one process
takes it, and a planned leaver's departure (changes.py has the protocol)."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from collectives.group.view import Member, View

__all__ = ["Proposal", "Switch", "Departure"]


@dataclass(frozen=True)
class Proposal:
    pid: str
    number: int                 # the view number it proposes
    members: tuple[Member, ...]
    at_step: int | None         # None: at once (a recovery)
    coordinator: str            # its door

    def rank_of(self, name: str) -> int | None:
        for rank, m in enumerate(self.members):
            if m.name == name:
                return rank
        return None

    @property
    def hosts(self) -> list[str]:
        """Each member's host, by rank (which of them may share memory)."""
        return [m.host for m in self.members]

    def to_wire(self) -> dict:
        return {"pid": self.pid, "number": self.number, "at": self.at_step,
                "members": [m.to_wire() for m in self.members]}


@dataclass
class Switch:
    """A committed change, as this process takes it: the new view, this process's transport
    for it (endpoints installed), whose state the receivers take and at which step."""
    view: View
    transport: Any
    source: int                 # rank (in the new view) whose state the receivers take
    step: int                   # the step count everyone continues from
    receivers: list[int]        # ranks that must take the source's state
    # The ranks that send it, the source first (it sends the manifest): identical replicas at
    # the source's step, each a share of the chunks. Empty: the source alone.
    donors: list[int] = field(default_factory=list)
    # (receiver's rank in the new view, leaver's rank in the old one): planned leavers whose
    # policy state (push-sum mass) the receiver takes over the old transport, before it closes
    handoffs: list[tuple[int, int]] = field(default_factory=list)
    # Proposed at once (a recovery, a leave): the members' waits on the old transport were
    # ended before they stopped (changes.py), so nothing more can be waited for on it.
    at_once: bool = False
    # The source stopped inside step ``step`` with its local update in its state, not yet
    # combined: the receivers, which take that update, complete the step in the new view
    # (changes.py); False: they begin step ``step`` afresh.
    completes: bool = False
    # The names of the ending view's members that asked to leave (at once or planned) and
    # that this view leaves out: leaves, not deaths (the membership's metrics count them so).
    left: frozenset[str] = frozenset()

    @property
    def senders(self) -> list[int]:
        """Who sends the state: the donors, or the source alone."""
        return list(self.donors) or [self.source]


@dataclass(frozen=True)
class Departure:
    """A planned leave, as the leaver takes it at the boundary where the others go on
    without it: it hands what it holds to ``to`` (the receiver's rank in the view it leaves,
    on that view's transport), then closes."""
    number: int                 # the view the others go on in
    to: int                     # rank, in the view left, of the member that takes its state
