"""The re-shard plan of a view change, for the sharded EASGD centre (easgd.py's module
docstring has the rule): for each segment of the old view, the new rank of the member that
provides it. A pure value, the same on every member that computes it."""
from __future__ import annotations

from typing import Any

from collectives.group import View
from gossip.errors import ProtocolError

__all__ = ["reshard_plan", "check_plan"]


def reshard_plan(layout: tuple, view: View, handoffs: list, backups: bool) -> dict:
    """The plan of a switch (see the module docstring): ``layout`` the old members as
    (name, incarnation) in old rank order, ``view`` the new View, ``handoffs`` the commit's
    (new rank of the receiver, old rank of the leaver) pairs, ``backups`` whether every
    owner's next rank holds a replica of its shard. Returns {"n": old size, "providers": the
    new rank providing each old segment or -1, "keepers": new ranks of the old members that
    go on}: the same on every member that computes it."""
    moved = {}
    for r, (name, incarnation) in enumerate(layout):
        j = view.rank_of(name)
        if j is not None and view.member(j).incarnation == incarnation:
            moved[r] = j
    handed = {old: new for new, old in handoffs}
    n = len(layout)
    providers = []
    for s in range(n):
        if s in moved:
            providers.append(moved[s])
        elif s in handed:
            providers.append(handed[s])
        elif backups and n > 1 and (s + 1) % n in moved:
            providers.append(moved[(s + 1) % n])
        else:
            providers.append(-1)
    return {"n": n, "providers": providers, "keepers": sorted(moved.values())}


def check_plan(plan: Any, size: int, who: str) -> dict:
    """``plan`` as it came in a source's state: ProtocolError naming ``who`` unless it is one
    reshard_plan could have made for a view of ``size`` members."""
    ok = isinstance(plan, dict) and type(plan.get("n")) is int and plan["n"] >= 1
    providers, keepers = (plan.get("providers"), plan.get("keepers")) if ok else (None, None)
    if not (ok and isinstance(providers, list) and len(providers) == plan["n"]
            and all(type(p) is int and -1 <= p < size for p in providers)
            and isinstance(keepers, list) and all(type(k) is int and 0 <= k < size
                                                  for k in keepers)):
        raise ProtocolError(f"{who}: the sharded centre's re-shard plan in the source's state "
                            f"is malformed: {plan!r:.200}")
    return {"n": plan["n"], "providers": list(providers), "keepers": list(keepers)}
