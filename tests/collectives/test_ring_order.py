"""The ring ordered by measured bandwidth (issue #37): which order best_ring picks from a rate
matrix (collectives/algorithms/ring_order.py), the peers' own measurement of their links
(Communicator.measure_links, collectives/operations/link_rates.py), the allreduce going round
the ring in the order use_ring / order_ring set, and, across network-namespace hosts whose
links differ (tests/netfault.py), a ring that leaves the slow links out."""
from __future__ import annotations

import hashlib
import itertools
import json
import os
import random
import sys

import numpy as np
import pytest

from collectives.algorithms.hierarchical import host_groups
from collectives.algorithms.ring_order import best_ring, ring_bottleneck, ring_key
from collectives.errors import ProtocolError
from collectives.operations.link_rates import pairing_rounds
from gossip.testing import spawn

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))   # tests/
import netfault  # noqa: E402

WORKER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "workers",
                      "ring_order_worker.py")
FAST, SLOW = 1e9 / 8, 1e8 / 8


def matrix(n: int, rate: float = FAST, slow: dict | None = None) -> list[list[float]]:
    rates = [[0.0 if i == j else rate for j in range(n)] for i in range(n)]
    for (i, j), v in (slow or {}).items():
        rates[i][j] = v
    return rates


def links(ring: list[int]) -> set[tuple[int, int]]:
    return {(ring[k], ring[(k + 1) % len(ring)]) for k in range(len(ring))}


# ---------------------------------------------------------------------- best_ring, pure
def test_equal_links_keep_the_rank_order_and_so_does_noise_within_the_margin():
    assert best_ring(matrix(6)) == list(range(6))
    rng = random.Random(3)
    noisy = [[0.0 if i == j else FAST * (1 + 0.08 * rng.random()) for j in range(6)]
             for i in range(6)]
    assert best_ring(noisy) == list(range(6))            # at most 8% apart: not worth it
    assert best_ring(noisy, margin=0.0) != list(range(6))  # without a margin it moves


def test_two_slow_pairs_are_left_out_of_the_ring():
    slow = {(0, 1): SLOW, (1, 0): SLOW, (2, 3): SLOW, (3, 2): SLOW}
    rates = matrix(4, slow=slow)
    ring = best_ring(rates)
    assert ring[0] == 0 and sorted(ring) == [0, 1, 2, 3]
    assert not links(ring) & set(slow), ring
    assert ring_bottleneck(rates, ring) == FAST
    assert ring_bottleneck(rates, [0, 1, 2, 3]) == SLOW


def test_one_slow_direction_is_avoided_by_going_round_the_other_way():
    slow = {(0, 1): SLOW, (1, 2): SLOW, (2, 3): SLOW}
    rates = matrix(4, slow=slow)
    ring = best_ring(rates)
    assert not links(ring) & set(slow), ring   # such as 0->3->2->1->0, the rank order reversed
    assert ring_bottleneck(rates, ring) == FAST
    assert ring_bottleneck(rates, [0, 3, 2, 1]) == FAST


@pytest.mark.parametrize("n", [4, 5, 6, 7])
def test_the_exact_search_finds_the_best_bottleneck_of_every_ring(n):
    rng = random.Random(n)
    for _ in range(3):
        rates = [[0.0 if i == j else rng.choice([1.0, 2.0, 5.0, 10.0, 11.0]) * 1e6
                  for j in range(n)] for i in range(n)]
        best = max(ring_bottleneck(rates, [0, *rest])
                   for rest in itertools.permutations(range(1, n)))
        ring = best_ring(rates, margin=0.0)
        assert ring[0] == 0 and sorted(ring) == list(range(n))
        assert ring_bottleneck(rates, ring) == best
        assert ring_key(rates, ring) >= ring_key(rates, list(range(n)))


def test_many_peers_a_planted_fast_ring_is_found():
    n = 40
    rng = random.Random(7)
    order = list(range(n))
    rng.shuffle(order)
    rates = [[0.0 if i == j else SLOW * (1 + rng.random()) for j in range(n)] for i in range(n)]
    for k in range(n):
        rates[order[k]][order[(k + 1) % n]] = FAST
    ring = best_ring(rates)
    assert ring[0] == 0 and sorted(ring) == list(range(n))
    assert ring_bottleneck(rates, ring) == FAST


def test_a_bad_matrix_or_margin_is_refused():
    with pytest.raises(ValueError, match="square"):
        best_ring([[0.0, 1.0], [1.0]])
    with pytest.raises(ValueError, match="margin"):
        best_ring(matrix(3), margin=-0.5)
    assert best_ring([[0.0]]) == [0] and best_ring(matrix(2)) == [0, 1]


@pytest.mark.parametrize("n", range(1, 10))
def test_the_rounds_meet_every_pair_once_and_no_peer_twice_a_round(n):
    rounds = pairing_rounds(n)
    seen = [pair for pairs in rounds for pair in pairs]
    assert sorted(seen) == sorted(itertools.combinations(range(n), 2))
    for pairs in rounds:
        peers = [p for pair in pairs for p in pair]
        assert len(peers) == len(set(peers))
    assert len(rounds) == (n - 1 if n % 2 == 0 else n) or n == 1


