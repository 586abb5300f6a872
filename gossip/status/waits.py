"""Who waits on whom in a running job, and who the straggler is, from the members' status
answers (gossip/status/reporter.py): pure functions over plain dicts, so ``gossip status``,
its ``--json`` and the tests read the same result.

A member waits on a peer when one of its running calls names that peer and the peer has not
begun the call yet (its highest begun sequence on the call's channel is lower): the peer is
behind. A peer that has begun it and still has not answered is in the call too, waiting on
someone else; following the edges from any waiting member ends at the *root*: a member that
waits on no one, so is in its own code (the member's ``where`` says where: the innermost
frame of the user's code in its main thread) or is gone.

The straggler is the rank the others have spent most time waiting on, summed over the
members' flight recorders (``waited``: seconds per rank).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

__all__ = ["Wait", "WaitGraph", "waits_for", "straggler"]


@dataclass(frozen=True)
class Wait:
    """``rank`` waits in ``op`` (sequence ``seq`` on ``channel``, for ``seconds`` so far) on
    ``on``, which ``reason``: "not begun" (it is behind) or "no answer" (gone or silent)."""
    rank: int
    on: int
    op: str
    channel: int
    seq: int
    seconds: float
    reason: str


@dataclass
class WaitGraph:
    """The waits found (edges) and the roots they lead to: rank -> what it is doing."""
    edges: list[Wait] = field(default_factory=list)
    roots: dict[int, str] = field(default_factory=dict)

    def as_dict(self) -> dict[str, Any]:
        """Plain data (for --json)."""
        return {"edges": [vars(w) for w in self.edges],
                "roots": {str(r): what for r, what in self.roots.items()}}


def waits_for(members: dict[int, dict[str, Any] | None]) -> WaitGraph:
    """The waits-for graph of ``members`` (rank -> its status answer, None: no answer)."""
    graph = WaitGraph()
    waiting: dict[int, set[int]] = {}
    for rank, status in sorted(members.items()):
        if not status:
            continue
        for call in status.get("running", []):
            for peer in call.get("peers", []):
                theirs = members.get(peer)
                if theirs is None:
                    reason = "no answer"
                else:
                    begun = theirs.get("begun", {}).get(str(call["channel"]), -1)
                    if begun >= call["seq"]:
                        continue   # it is in the call (or past it): not what holds this one
                    reason = "not begun"
                graph.edges.append(Wait(rank, int(peer), str(call["op"]),
                                        int(call["channel"]), int(call["seq"]),
                                        float(call.get("waited", 0.0)), reason))
                waiting.setdefault(rank, set()).add(int(peer))
    for start in waiting:
        for root in _roots(start, waiting):
            status = members.get(root)
            if status is None:
                graph.roots[root] = "no answer (gone, or its door too busy to answer)"
            elif status.get("running"):
                calls = ", ".join(c["op"] for c in status["running"])
                graph.roots[root] = f"in {calls}, waiting on no member behind it"
            else:
                graph.roots[root] = ("in its own code: " + str(status.get("where") or
                                     "(no frame of the user's code in its main thread)"))
    return graph


def _roots(start: int, waiting: dict[int, set[int]]) -> set[int]:
    """The ranks that the waits from ``start`` end at (cycles end at their entry)."""
    roots, seen, todo = set(), {start}, [start]
    while todo:
        rank = todo.pop()
        for peer in waiting.get(rank, ()):
            if peer in seen:
                continue
            seen.add(peer)
            if peer in waiting:
                todo.append(peer)
            else:
                roots.add(peer)
    return roots


def straggler(members: dict[int, dict[str, Any] | None],
              graph: WaitGraph | None = None) -> dict[str, Any] | None:
    """The rank the other members spent most time waiting on: ``{"rank", "seconds" (the
    others' waits on it, ended ones and, with ``graph``, those going on now), "share" (of
    all their waiting), "next_seconds" (the next rank's), "by_rank"}``; None when nobody
    waited."""
    totals: dict[int, float] = {}
    for rank, status in members.items():
        for peer, seconds in (status or {}).get("waited", {}).items():
            if int(peer) != rank:
                totals[int(peer)] = totals.get(int(peer), 0.0) + float(seconds)
    for wait in graph.edges if graph is not None else ():
        totals[wait.on] = totals.get(wait.on, 0.0) + wait.seconds
    total = sum(totals.values())
    if total <= 0:
        return None
    ranked = sorted(totals.items(), key=lambda kv: -kv[1])
    rank, seconds = ranked[0]
    return {"rank": rank, "seconds": seconds, "share": seconds / total,
            "next_seconds": ranked[1][1] if len(ranked) > 1 else 0.0,
            "by_rank": {str(r): s for r, s in ranked}}
