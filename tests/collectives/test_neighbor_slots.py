"""Small neighbour exchanges on one host through the slots of the shared-memory entry
(collectives/algorithms/shm_neighbor.py, issue #37), with real peer processes: the same bits
as the copying exchange for every form of the call, only the round's neighbours waited for (a
dead peer fails its neighbours' round, not the others'), and what does not agree an error on
the peers it concerns."""
from __future__ import annotations

import numpy as np

from gossip.testing import spawn


def _ops(peer) -> list[str]:
    """The signatures of this peer's recent calls (its flight recorder)."""
    return [line.split()[1] for line in peer.transport.recorder.describe(64).splitlines()[1:]]


def _forms(peer, seed: int) -> dict:
    """One round of each form: ring weights, push-sum's per-destination weights, out=, a
    directed pattern with self weight 0, an isolated peer."""
    n, r = peer.world_size, peer.rank
    left, right = (r - 1) % n, (r + 1) % n
    rng = np.random.default_rng([seed, r])
    got = {}
    x = rng.standard_normal(1000).astype(np.float32)
    peer.neighbor_allreduce(x, 1 / 3, {left: 1 / 3, right: 1 / 3}, [left, right])
    got["ring"] = x
    y = rng.standard_normal(700)
    peer.neighbor_allreduce(y, 1 / 3, {left: 0.25, right: 0.5}, [left, right],
                            dst_weights={left: 0.5, right: 0.25})
    got["push"] = y
    z = rng.standard_normal(512).astype(np.float32)
    out = np.empty_like(z)
    peer.neighbor_allreduce(z, 0.5, {left: 0.5}, [right], out=out)
    got["out"], got["z"] = out, z
    w = rng.standard_normal(64)
    src = {} if r == 0 else {left: 1.0} if r != 1 else {}
    dst = [] if r == 0 or r == n - 1 else [right]
    peer.neighbor_allreduce(w, 0.0 if src else 1.0, src, dst)
    got["path"] = w
    return got


def same_bits_both_ways(peer):
    copied = _forms(peer, 1)             # before any shared-memory call: copied
    assert not any("+slots" in op for op in _ops(peer))
    peer.barrier()                       # maps the arenas: from here on, the slots
    slots = _forms(peer, 1)
    assert sum("+slots" in op for op in _ops(peer)) == 4, _ops(peer)
    return {k: bool(np.array_equal(copied[k], slots[k])) for k in copied}


def test_the_slots_give_the_copying_exchange_s_bits_for_every_form():
    for r, same in enumerate(spawn(same_bits_both_ways, n=4, timeout=90)):
        assert all(same.values()), (r, same)


def dead_neighbour(peer):
    """Rank 2 is killed before a ring round: its neighbours (1 and 3) lose it, rank 0 does
    not wait for it; then 0 and 1 average, 3 alone, as the copying exchange would go on."""
    import os
    import signal
    import gossip
    n, r = peer.world_size, peer.rank
    left, right = (r - 1) % n, (r + 1) % n
    peer.barrier()
    if r == 2:
        os.kill(os.getpid(), signal.SIGKILL)
    x = np.full(256, float(r))
    try:
        peer.neighbor_allreduce(x, 1 / 3, {left: 1 / 3, right: 1 / 3}, [left, right])
        first = ("ok", float(x[0]))
    except gossip.PeerLost as exc:
        first = ("PeerLost", str(exc))
    y = np.full(256, float(r))
    pair = {0: 1, 1: 0}.get(r)
    peer.neighbor_allreduce(y, 0.5 if pair is not None else 1.0,
                            {pair: 0.5} if pair is not None else {},
                            [pair] if pair is not None else [])
    return first, float(y[0]), "+slots" in _ops(peer)[-1]


def test_a_dead_peer_fails_its_neighbours_round_only():
    results = spawn(dead_neighbour, n=4, timeout=90, peer_timeout=15, tolerate=(2,))
    assert results[2] is None
    (kind0, value0), y0, slots0 = results[0]
    assert (kind0, value0) == ("ok", (0 + 3 + 1) / 3), results[0]
    for r in (1, 3):
        kind, message = results[r][0]
        assert kind == "PeerLost" and "rank 2" in message, (r, message)
    assert [results[r][1] for r in (0, 1, 3)] == [0.5, 0.5, 3.0]
    assert all(results[r][2] for r in (0, 1, 3))


def disagree(peer, how):
    import gossip
    n, r = peer.world_size, peer.rank
    left, right = (r - 1) % n, (r + 1) % n
    peer.barrier()
    x = np.ones(256, np.float64 if how == "dtype" and r == 1 else np.float32)
    src, dst = {left: 0.5}, [right]
    if how == "pattern" and r == 1:
        src, dst = {right: 0.5}, [left]   # rank 1 turns the ring round
    try:
        peer.neighbor_allreduce(x, 0.5, src, dst)
        first = ("ok", "")
    except (gossip.ProtocolError, ValueError) as exc:
        first = (type(exc).__name__, str(exc))
    after = np.full(8, float(r))   # the group goes on
    peer.neighbor_allreduce(after, 0.5, {left: 0.5}, [right])
    return first, float(after[0])


def test_what_does_not_agree_is_an_error_on_the_peers_it_concerns():
    results = spawn(disagree, n=4, timeout=90, args=("pattern",))
    for r in (0, 1, 2):   # rank 1 and its neighbours
        kind, message = results[r][0]
        assert kind == "ValueError" and "do not pair" in message, (r, message)
        assert "+slots" in message and f"rank {r}" in message, message
    assert [after for _, after in results] == [(r + (r - 1) % 4) / 2 for r in range(4)]
    results = spawn(disagree, n=4, timeout=90, args=("dtype",))
    for r in (0, 1, 2):
        kind, message = results[r][0]
        assert kind == "ProtocolError" and "float64" in message, (r, message)
