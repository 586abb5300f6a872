"""What a wait that failed raises, worded with what the transport knows: the rank, its
address, the operation, and for a timeout the rank that is actually missing.

Who is missing when a wait times out: follow the chain of waiting peers.

A peer that waited in vain for rank s asks s (a STATUS question, answered by s's I/O thread, so
a peer busy in Python or idle between calls answers too) what it is doing about the same
operation. If s is inside it and waiting on rank q, the question goes on to q, and so on, to the
first rank that is not inside this operation: it never started it (idle since an earlier one,
or still inside one), or it is inside another call at this sequence (the peers made different
calls), or it does not answer. That rank is the one to name; the ranks between were waiting
themselves. A chain that comes back to this peer is a deadlock of mismatched calls.
"""
from __future__ import annotations

import logging
import time
from typing import Any, NamedTuple

from collectives import defaults
from collectives.errors import (AuthenticationError, OperationTimeout, PeerLost, ProtocolError,
                                ViewChanging)
from collectives.transport.activity import BUSY, FINISHED, IDLE, same_call
from collectives.transport.inbox import Lost, MailboxError
from collectives.transport.wire import send_tag

__all__ = ["Verdict", "find_missing", "wait_error", "describe_wait"]

# How long a long wait's notice asks along the chain of waits (it is said while the wait goes
# on: a peer that does not answer is named as such, the wait does not stop for it).
_NOTICE_STATUS_WAIT = 1.0

log = logging.getLogger("collectives")


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


def describe_wait(t, src: int, operation: Any, channel: int, seq: int,
                  waiting: str | None = None) -> str:
    """A wait on mailbox ``(src, channel, seq)`` of transport ``t`` that lasts, as its notice
    words it (notices.LongWait): the operation, the rank waited on and its address (or
    ``waiting``, what the wait says it does), and for a collective call, the rank it comes
    down to (find_missing: "rank 3 has not started ...")."""
    waiting = waiting or f"waiting on rank {src} at {t.address(src)}"
    text = f"rank {t.rank}: {operation}: {waiting}"
    signature = getattr(operation, "signature", None)
    if signature is not None and send_tag(signature) is None and not t.closed:
        verdict = find_missing(t, src, channel, seq, signature, wait=_NOTICE_STATUS_WAIT)
        if verdict is not None:
            waits = "".join(f", which waits on rank {r}" for r in verdict.chain[1:])
            text += f"{waits}: {verdict.reason}"
    return text


def wait_error(t, item, src: int, operation: Any, channel: int, seq: int) -> Exception:
    """The error of a wait on mailbox ``(src, channel, seq)`` of transport ``t`` that ended
    with ``item``: a MailboxError (an ABORT, a mismatch), a Lost source, or None (deadline)."""
    # A collective's Call has a signature: its peers can be asked where they are.
    signature = getattr(operation, "signature", None)
    operation = str(operation)  # a string, or an object worded only now (a p2p Call)
    me = t.rank
    where = f"rank {me}: {operation}: rank {src} at {t.address(src)}"
    if isinstance(item, MailboxError):
        if item.local:
            return ProtocolError(f"rank {me}: {item.message}")
        if item.view_change:
            return ViewChanging(f"rank {me}: {operation}: {item.message}", operation=operation)
        if item.late_rank is not None:
            late = item.late_rank
            return OperationTimeout(f"rank {me}: {operation}: rank {late} is missing (found by "
                                    f"rank {src}): {item.message}", rank=late,
                                    address=t.address(late), operation=operation)
        if item.lost_rank is not None:
            # Lead with the rank that was lost; the peer that relayed the news comes second.
            lost = item.lost_rank
            return PeerLost(f"rank {me}: {operation}: lost rank {lost} at {t.address(lost)} "
                            f"(reported by rank {src}): {item.message}", rank=lost,
                            address=t.address(lost), operation=operation)
        return ProtocolError(f"{where}: {item.message}")
    if isinstance(item, Lost):
        if item.kind == "auth":
            return AuthenticationError(f"{where}: {item.reason}")
        if item.cause is not None:
            # src left because its own operation lost ``cause``: that is the rank to name.
            lost = item.cause
            return PeerLost(f"rank {me}: {operation}: lost rank {lost} at {t.address(lost)} "
                            f"(reported by rank {src} at {t.address(src)}: {item.reason})",
                            rank=lost, address=t.address(lost), operation=operation)
        return PeerLost(f"{where}: {item.reason}", rank=src, address=t.address(src),
                        operation=operation)
    # Deadline passed: a peer we never reached (for as long as a silent peer is given) is
    # lost; one that answers heartbeats is merely late (still computing, or it never made
    # the matching call): ask along the chain of waits who is missing.
    log.debug("rank %d: %s: timed out waiting on rank %d (channel %d, sequence %d)", me,
              operation, src, channel, seq)
    if not t.reached(src) and not t.connecting(src):
        return PeerLost(f"{where}: never reachable within the timeout", rank=src,
                        address=t.address(src), operation=operation)
    verdict = None
    if signature is not None and send_tag(signature) is None and not t.closed:
        verdict = find_missing(t, src, channel, seq, signature)
        # While this peer asked, the peer it waited on may have timed out too and told it
        # whom it found missing (an ABORT naming the late rank): that answer is the better.
        key = (src, channel, seq)
        late = t.inbox.take(key)
        if isinstance(late, MailboxError):
            return wait_error(t, late, src, operation, channel, seq)
        if type(late) is tuple:
            t.inbox.unget(key, late)  # data after all: the mailbox's retirement frees it
    if verdict is not None:
        # Name the rank that is missing, not the neighbour that was waiting on it too.
        waits = "".join(f", which waited on rank {r}" for r in verdict.chain[1:])
        message = (f"rank {me}: {operation}: {verdict.reason}; this peer waited on rank "
                   f"{src}{waits}; rank {verdict.rank} is at {t.address(verdict.rank)}")
        if verdict.mismatch:
            return ProtocolError(message)
        return OperationTimeout(message, rank=verdict.rank, address=t.address(verdict.rank),
                                operation=operation)
    return OperationTimeout(f"{where}: alive but sent nothing for this operation within the "
                            "timeout (is it still computing, or did it make a different "
                            "call?)", rank=src, address=t.address(src), operation=operation)
