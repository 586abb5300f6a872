"""`gossip demo` with a faulty peer, for tests/demo/test_demo.py: the demo's own command line, in
which one rank trains with a faulty variant of the optimizer that kills its process
(os._exit, as abrupt as a SIGKILL, with an exit code the test can recognise) right after a
given training step.

    python tests/demo/workers/faulty_demo.py RANK STEP [gossip demo options ...]

The peers are spawned processes: they import this file as their main module, so the faulty
peer function below reaches them by reference (gossip.testing.spawn pickles it).
"""
from __future__ import annotations

import functools
import os
import sys
from typing import Any, Callable

import gossip
import gossip.demo.runner
from gossip.cli import main
from gossip.demo.train import run_peer

__all__ = ["EXIT_CODE", "CrashingOptimizer", "faulty_run_peer"]

EXIT_CODE = 3  # what the dying peer exits with; the demo's error line quotes it


class CrashingOptimizer(gossip.DistributedOptimizer):
    """A DistributedOptimizer whose process dies right after its ``crash_at``-th step."""

    def __init__(self, *args: Any, crash_at: int, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._crash_at = crash_at
        self._steps = 0

    def step(self, closure: Callable[[], Any] | None = None) -> Any:
        result = super().step(closure)
        self._steps += 1
        if self._steps == self._crash_at:
            os._exit(EXIT_CODE)
        return result


def faulty_run_peer(crash_rank: int, crash_step: int, peer: Any, *args: Any) -> dict:
    """The demo's run_peer; on ``crash_rank`` the policies train with CrashingOptimizer."""
    if peer.rank == crash_rank:
        # The demo builds its optimizer as gossip.DistributedOptimizer: in this process only.
        gossip.DistributedOptimizer = functools.partial(CrashingOptimizer, crash_at=crash_step)
    return run_peer(peer, *args)


if __name__ == "__main__":
    rank, step, *demo_args = sys.argv[1:]
    gossip.demo.runner.run_peer = functools.partial(faulty_run_peer, int(rank), int(step))
    sys.exit(main(["demo", *demo_args]))
