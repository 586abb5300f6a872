"""The pairing check of a neighbour exchange: who sends to whom must pair up (j in my sources iff
I am in j's destinations), or some peer waits for data nobody sends, until its timeout.

A neighbour exchange involves only neighbours, so each peer tells every peer it names (as a
source or a destination) what it plans towards it: "I send to you", "I expect from you". To a
destination the plan rides in the header of the first data chunk (free: no extra message on a
ring); only a source this peer does not send to gets a header-only PLAN message (and a
shared-memory chunk, whose header field holds its slot, is preceded by one). Each side reads
the other's plan (the first message of its mailbox) and compares; a
pair that disagrees is a ValueError on both ends, naming both ranks. A peer named by someone its
own call does not name could never tell by itself: its I/O thread answers such a plan at once
("my call does not involve you"), see transport/activity.py, so the naming peer raises too.
Cost: a header field per data message; one tiny message per neighbour heard from but not sent
to; and a peer now waits for each destination's plan, i.e. until its destinations have begun
the call too (on directed graphs this couples a round to the out-neighbours' start).
"""
from __future__ import annotations

from collectives.algorithms.p2p import Call
from collectives.errors import OperationTimeout, PeerLost
from collectives.transport.wire import DATA, PLAN, PLAN_ANSWER, PLAN_RECEIVES, PLAN_SENDS

__all__ = ["announce", "check_pairing", "plan_bits", "pair_problems", "uninvolved", "unpaired",
           "MISSING"]

# What leaves a peer out of a partial round (push-sum's rule for lost peers) instead of
# failing it: ``missing`` (rank -> error) collects them where a caller passes one.
MISSING = (PeerLost, OperationTimeout)


def plan_bits(p: int, sources, destinations) -> int:
    """This peer's PLAN bits towards peer ``p``."""
    return (PLAN_SENDS if p in destinations else 0) | (PLAN_RECEIVES if p in sources else 0)


def announce(call: Call, peers, sources, destinations,
             missing: dict[int, Exception] | None = None) -> None:
    """Send the peers of ``peers`` that get no data from this call their header-only PLAN (the
    destinations get theirs with the data); a lost peer goes to ``missing`` if given."""
    t = call.transport
    for p in peers:
        if p not in destinations:
            try:
                t.post_plan(p, call.header(PLAN, slot=plan_bits(p, sources, destinations)))
            except MISSING as exc:
                if missing is None:
                    raise
                missing[p] = exc


def check_pairing(call: Call, peers, sources, destinations,
                  missing: dict[int, Exception] | None = None) -> list[str]:
    """Read each peer's plan and return what does not pair (an empty list when all do).
    A peer that made another call entirely is a ProtocolError naming both calls; a lost
    peer's plan for this call, which names this peer though this call leaves it out, is no
    problem (the loss is why it is left out). With
    ``missing``, a peer lost (or silent) before its plan came is recorded there instead of
    failing the call, and so is one already there."""
    t = call.transport
    r, seq, problems = t.rank, call.seq, []
    for p in peers:
        if missing is not None and p in missing:
            continue
        try:
            item = t.recv(p, call.channel, seq, deadline=call.deadline, operation=call)
        except MISSING as exc:
            if missing is None:
                raise
            missing[p] = exc
            continue
        header, _, release = item
        carried = header.kind == DATA and header.slot & PLAN_SENDS and header.offset == 0
        if carried:
            t.inbox.unget((p, call.channel, seq), item)  # the data, for recv_range
        elif release is not None:
            release()
        if not (carried or header.kind == PLAN) or header.op != call.signature or \
                header.dtype != call.dtype or header.shape != call.shape:
            raise call.mismatch(p, header, "a chunk" if header.kind != PLAN else "a plan")
        bits = header.slot
        if bits == PLAN_ANSWER:
            problems.append(uninvolved(r, p, seq, p in sources, p in destinations))
            continue
        problems += pair_problems(r, p, expects=p in sources, sends=p in destinations,
                                  p_sends=bool(bits & PLAN_SENDS),
                                  p_expects=bool(bits & PLAN_RECEIVES))
    for p in t.activity.strangers(call.channel, seq):
        if t.is_lost(p):
            # Its plan came before this peer lost it (a peer stopped past its heartbeats, whose
            # group went on: its first call after leaves the lost out and finds their plans):
            # the loss, logged and handled by the caller's policy, is the news, not a pattern.
            continue
        problems.append(f"rank {p} names rank {r} in its pattern, but rank {r}'s call at "
                        f"sequence {seq} does not involve rank {p}")
    return problems


def pair_problems(r: int, p: int, *, expects: bool, sends: bool, p_sends: bool,
                  p_expects: bool) -> list[str]:
    """What does not pair between rank ``r`` (which ``expects`` data from rank ``p`` and
    ``sends`` to it) and rank ``p`` (which ``p_sends`` to ``r`` and ``p_expects`` from it),
    worded for the error of a pattern that does not pair (``unpaired``)."""
    problems = []
    if p_sends != expects:
        problems.append(f"rank {p} plans to send to rank {r}, which does not expect it"
                        if p_sends else
                        f"rank {r} expects data from rank {p}, which does not send to it")
    if p_expects != sends:
        problems.append(f"rank {p} expects data from rank {r}, which does not send to it"
                        if p_expects else
                        f"rank {r} plans to send to rank {p}, which does not expect it")
    return problems


def uninvolved(r: int, p: int, seq: int, expects: bool, sends: bool) -> str:
    """The problem of rank ``r``, which names rank ``p`` (``expects`` data from it, ``sends``
    to it), when ``p``'s call at sequence ``seq`` does not name ``r``."""
    return (f"rank {r} {_names(expects, sends)} rank {p}, but rank {p}'s call at sequence "
            f"{seq} does not involve rank {r}")


def unpaired(call: Call, problems: list[str]) -> str:
    """The message of the ValueError of a pattern that does not pair."""
    return (f"rank {call.transport.rank}: {call.signature} at sequence {call.seq}: the send "
            f"and receive patterns do not pair: {'; '.join(problems)}")


def _names(receives: bool, sends: bool) -> str:
    if receives and sends:
        return "exchanges with"
    return "expects data from" if receives else "plans to send to"
