"""A membership view: which processes form the group now, numbered.

A view has a number (0 for the group the rendezvous formed; each change adds one), the job it
belongs to, and its members in rank order: ranks are dense within a view, so collectives run
over ``range(len(view))`` as before. A member has a stable name (the launcher's slot for it,
e.g. "rank3", kept across restarts) and an incarnation (a number that grows every time that
slot's process starts again), so a restarted process replaces its dead predecessor and nothing
of the predecessor is mistaken for it. Each member's door (door.py) is where the others and
joiners reach it about membership.

Views travel as msgpack maps (``to_wire`` / ``from_wire``); ``from_wire`` validates every field
of what came off the network, as the wire header does.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from collectives.config import check_job_id

__all__ = ["Member", "View", "ViewError", "MAX_MEMBERS"]

MAX_MEMBERS = 1 << 16   # a view larger than this off the wire is refused, not allocated
_MAX_TEXT = 256


class ViewError(ValueError):
    """A view or member description that does not hold together."""


@dataclass(frozen=True)
class Member:
    name: str          # stable across restarts: the launcher's slot
    incarnation: int   # grows with every start of that slot's process
    door: str          # tcp://host:port of its door
    host: str = ""     # transport.endpoints["host"]: which members share memory

    def to_wire(self) -> dict:
        return {"name": self.name, "inc": self.incarnation, "door": self.door,
                "host": self.host}

    @classmethod
    def from_wire(cls, obj: Any) -> "Member":
        if not isinstance(obj, dict):
            raise ViewError(f"a member must be a map, got {type(obj).__name__}")
        inc = obj.get("inc")
        name, door, host = (_text("name", obj.get("name")), _text("door", obj.get("door")),
                            _text("host", obj.get("host", "")))
        if not name:
            raise ViewError("a member needs a name")
        if type(inc) is not int or not 0 <= inc < 1 << 63:
            raise ViewError(f"member {name!r}: incarnation must be a non-negative int")
        return cls(name, inc, door, host)

    def __str__(self) -> str:
        return f"{self.name}#{self.incarnation}"


@dataclass(frozen=True)
class View:
    job_id: str
    number: int
    members: tuple[Member, ...]
    step: int = 0      # the step boundary it took effect at (0: the start)

    def __post_init__(self) -> None:
        names = [m.name for m in self.members]
        if len(set(names)) != len(names):
            raise ViewError(f"view {self.number}: a name appears twice in {names}")
        if not self.members:
            raise ViewError(f"view {self.number} has no members")

    @property
    def size(self) -> int:
        return len(self.members)

    def __len__(self) -> int:
        return len(self.members)

    def rank_of(self, name: str) -> int | None:
        """The dense rank of the member called ``name``, or None if it is not one."""
        for rank, member in enumerate(self.members):
            if member.name == name:
                return rank
        return None

    def member(self, rank: int) -> Member:
        return self.members[rank]

    def names(self) -> list[str]:
        return [m.name for m in self.members]

    def to_wire(self) -> dict:
        return {"job": self.job_id, "number": self.number, "step": self.step,
                "members": [m.to_wire() for m in self.members]}

    @classmethod
    def from_wire(cls, obj: Any) -> "View":
        if not isinstance(obj, dict):
            raise ViewError(f"a view must be a map, got {type(obj).__name__}")
        job, number, step, members = (obj.get("job"), obj.get("number"), obj.get("step"),
                                      obj.get("members"))
        try:
            job = check_job_id(job)
        except ValueError as exc:
            raise ViewError(str(exc)) from None
        number, step = _count("number", number), _count("step", step)
        if not isinstance(members, list) or not 0 < len(members) <= MAX_MEMBERS:
            raise ViewError(f"a view needs 1 to {MAX_MEMBERS} members")
        return cls(job, number, tuple(Member.from_wire(m) for m in members), step)

    def describe(self) -> str:
        """One line for logs: number, size and members in rank order."""
        return (f"view {self.number} of job {self.job_id or '(unnamed)'}: {self.size} members "
                f"[{', '.join(str(m) for m in self.members)}]")


def _text(field: str, value: object) -> str:
    """A member's text field off the wire, or ViewError."""
    if not isinstance(value, str) or len(value) > _MAX_TEXT:
        raise ViewError(f"member {field} must be a string of at most {_MAX_TEXT}")
    return value


def _count(field: str, value: object) -> int:
    """A view's number or step off the wire, or ViewError."""
    if type(value) is not int or not 0 <= value < 1 << 63:
        raise ViewError(f"view {field} must be a non-negative int, got {value!r}")
    return value
