"""Plain adjacency helpers: neighbour lists and connectivity, without numpy or networkx.

An adjacency is a sequence of `out` sets: `out[j]` holds the ranks that rank j sends to.
An undirected graph stores every edge in both directions.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable, Sequence

__all__ = [
    "Adjacency",
    "freeze",
    "reverse",
    "union",
    "components",
    "unreachable",
    "connectivity_problem",
]

# Sorted, immutable neighbour lists, one per rank; the form every topology caches.
Adjacency = tuple[tuple[int, ...], ...]


def freeze(out: Sequence[Iterable[int]]) -> Adjacency:
    """Sorted tuples of neighbours, so cached lists can be shared without being corrupted."""
    return tuple(tuple(sorted(set(neigh))) for neigh in out)


def reverse(out: Adjacency) -> Adjacency:
    """The in-neighbour lists of the graph whose out-neighbour lists are `out`."""
    incoming: list[list[int]] = [[] for _ in out]
    for sender, receivers in enumerate(out):
        for receiver in receivers:
            incoming[receiver].append(sender)
    # Senders are visited in increasing order, so each list is already sorted.
    return tuple(tuple(lst) for lst in incoming)


def union(adjacencies: Iterable[Adjacency]) -> Adjacency:
    """Edge-wise union, e.g. of a time-varying graph over one period."""
    adjacencies = list(adjacencies)
    n = len(adjacencies[0])
    return freeze([set().union(*(adj[i] for adj in adjacencies)) for i in range(n)])


def _reach(adj: Adjacency, start: int) -> list[bool]:
    seen = [False] * len(adj)
    seen[start] = True
    queue = deque([start])
    while queue:
        node = queue.popleft()
        for nxt in adj[node]:
            if not seen[nxt]:
                seen[nxt] = True
                queue.append(nxt)
    return seen


def components(adj: Adjacency) -> list[list[int]]:
    """Connected components of an undirected adjacency, each sorted, ordered by first node."""
    label = [-1] * len(adj)
    result: list[list[int]] = []
    for start in range(len(adj)):
        if label[start] >= 0:
            continue
        seen = _reach(adj, start)
        comp = [i for i, s in enumerate(seen) if s]
        for i in comp:
            label[i] = len(result)
        result.append(comp)
    return result


def unreachable(out: Adjacency) -> tuple[int, int] | None:
    """For a directed graph: a pair (a, b) such that b cannot be reached from a, or None.

    A graph is strongly connected iff every node is reachable from node 0 and node 0 is
    reachable from every node, so two breadth-first searches decide it.
    """
    if not out:
        return None
    forward = _reach(out, 0)
    for node, ok in enumerate(forward):
        if not ok:
            return 0, node
    backward = _reach(reverse(out), 0)
    for node, ok in enumerate(backward):
        if not ok:
            return node, 0
    return None


def _show(comp: list[int], limit: int = 8) -> str:
    if len(comp) <= limit:
        return "{" + ", ".join(map(str, comp)) + "}"
    return "{" + ", ".join(map(str, comp[:limit])) + f", ... ({len(comp)} nodes)" + "}"


def connectivity_problem(out: Adjacency, *, directed: bool) -> str | None:
    """None if the graph is (strongly) connected, else a sentence naming what is cut off."""
    if directed:
        pair = unreachable(out)
        if pair is None:
            return None
        a, b = pair
        return (
            f"the directed graph is not strongly connected: node {b} cannot be reached "
            f"from node {a}"
        )
    comps = components(out)
    if len(comps) <= 1:
        return None
    shown = ", ".join(_show(c) for c in comps[:4])
    more = f" and {len(comps) - 4} more" if len(comps) > 4 else ""
    return f"the graph is disconnected: it has {len(comps)} components {shown}{more}"
