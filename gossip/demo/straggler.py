"""`gossip demo --straggler RANK@FACTOR`: one peer takes FACTOR times as long per step as it
would (it sleeps FACTOR - 1 times each step's own duration after it), as a slower or busier
node of a real cluster would. Sleeping leaves the CPU to the others, so the rest of the group
runs at its own pace: synchronous policies wait for the straggler at every step, asynchronous
ones do not (AD-PSGD's claim).

    straggler = Straggler.parse("3@4")   # peer 3, four times slower
    straggler.delay(step_seconds)        # seconds to sleep after a step that took step_seconds
"""
from __future__ import annotations

import math
from dataclasses import dataclass

from gossip.demo.rank_at import check_rank, parse_rank_at

__all__ = ["Straggler"]


@dataclass(frozen=True)
class Straggler:
    """Which peer is slow, and how much."""

    rank: int        # the slot (launch rank) of the slow peer
    factor: float    # its steps take this many times as long; > 1

    @classmethod
    def parse(cls, text: str) -> "Straggler":
        """``RANK@FACTOR`` (``3@4``); ValueError (one line) for anything else."""
        return cls(*parse_rank_at(text, "--straggler", "RANK@FACTOR", "3@4",
                                  "peer 3 takes four times as long per step"))

    def check(self, peers: int) -> None:
        """ValueError (one line) unless the rank is one of ``peers`` and the factor above 1."""
        check_rank("--straggler", self, self.rank, peers)
        if not (math.isfinite(self.factor) and 1 < self.factor <= 100):
            raise ValueError(f"--straggler {self}: the factor must be above 1 and at most "
                             f"100, got {self.factor:g}")

    def delay(self, step_seconds: float) -> float:
        """Seconds to sleep after a step that took ``step_seconds``."""
        return (self.factor - 1) * max(0.0, step_seconds)

    def __str__(self) -> str:
        return f"{self.rank}@{self.factor:g}"
