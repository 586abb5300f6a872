"""How far ahead of its own step a coordinator proposes the boundary a change takes effect at.

Every member must hear the prepare before it passes that boundary; one that passes it first
says it is late and the coordinator proposes a later one (twice the margin each time), which
costs the joiner one more walk. Too wide a margin costs every change its steps: at 256 MiB of
parameters a synchronous step is an allreduce of about 0.3 s here, and a margin of 4 steps
kept a joiner 1.2 s at the door. So the margin is counted from what it must cover:

- the members' spread: how many steps a member can be ahead of the coordinator (one for a
  policy that averages every step, its period for local SGD; unknown: the view's size);
- the steps they take while the prepare travels (``PREPARE_TRAVEL``, 20 ms, over the median
  of the coordinator's recent step times; before it has timed any, the old fixed margin).
"""
from __future__ import annotations

import collections
import math
import statistics
import time
from typing import Callable

__all__ = ["BoundaryMargin", "PREPARE_TRAVEL"]

#: The time allowed for a prepare to reach every member (one small door message each; on a
#: loaded 2-core machine a few milliseconds, so this is ample).
PREPARE_TRAVEL = 0.02
_FIXED = 4            # without step times: the margin before this module
_MOST = 100_000       # steps of microseconds: still a bounded boundary


class BoundaryMargin:
    """One process's margin. ``passing(step)`` at every boundary; ``steps()`` is the margin.
    ``drift()`` (the process's: changes.MemberProcess.max_drift): the most steps a member may
    be ahead of another, None when unknown; ``members``: the view's size (the spread bound
    then)."""

    def __init__(self, drift: Callable[[], int | None] | None = None) -> None:
        self.drift: Callable[[], int | None] = drift or (lambda: None)
        self.members = 1
        self._last_step = -1
        self._times: collections.deque = collections.deque(maxlen=9)

    def passing(self, step: int, now: float | None = None) -> None:
        if step != self._last_step:
            self._last_step = step
            self._times.append(time.monotonic() if now is None else now)

    def step_seconds(self) -> float | None:
        """The median of the recent step times (None before two boundaries)."""
        t = list(self._times)
        if len(t) < 2:
            return None
        return statistics.median(b - a for a, b in zip(t, t[1:]))

    def steps(self) -> int:
        drift = self.drift()
        spread = self.members + 1 if drift is None else max(1, int(drift))
        seconds = self.step_seconds()
        if seconds is None:
            return max(_FIXED, spread)
        # (less a hair: 20 ms over 1 ms steps timed as 0.99999 ms is 20 steps, not 21)
        travel = math.ceil(PREPARE_TRAVEL / max(seconds, PREPARE_TRAVEL / _MOST) - 1e-6)
        return min(_MOST, spread + max(1, travel))
