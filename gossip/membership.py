"""A peer's membership: its door, its view of the group, and what a view change does to the
peer (collectives/membership/changes.py is the protocol; this is the peer's side of it).

Every peer of a group started by the rendezvous is a member of view 0: its name is its
launcher slot (``GOSSIP_MEMBER_NAME``, default ``rank<R>`` from the rank it started with, so
a restarted process under the same variables is recognised as the same member) and its
incarnation grows with every start (``GOSSIP_INCARNATION``, torchrun's restart count, else
the start time in microseconds). When the view changes, the peer gets a new transport (the
old one's messages can never reach the new one: the view is part of every connection's
routing id), a new communicator, the topology recomputed over the new size (a ring stays a
ring; its spectral gap is logged), and every attached policy is told (``_view_changed``).
The members whose state the commit names as stale (joiners, and after a recovery the members
that did not finish the step the source finished) take the source member's state
(state_transfer.py), then everybody goes on from the same step.
"""
from __future__ import annotations

import logging
import os
import time
from typing import Any, Callable

from collectives.errors import LeftOut
from collectives.membership.changes import Switch, ViewChanges
from collectives.membership.door import Door
from collectives.membership.view import Member, View

__all__ = ["PeerMembership", "member_identity", "resize_topology", "MEMBER_FIELDS",
           "attach_policy_answers"]

log = logging.getLogger("gossip")

# The fields a rendezvous entry carries for membership (beside the transport's endpoints).
MEMBER_FIELDS = ("name", "inc", "door")


def member_identity(rank: int, env=None) -> tuple[str, int]:
    """(name, incarnation) of this process: see the module docstring."""
    env = os.environ if env is None else env
    name = env.get("GOSSIP_MEMBER_NAME") or f"rank{rank}"
    for variable in ("GOSSIP_INCARNATION", "TORCHELASTIC_RESTART_COUNT"):
        value = env.get(variable, "")
        if value.isdigit():
            # A launcher's count, made larger than any clock-made incarnation of the same
            # slot would not be: counts stay small, so they order among themselves only.
            return name, int(value)
    return name, time.time_ns() // 1000


def resize_topology(topology: Any, size: int) -> Any:
    """The same kind of graph over ``size`` peers: its spec again, or, for a spec tied to a
    size (``torus:2x2``), its name alone (torus then picks the most square grid)."""
    import topologies
    from topologies.errors import TopologyError

    if topology.size == size:
        return topology
    spec = getattr(topology, "spec", None)
    if not isinstance(spec, str):
        raise TopologyError(f"{topology!r} cannot be recomputed for {size} peers: pass a "
                            "topology spec such as 'ring' to a group whose size may change")
    try:
        return topologies.parse(spec, size)
    except TopologyError:
        return topologies.parse(spec.split(":")[0].split(",")[0], size)