# ---------------------------------------------------------------------- peers on one host
def measured_and_ordered(peer):
    comm = peer.communicator
    rates = comm.measure_links(64 << 10, repeats=1)
    n, r = peer.world_size, peer.rank
    order = [0, *reversed(range(1, n))]   # not the rank order
    comm.use_ring(order)
    x = np.random.default_rng(r).integers(-1000, 1000, 300_007).astype(np.int64)
    want = sum(np.random.default_rng(j).integers(-1000, 1000, 300_007).astype(np.int64)
               for j in range(n))
    peer.allreduce(x, algorithm="ring")
    f = np.random.default_rng(100 + r).standard_normal(200_003)
    peer.allreduce(f, "mean", algorithm="ring")
    kept = comm.ring
    comm.use_ring(list(range(n)))   # the rank order is stored as None
    return {"rates": rates.rates, "exact": bool(np.array_equal(x, want)),
            "float": hashlib.sha256(f.tobytes()).hexdigest(), "ring": kept,
            "after": comm.ring, "slowest": list(rates.slowest())}


@pytest.mark.parametrize("n", [3, 4])
def test_every_peer_measures_the_same_matrix_and_the_ordered_ring_sums_exactly(n):
    results = spawn(measured_and_ordered, n=n, timeout=90)
    first = results[0]
    for res in results:
        assert res["rates"] == first["rates"]   # allgathered: bit for bit the same
        assert res["exact"] and res["float"] == first["float"]
        assert res["ring"] == [0, *reversed(range(1, n))] and res["after"] is None
    rates = first["rates"]
    assert all(rates[i][i] == 0.0 for i in range(n))
    assert all(rates[i][j] > 0 for i in range(n) for j in range(n) if i != j)
    src, dst, rate = first["slowest"]
    assert rate == min(rates[k][(k + 1) % n] for k in range(n)) and (dst - src) % n == 1


def rings_differ(peer):
    peer.communicator.use_ring([0, 2, 1, 3] if peer.rank == 0 else None)
    with pytest.raises(ProtocolError) as raised:   # on every peer, rank 0's order named
        peer.allreduce(np.ones(100_000), algorithm="ring", timeout=20)
    return str(raised.value)


def test_peers_that_order_the_ring_differently_get_a_protocol_error_every_one():
    messages = spawn(rings_differ, n=4, timeout=60)
    assert any("ring=[0,2,1,3]" in text for text in messages), messages


def refusals(peer):
    comm = peer.communicator
    out = []
    for bad in ([0, 1], [0, 1, 1], [0, 1, 3], ["x", 1, 2]):
        try:
            comm.use_ring(bad)
        except ValueError as exc:
            out.append(str(exc))
    for kwargs in ({"nbytes": 0}, {"nbytes": 1.5}, {"nbytes": 1024, "repeats": 0},
                   {"nbytes": 1024, "among": [0, 0]}, {"nbytes": 1024, "among": [0, 7]}):
        try:
            comm.measure_links(**kwargs)
        except ValueError as exc:
            out.append(str(exc))
    peer.allreduce(np.ones(10))   # nothing was taken: the peers are still in step
    return out


def test_a_bad_ring_or_measurement_is_a_value_error_before_anything_is_sent():
    for res in spawn(refusals, n=3, timeout=60):
        assert len(res) == 9, res
        assert all("rank" in text for text in res), res


# ---------------------------------------------------------------------- across hosts
@pytest.fixture
def four_hosts():
    yield from netfault.network_or_skip(4)


def test_across_hosts_the_measured_ring_leaves_the_slow_links_out(four_hosts, tmp_path):
    """Four hosts, every link 200 Mbit/s but both directions between hosts 0 and 1 and
    between 2 and 3 at 20: the rank order's ring crosses two slow links; the measured one
    none, and the allreduce sends nothing on them."""
    slow = {(0, 1): "20mbit", (1, 0): "20mbit", (2, 3): "20mbit", (3, 2): "20mbit"}
    four_hosts.shape("200mbit", rates=slow)
    n = 4
    procs = four_hosts.start_peers(lambda r: [sys.executable, WORKER, str(tmp_path / f"out.{r}")],
                                   port=29513, log_dir=str(tmp_path))
    failed = four_hosts.peers_failed(procs, str(tmp_path), 180)
    assert failed is None, failed
    out = [json.loads((tmp_path / f"out.{r}").read_text()) for r in range(n)]
    ring = out[0]["ring"]
    slow_links = set(slow)
    assert sorted(ring) == [0, 1, 2, 3] and ring[0] == 0
    assert not links(ring) & slow_links, ring
    for r, res in enumerate(out):
        assert res["ring"] == ring and res["communicator_ring"] == ring, (r, res["ring"])
        assert res["exact"], r
        rates = res["rates"]
        for a, b in slow_links:   # every slow link reads well below every fast one
            assert rates[a][b] < 0.5 * min(rates[i][j] for i in range(n) for j in range(n)
                                           if i != j and (i, j) not in slow_links), rates
        right = ring[(ring.index(r) + 1) % n]
        for j, nbytes in res["sent"].items():   # the allreduce's bytes went right only
            if int(j) == right:
                assert nbytes >= (1 << 19) * 8 * 2 * (n - 1) // n, (r, res["sent"])
            else:
                assert nbytes < 64 << 10, (r, j, res["sent"])
    assert len({res["digest"] for res in out}) == 1
    log = (tmp_path / "log.0").read_text()
    assert f"ring {ring}: slowest link" in log and "the rank order's" in log, log[-2000:]


