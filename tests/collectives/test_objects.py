"""Plain Python values through a peer (gossip.objects): Horovod's broadcast_object and
allgather_object cases, over real peers, and what is refused (on every peer, never pickled)."""
from __future__ import annotations

import numpy as np

from gossip.testing import spawn


def objects(peer):
    r = peer.rank
    # Horovod's test_broadcast_object: the root's dict, int keys and all, everywhere.
    want = {"hello": 123, 0: [1, 2], "nested": {"lr": 0.1, "b": b"\x00\x01", "none": None}}
    got = peer.broadcast_object(want if r == 1 else {}, root=1)
    same = got == want and (got is want) == (r == 1)
    gathered = peer.allgather_object({"rank": r, "host": f"h{r % 2}", "t": (r, "x")})
    refused = []
    try:   # not plain values: refused on every peer, naming root
        peer.broadcast_object(np.arange(3) if r == 0 else None, root=0)
    except TypeError as exc:
        refused.append(str(exc))
    try:   # one peer's value only: every peer hears of it
        peer.allgather_object(object() if r == 2 else r)
    except TypeError as exc:
        refused.append(str(exc))
    try:
        peer.broadcast_object(1, root=peer.world_size)
    except ValueError as exc:
        refused.append(str(exc))
    after = peer.broadcast_object("still in step", root=2)
    return same, gathered, refused, after


def test_plain_values_travel_from_one_peer_and_from_every_peer():
    n = 3
    for r, (same, gathered, refused, after) in enumerate(spawn(objects, n=n, timeout=60)):
        assert same
        # tuples come back as lists from the others; this peer's own as it gave it
        assert gathered == [{"rank": j, "host": f"h{j % 2}",
                             "t": (j, "x") if j == r else [j, "x"]} for j in range(n)]
        assert len(refused) == 3, refused
        assert f"rank {r}: broadcast_object: the value of rank 0 cannot travel" in refused[0]
        assert "ndarray" in refused[0] and "never pickled" in refused[0]
        assert f"rank {r}: allgather_object: the value of rank(s) [2] cannot travel" \
            in refused[1]
        assert f"rank {r}: broadcast_object: root must be a rank in [0, {n})" in refused[2]
        assert after == "still in step"


def alone(peer):
    kept = peer.broadcast_object({"a": 1})
    try:
        peer.allgather_object({1, 2})
        return kept, None
    except TypeError as exc:
        return kept, str(exc)


def test_a_world_of_one_refuses_the_same_values():
    (kept, refused), = spawn(alone, n=1, timeout=60)
    assert kept == {"a": 1}
    assert refused is not None and "rank 0: allgather_object" in refused and "set" in refused
