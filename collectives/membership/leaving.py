"""The leaving side of a member's view changes (a mixin of changes.ViewChanges, whose
attributes it uses: name, view, door, cond, timeout, _answer, _proposal, departing): a leave
at once (``leave()``) and a planned one (``request_leave()``, then ``_depart`` at the
boundary the group agreed on); changes.py's docstring has the protocol."""
from __future__ import annotations

import logging
import time

from collectives.errors import OperationTimeout
from collectives.membership.proposal import Departure, Proposal

__all__ = ["Leaving"]

log = logging.getLogger("collectives")


class Leaving:
    """leave(), request_leave() and the planned leaver's wait at its boundary."""

    def leave(self) -> None:
        """Leave the group: the coordinator proposes at once the view without this member,
        which waits (at most the timeout) until that view is committed."""
        self.departing = False   # (after a planned leave that did not come through)
        deadline = time.monotonic() + self.timeout
        while time.monotonic() < deadline:
            c = self.coordinator()
            others = [m for m in self.view.members if m.name != self.name
                      and m.name not in self.known_lost()]
            if c is None or not others:
                return   # the last member: nobody to tell
            self.door.tell(c.door, "leave", name=self.name)
            wait_until = min(deadline, time.monotonic() + self.timeout / 4)
            with self.cond:
                while self._answer is None and time.monotonic() < wait_until:
                    self.cond.wait(0.1)
                answer, self._answer = self._answer, None
            if answer is not None and answer["kind"] == "left":
                log.info("%s: left the group (view %s goes on without it)", self.name,
                         answer.get("number"))
                return
            if c.name != self.name:
                self.reported_lost.add(c.name)   # silent: ask the next one
        raise OperationTimeout(f"{self.name}: no coordinator confirmed its leave within "
                               f"{self.timeout:g}s")

    def request_leave(self) -> bool:
        """Ask for a planned leave (see the module docstring) and return at once: the member
        goes on taking rounds until boundary() returns its Departure. False if there is
        nobody to leave (the last live member)."""
        c = self.coordinator()
        others = [m for m in self.view.members if m.name != self.name
                  and m.name not in self.known_lost()]
        if c is None or not others:
            return False
        with self.cond:
            self.departing = True
            self._answer = None
        self.door.tell(c.door, "leave", name=self.name, planned=True)
        return True

    def _depart(self, p: Proposal, step: int, deadline: float) -> Departure | None:
        """A planned leaver at the boundary of a view without it: wait until it is committed
        (``left``, naming the member that takes this one's state), or a proposal moves the
        boundary further on (None: take rounds to it)."""
        with self.cond:
            while True:
                answer = self._answer
                if answer is not None and answer.get("kind") == "left":
                    self._answer = self._proposal = None
                    to = answer.get("to")
                    return Departure(int(answer.get("number") or 0),
                                     to if type(to) is int else -1)
                q = self._proposal
                if q is not None and q.pid != p.pid and q.at_step is not None \
                        and q.at_step > step:
                    return None
                if time.monotonic() >= deadline:
                    raise OperationTimeout(f"{self.name}: its leave was not committed within "
                                           f"{self.timeout:g}s (step {step})")
                self.cond.wait(min(0.1, max(0.0, deadline - time.monotonic())))