# ---------------------------------------------------------------------- the two-level allreduce
def test_the_hosts_of_the_two_level_rings_come_in_the_ring_order():
    hosts = {0: "a", 1: "b", 2: "a", 3: "c", 4: "b", 5: "c"}
    assert host_groups(hosts, 6) == [[0, 2], [1, 4], [3, 5]]
    assert host_groups(hosts, 6, [0, 3, 5, 2, 1, 4]) == [[0, 2], [3, 5], [1, 4]]
    assert host_groups(hosts, 6, [0, 4, 1, 3, 2, 5]) == [[0, 2], [1, 4], [3, 5]]


def two_levels_in_ring_order(peer):
    t = peer.transport
    t.hosts = {j: "abc"[j % 3] for j in range(peer.world_size)}   # which peers form a host
    peer.communicator.use_ring([0, 2, 5, 1, 4, 3])   # hosts a, c, b
    x = np.random.default_rng(peer.rank).integers(-1000, 1000, 100_003).astype(np.int64)
    want = sum(np.random.default_rng(j).integers(-1000, 1000, 100_003).astype(np.int64)
               for j in range(peer.world_size))
    peer.allreduce(x, algorithm="hierarchical")
    return bool(np.array_equal(x, want)), hashlib.sha256(x.tobytes()).hexdigest()


def test_the_two_level_allreduce_in_a_ring_order_sums_exactly():
    results = spawn(two_levels_in_ring_order, n=6, timeout=120)
    assert all(exact for exact, _ in results), results
    assert len({digest for _, digest in results}) == 1


@pytest.mark.slow
def test_the_benchmark_runs_both_orders_against_iperf3(four_hosts, capsys):
    """benchmarks/ring_order.py end to end, small (its own namespaces: the fixture only says
    they can be made): a row per order, and the ring the peers measured leaves out the slow
    links (its default, 0-1 and 2-3 both ways)."""
    four_hosts.close()
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(
        os.path.abspath(__file__)))), "benchmarks"))
    import ring_order as bench
    bench.main(["--sizes", "4M", "--reps", "1", "--invocations", "1", "--probe", "1M"])
    out = capsys.readouterr().out
    rows = [line.split("|") for line in out.splitlines() if line.startswith("| 4 MiB")]
    assert [row[2].strip() for row in rows] == ["rank order", "measured order"], rows
    ring = json.loads(out.split("Measured rings: ")[1].split(";")[0])[0]
    assert sorted(ring) == [0, 1, 2, 3], out
    assert not links(ring) & {(0, 1), (1, 0), (2, 3), (3, 2)}, out


def hosts_in_ring_order(peer):
    t = peer.transport
    t.hosts = {j: "abc"[j % 3] for j in range(peer.world_size)}   # hosts a: 0 3, b: 1 4, c: 2 5
    ring = peer.order_ring(64 << 10, repeats=1, margin=0.0)
    rates = peer.communicator.measure_links(64 << 10, repeats=1, among=[0, 1, 2])
    x = np.random.default_rng(peer.rank).integers(-1000, 1000, 100_003).astype(np.int64)
    want = sum(np.random.default_rng(j).integers(-1000, 1000, 100_003).astype(np.int64)
               for j in range(peer.world_size))
    peer.allreduce(x, algorithm="hierarchical")
    y = x // 6   # the same on every peer: the flat ring in that order sums six of them
    peer.allreduce(y, algorithm="ring")
    exact = bool(np.array_equal(x, want) and np.array_equal(y, 6 * (want // 6)))
    return ring, peer.communicator.ring, rates.ranks, rates.rates, exact


def test_with_several_peers_a_host_one_a_host_measures_and_each_host_stays_together():
    results = spawn(hosts_in_ring_order, n=6, timeout=120)
    ring = results[0][0]
    for got, kept, ranks, rates, exact in results:
        assert got == ring and exact
        assert kept == (None if ring == list(range(6)) else ring)
        assert ranks == (0, 1, 2)
        measured = {(i, j) for i in range(6) for j in range(6) if rates[i][j] > 0}
        assert measured == {(i, j) for i in range(3) for j in range(3) if i != j}
    assert sorted(ring) == list(range(6))
    hosts = ["abc"[j % 3] for j in ring]   # each host's peers one after the other, rank order
    assert len([k for k in range(6) if hosts[k] != hosts[k - 1]]) == 3, ring
    for label in "abc":
        assert [j for j in ring if "abc"[j % 3] == label] == sorted(
            j for j in range(6) if "abc"[j % 3] == label)
