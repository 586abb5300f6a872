"""`gossip demo --kill RANK@FRACTION`: one peer SIGKILLs itself after FRACTION of its training
steps, and the demo starts it again (gossip.launch.supervisor's ``restarts``) as the same slot with
the next GOSSIP_INCARNATION, so the new process rejoins the running job and trains the rest
(gossip/membership/). What the kill costs is then in the demo's table, beside the run
without it.

    kill = Kill.parse("2@0.33")       # peer 2, after a third of its steps
    kill.step(total=440)              # 145: the step after which it dies

This is the demo's own scenario, a documented option, not a fault hook of the runtime: the
peer kills its own process (os.kill with SIGKILL, nothing is cleaned up), and only the first
process of the slot does, so the restarted one trains to the end.
"""
from __future__ import annotations

import os
import signal
from dataclasses import dataclass
from typing import NoReturn

from gossip.demo.rank_at import check_rank, parse_rank_at

__all__ = ["Kill", "die"]


@dataclass(frozen=True)
class Kill:
    """Which peer dies, and when."""

    rank: int          # the slot (launch rank) of the peer that dies
    fraction: float    # of its training steps done when it dies, in (0, 1)

    @classmethod
    def parse(cls, text: str) -> "Kill":
        """``RANK@FRACTION`` (``2@0.33``); ValueError (one line) for anything else."""
        return cls(*parse_rank_at(text, "--kill", "RANK@FRACTION", "2@0.33",
                                  "peer 2 dies after a third of its training steps"))

    def check(self, peers: int) -> None:
        """ValueError (one line) unless the rank is one of ``peers`` and the fraction inside
        the run."""
        check_rank("--kill", self, self.rank, peers)
        if not 0 < self.fraction < 1:
            raise ValueError(f"--kill {self}: the fraction must be between 0 and 1 "
                             f"(exclusive), got {self.fraction:g}")

    def step(self, total: int) -> int:
        """The step count after which the peer dies, of ``total``: at least one step done,
        at least one left."""
        return max(1, min(total - 1, round(self.fraction * total)))

    def __str__(self) -> str:
        return f"{self.rank}@{self.fraction:g}"


def die() -> NoReturn:
    """SIGKILL this process: no exception, no clean-up, no goodbye to the other peers."""
    os.kill(os.getpid(), signal.SIGKILL)
    # The kernel ends the process on its way back from kill(): this line never runs.
    raise RuntimeError("SIGKILL did not end the process")
