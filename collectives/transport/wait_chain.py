"""Who is actually missing when a wait times out: follow the chain of waiting peers.

A peer that waited in vain for rank s asks s (a STATUS question, answered by s's I/O thread, so
a peer busy in Python or idle between calls answers too) what it is doing about the same
operation. If s is inside it and waiting on rank q, the question goes on to q, and so on, to the
first rank that is not inside this operation: it never started it (idle since an earlier one,
or still inside one), or it is inside another call at this sequence (the peers made different
calls), or it does not answer. That rank is the one to name; the ranks between were waiting
themselves. A chain that comes back to this peer is a deadlock of mismatched calls.
"""
from __future__ import annotations

import time
from typing import NamedTuple

from collectives import defaults
from collectives.transport.activity import BUSY, FINISHED, IDLE, same_call

__all__ = ["Verdict", "find_missing"]


class Verdict(NamedTuple):
    """The rank to name, why (a phrase: "rank 3 has not started ..."), the ranks waited on
    on the way to it, and whether the calls differ (a ProtocolError rather than a timeout)."""
    rank: int
    reason: str
    chain: tuple[int, ...]
    mismatch: bool


def find_missing(transport, src: int, channel: int, seq: int, signature: str,
                 wait: float = defaults.STATUS_WAIT) -> Verdict | None:
    """The verdict for a wait on ``src`` in operation ``(channel, seq)`` of ``signature`` that
    timed out; None when ``src`` itself is the one to name as it is (it is inside this very
    operation and waits on nobody: still computing or sending)."""
    deadline = time.monotonic() + wait
    me, rank, chain = transport.rank, src, []
    what = f"{signature} at sequence {seq}"
    while True:
        chain.append(rank)
        status = transport.ask_status(rank, channel, seq, deadline)
        if status is None:
            gone = transport.is_lost(rank)
            return Verdict(rank, f"rank {rank} does not answer" + (
                " (it closed or was lost)" if gone else
                f" (a status question went unanswered for {wait:g}s)"), tuple(chain[:-1]),
                False)
        state, current, theirs, waiting_on = status
        if state == IDLE:
            since = f" (it is idle since {theirs} at sequence {current})" if current >= 0 \
                else " (it has made no call yet)"
            return Verdict(rank, f"rank {rank} has not started {what}{since}",
                           tuple(chain[:-1]), False)
        if state == BUSY:
            on = f", waiting on rank {waiting_on}" if waiting_on >= 0 else ""
            return Verdict(rank, f"rank {rank} has not started {what} (it is still inside "
                                 f"{theirs} at sequence {current}{on})", tuple(chain[:-1]),
                           False)
        if theirs and not same_call(theirs, signature):
            return Verdict(rank, f"rank {rank} called {theirs} at sequence {seq} where rank "
                                 f"{me} called {signature}: the peers made different calls",
                           tuple(chain[:-1]), True)
        if waiting_on < 0:
            if rank == src:
                return None
            done = "finished" if state == FINISHED else "is inside"
            return Verdict(rank, f"rank {rank} {done} {what} and waits on nobody",
                           tuple(chain[:-1]), False)
        if waiting_on == me or waiting_on in chain:
            return Verdict(rank, f"rank {rank} is inside {what} waiting on rank {waiting_on}, "
                                 f"which waits on it: the calls' patterns cannot meet",
                           tuple(chain[:-1]), True)
        # INSIDE, or FINISHED by failing (a failed operation keeps the rank it waited on).
        rank = waiting_on
        if len(chain) >= transport.world_size:
            return Verdict(rank, f"rank {rank} is where the chain of waits ends",
                           tuple(chain), False)

