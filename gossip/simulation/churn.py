"""The churn of a simulation: when each slot's processes live and die, on the virtual clock.

A slot is a peer's place in the fleet (its starting rank, its data shard). It holds a sequence
of lives, one process each: a slot of the first ``initial`` starts as a member at 0 s (life
0); every later life (a restarted process, or a new peer's first in a slot past ``initial``)
begins with its process's request to join, and the members admit it at the next step
boundary (fabric.py). A life ends at its death (math.inf: it lives to the end). A slot may
die, come back, and die again as often as the schedule says: a preemptible fleet's spot
instances do.

Deaths come from a list, or drawn from a seed (``mtbf``): one per ``mtbf`` simulated seconds
across the fleet on average (exponential gaps), each on a slot drawn uniformly from those
whose life is under way at that second by this schedule (its request to join past, its death
not yet; slots with listed deaths are never drawn), and only while more than two are. Draws
are made lazily, in time order, as the clocks get there, so the schedule is the same whatever
order the peers' threads ask in, and with restarts it never runs out. (A life drawn to die
after its request but before the members admitted it dies as it is admitted.)
"""
from __future__ import annotations

import bisect
import math
from collections.abc import Mapping, Sequence

import numpy as np

__all__ = ["Churn"]


class Churn:
    """The lives of ``slots`` slots, the first ``initial`` members from the start.

    ``deaths``: slot -> its lives' deaths (simulated seconds, ascending: life 0's, life 1's,
    ...); ``requests``: slot -> its later lives' requests to join (ascending; a slot past
    ``initial``: its first life's request first); past those, with ``restart_after`` every
    death is followed by a request that much later; ``mtbf`` and ``seed``: deaths drawn as
    the module docstring says."""

    def __init__(self, slots: int, initial: int | None = None, *,
                 deaths: Mapping[int, Sequence[float]] | None = None,
                 requests: Mapping[int, Sequence[float]] | None = None,
                 restart_after: float | None = None, mtbf: float | None = None,
                 seed: int = 0) -> None:
        self.slots = slots
        self.initial = slots if initial is None else initial
        self._deaths = {int(r): sorted(float(t) for t in ts) for r, ts in (deaths or {}).items()
                        if len(ts)}
        self._requests = {int(r): sorted(float(t) for t in ts)
                          for r, ts in (requests or {}).items() if len(ts)}
        self._restart_after = restart_after
        self._listed = set(self._deaths)   # (never drawn)
        # Every death known so far, (seconds, slot, life), ascending.
        self._timeline = sorted((t, r, k) for r, ts in self._deaths.items()
                                for k, t in enumerate(ts))
        self._rng = np.random.default_rng([seed, 2])
        self._mtbf = mtbf
        # The next draw's second (its slot not drawn yet); None: no more draws.
        self._next = None if mtbf is None else float(self._rng.exponential(mtbf))

    # -- the schedule --------------------------------------------------------------------------
    @property
    def endless(self) -> bool:
        """True if lives may keep beginning for as long as the run lasts (drawn deaths, each
        followed by a restart)."""
        return self._mtbf is not None and self._restart_after is not None

    def first_life(self, slot: int) -> int:
        """The life a slot begins with: 0 for a starting member, -1 (none yet) for a slot past
        ``initial``, whose first life (0) begins with a request."""
        return 0 if slot < self.initial else -1

    def death(self, slot: int, life: int, until: float) -> float:
        """Life ``life`` of ``slot``'s death if it comes at or before ``until``, else
        math.inf (the draws are made up to ``until``)."""
        self._draw_until(until)
        listed = self._deaths.get(slot, ())
        when = listed[life] if 0 <= life < len(listed) else math.inf
        return when if when <= until else math.inf

    def request(self, slot: int, life: int) -> float | None:
        """When life ``life`` of ``slot`` asks to join (None: it never does). Asked once the
        life before it died, whose death is then drawn."""
        if life < 0 or (life == 0 and slot < self.initial):
            return None
        listed = self._requests.get(slot, ())
        k = life - 1 if slot < self.initial else life
        if k < len(listed):
            return listed[k]
        if self._restart_after is not None and life >= 1:
            before = self._deaths.get(slot, ())
            if life - 1 < len(before):
                return before[life - 1] + self._restart_after
        return None

    def deaths_until(self, until: float) -> list[tuple[float, int, int]]:
        """Every death at or before ``until``: (seconds, slot, life), ascending."""
        self._draw_until(until)
        return self._timeline[:bisect.bisect_right(self._timeline, (until, math.inf, math.inf))]

    def later_lives(self) -> int | None:
        """How many lives begin with a request (restarts and new peers), or None if there is
        no end to them (``endless``)."""
        if self.endless:
            return None
        count = 0
        for slot in range(self.slots):
            life = self.first_life(slot) + 1
            while self.request(slot, life) is not None:
                count, life = count + 1, life + 1
        return count

    # -- the draws -----------------------------------------------------------------------------
    def _start(self, slot: int, life: int) -> float | None:
        return 0.0 if life == 0 and slot < self.initial else self.request(slot, life)

    def _draw_until(self, until: float) -> None:
        while self._next is not None and self._next <= until:
            when = self._next
            up = []
            for slot in range(self.slots):
                if slot in self._listed:
                    continue
                start = self._start(slot, len(self._deaths.get(slot, ())))
                if start is not None and start <= when:
                    up.append(slot)
            if len(up) > 2:
                slot = up[int(self._rng.integers(len(up)))]
                life = len(self._deaths.setdefault(slot, []))
                self._deaths[slot].append(when)
                bisect.insort(self._timeline, (when, slot, life))
            elif self._restart_after is None and self._later_starts(when) is None:
                self._next = None   # (two left, and nobody comes back: no more deaths)
                return
            self._next = when + float(self._rng.exponential(self._mtbf or 1.0))

    def _later_starts(self, when: float) -> float | None:
        """The first listed request after ``when`` (a joiner could make three again)."""
        later = [t for ts in self._requests.values() for t in ts if t > when]
        return min(later) if later else None