class PeerMembership:
    """The door and the view-change protocol of one peer, and the transports they make."""

    def __init__(self, name: str, incarnation: int, config: Any,
                 make_transport: Callable[[int, int, int], Any], timeout: float,
                 host: str = "") -> None:
        self.name, self.incarnation = name, incarnation
        self.door = Door(config, who=f"{name}#{incarnation}")
        self._transport: Any = None
        self.changes = ViewChanges(name, incarnation, self.door, None, make_transport,
                                   self._lost_names, timeout, host=host)
        self.changes.on_interrupt = self._interrupt
        bound = os.environ.get("GOSSIP_MAX_PEERS", "")
        if bound:
            if not bound.isdigit() or int(bound) < 1:
                raise ValueError(f"GOSSIP_MAX_PEERS={bound!r}: expected a positive number "
                                 "of members")
            self.changes.max_members = int(bound)
        self.rendezvous_address: str | None = None
        self._rendezvous_host = ""

    # ------------------------------------------------------------------ views
    @property
    def view(self) -> View | None:
        return self.changes.view

    def entry_fields(self) -> dict:
        """What this process adds to its rendezvous entry."""
        return {"name": self.name, "inc": self.incarnation, "door": self.door.address}

    def start(self, transport: Any, table: dict[int, dict], job_id: str,
              rendezvous_address: str | None) -> View:
        """View 0 from the rendezvous table; rank 0 then listens at the rendezvous address,
        so a process started again the way it first started finds the running job there."""
        members = tuple(Member(str(e.get("name") or f"rank{r}"), int(e.get("inc") or 0),
                               str(e.get("door") or ""), str(e.get("host") or ""))
                        for r, e in sorted(table.items()))
        view = View(job_id, 0, members, 0)
        self.changes.view = view
        self._transport = transport
        self.rendezvous_address = rendezvous_address
        self.changes.margin.members = len(view)
        self.door.on_registration = self._registration
        self.door.on_held = self._announce
        self._rendezvous_host = members[0].host   # where the rendezvous address lives
        self.door.every_poll(self._hold_rendezvous)
        log.debug("%s: %s (from the rendezvous at %s)", self.name, view.describe(),
                  rendezvous_address)
        return view

    def use(self, transport: Any) -> None:
        """The transport of the current view (after a switch)."""
        self._transport = transport
        self.changes.margin.members = transport.world_size

    def _hold_rendezvous(self) -> None:
        """Door thread: the coordinator of the moment, if on the rendezvous host, listens at
        the rendezvous address, so a process started again as it first started (rank 0's
        too) finds the running job there, whoever died."""
        address = self.rendezvous_address
        if not address or address in self.door.listening_also or self._transport is None:
            return
        if self._transport.endpoints.get("host") != self._rendezvous_host:
            return
        if self.changes.is_coordinator():
            self.door.listen_also(address)

    def _announce(self, address: str) -> None:
        """Door thread: someone else holds the rendezvous address (a restarted rank 0's
        rendezvous, waiting for peers that are running): tell it the job runs."""
        reply = self._registration({"job": self.changes.view.job_id if self.changes.view
                                    else ""})
        if reply is not None and "running" in reply:
            self.door.announce(address, reply)

    def _interrupt(self) -> None:
        if self._transport is not None:
            self._transport.interrupt()

    def _lost_names(self) -> set:
        view, transport = self.changes.view, self._transport
        if view is None or transport is None:
            return set()
        return {view.member(r).name for r in transport.lost_ranks() if r < len(view)}

    def _registration(self, registration: dict) -> dict | None:
        """A rendezvous registration reaching this door (a restarted process starting as it
        started the first time): tell it the job runs, and where the doors are."""
        view = self.changes.view
        if view is None or registration.get("job", "") != view.job_id:
            return {"refused": f"the rendezvous address is held by a running member of job "
                               f"{view.job_id if view else '?'!r}"}
        c = self.changes.coordinator()
        doors = [c.door] if c is not None else []
        doors += [m.door for m in view.members if m.door not in doors]
        return {"running": view.to_wire(), "doors": doors}

    # ------------------------------------------------------------------ changes
    def boundary(self, step: int) -> Switch | None:
        """At a step boundary: the switch that takes effect here, if any (cheap otherwise)."""
        self.changes.passing(step)   # first: see ViewChanges._on_prepare
        if not self.changes.has_pending():
            return None
        try:
            return self.changes.boundary(step)
        except LeftOut as exc:
            return self._join_again(exc)

    def recover(self, step: int) -> Switch:
        log.info("%s: recovering at step %d; lost in view %s: %s", self.name, step,
                 self.view.number if self.view else None,
                 self._transport.lost_ranks() if self._transport is not None else {})
        try:
            return self.changes.recover(step, self._lost_names())
        except LeftOut as exc:
            return self._join_again(exc)

    def _join_again(self, exc: LeftOut) -> Switch:
        """The group went on without this live member: join it again, as the next
        incarnation of this name (it takes the state as a restarted peer does)."""
        doors = [m.door for m in self.view.members if m.name != self.name]
        log.warning("%s: %s; joining again as incarnation %d", self.name, exc,
                    self.changes.incarnation + 1)
        self.changes.start_over()
        self.incarnation = self.changes.incarnation
        return self.changes.join(doors)

    def join(self, doors: list[str]) -> Switch:
        return self.changes.join(doors)

    def close(self) -> None:
        self.door.close()


def attach_policy_answers(changes: Any, policies: Callable[[], list]) -> None:
    """What a member's view changes ask of its attached ``policies()``
    (collectives/membership): how much of its state is the others' too, whether its step
    count is its own, and how far ahead of another member it can be."""
    def sharing() -> str:
        # "identical" (replicas: the members at the source's step may all donate), "shared"
        # (a part is: elastic averaging's centre), "own"; see membership/coordinator.py.
        mine = policies()
        if all(p.identical_replicas for p in mine):
            return "identical"
        if all(p.identical_replicas or p.shared_state for p in mine):
            return "shared"
        return "own"

    def own_steps() -> bool:
        # Asynchronous gossip: each member is taken at its next boundary, whatever its count.
        mine = policies()
        return bool(mine) and all(getattr(p, "own_steps", False) for p in mine)

    def drift() -> int | None:
        # The most steps a member can be ahead of another (None: unknown; margin.py).
        drifts = [p.max_drift() for p in policies()]
        return None if not drifts or None in drifts else max(drifts)

    changes.sharing, changes.own_steps, changes.margin.drift = sharing, own_steps, drift
