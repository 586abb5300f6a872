"""The two-level allreduce across hosts (collectives/algorithms/hierarchical.py, issue #18):
each host reduces among its peers first, only a k-th of the array per peer crosses hosts, and
every peer ends bitwise identical.

On one host the grouping is given by relabelling the peers' host identities (the peers are
real processes; only which of them count as one host is chosen by the test). Across hosts,
network namespaces (tests/netfault.py) are the hosts: "auto" picks the two levels itself and
the bytes each peer sends to the other host are counted."""
from __future__ import annotations

import hashlib
import json
import os
import sys

import numpy as np
import pytest

from gossip.testing import spawn

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))   # tests/
import netfault  # noqa: E402

WORKER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "workers",
                      "hierarchical_worker.py")
REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def against_the_ring(peer, labels):
    t = peer.transport
    t.hosts = {j: labels[j] for j in range(peer.world_size)}   # which peers form a host
    rng = np.random.default_rng(peer.rank)
    out = []
    for op, x in [("sum", rng.integers(-100, 100, 100_003).astype(np.int64)),
                  ("mean", rng.standard_normal(70_001)),
                  ("max", rng.integers(-1000, 1000, 70_001).astype(np.int32)),
                  ("prod", (1 + rng.integers(0, 2, 3)).astype(np.int16)),   # fewer than peers
                  ("sum", rng.standard_normal(50_000).astype(np.float32))]:
        ring, two = x.copy(), x.copy()
        peer.allreduce(ring, op, algorithm="ring")
        peer.allreduce(two, op, algorithm="hierarchical")
        same = (np.array_equal(ring, two) if x.dtype.kind != "f"
                else np.allclose(ring, two, rtol=1e-5, atol=1e-5))
        out.append((op, str(x.dtype), bool(same), hashlib.sha256(two.tobytes()).hexdigest()))
    return out


@pytest.mark.parametrize("labels", ["abab", "aab", "abbb"],
                         ids=["equal-hosts-interleaved", "unequal-hosts", "a-lone-peer"])
def test_two_levels_agree_with_the_ring_and_every_peer_ends_identical(labels):
    results = spawn(against_the_ring, n=len(labels), timeout=90, args=(labels,))
    for r, res in enumerate(results):
        for op, dtype, same, _ in res:
            assert same, (labels, r, op, dtype)
    assert all(res == results[0] for res in results), labels   # bitwise identical


def mismatched(peer):
    peer.transport.hosts = {j: "ab"[j % 2] for j in range(peer.world_size)}
    x = np.ones(1000)
    try:
        peer.allreduce(x, algorithm="hierarchical" if peer.rank == 0 else "ring", timeout=20)
    except Exception as exc:   # every peer must raise; which error is checked below
        return type(exc).__name__, str(exc)
    return None


def test_a_peer_calling_another_algorithm_is_an_error_on_every_peer():
    results = spawn(mismatched, n=4, timeout=60)
    assert all(res is not None and res[0] == "ProtocolError" for res in results), results
    assert any("hierarchical" in res[1] for res in results), results


@pytest.fixture
def two_hosts():
    yield from netfault.network_or_skip(2)


def test_auto_goes_in_two_levels_across_hosts_and_crosses_a_third_of_the_rings_bytes(
        two_hosts, tmp_path):
    """Four peers, two per host, placed round-robin (rank r on host r % 2): every hop of the
    flat ring crosses hosts, 2(n-1)/n of the array per peer; in two levels each peer sends
    2(H-1)/H of its half, a third of that."""
    n, count = 4, 1 << 19   # hierarchical_worker.COUNT int64s
    procs = two_hosts.start_peers(lambda r: [sys.executable, WORKER, str(tmp_path / f"out.{r}")],
                                  port=29511, log_dir=str(tmp_path), placement=[0, 1, 0, 1],
                                  timeout=30)
    failed = two_hosts.peers_failed(procs, str(tmp_path), 120)
    assert failed is None, failed
    out = [json.loads((tmp_path / f"out.{r}").read_text()) for r in range(n)]
    for r, res in enumerate(out):
        assert res["away"] == [j for j in range(n) if j % 2 != r % 2]
        for j, address in res["addresses"].items():   # tcp only between the namespaces
            assert address.startswith("tcp://") == (int(j) % 2 != r % 2), (r, j, address)
        assert res["auto"]["exact"] and res["ring"]["exact"], (r, res)
        # Payload 2(H-1)/H * count/k * 8 bytes (H = k = 2), plus the chunks' headers.
        assert count * 4 <= res["auto"]["away_bytes"] <= count * 4 * 1.05, (r, res)
    assert len({res["auto"]["digest"] for res in out}) == 1
    rings = sum(res["ring"]["away_bytes"] for res in out)
    levels = sum(res["auto"]["away_bytes"] for res in out)
    assert rings >= 2.9 * levels, (rings, levels)


@pytest.mark.slow
def test_the_benchmark_runs_both_placements_under_a_rate_limit(two_hosts, capsys):
    """benchmarks/hierarchical.py end to end, small (its own namespaces: the fixture only
    says they can be made): a row per placement, the round-robin ring's bytes across hosts
    three times the two levels'."""
    two_hosts.close()
    sys.path.insert(0, os.path.join(REPO, "benchmarks"))
    import hierarchical as bench
    assert bench.main(["--sizes", "1M", "--repeats", "1", "--invocations", "1",
                       "--rate", "1gbit"]) == 0
    lines = capsys.readouterr().out.splitlines()[2:]
    assert lines[-1].startswith("iperf3 between hosts 1 and 0"), lines   # the links' own rate
    rows = [line.split() for line in lines[:-1]]
    assert [row[0] for row in rows] == ["round-robin", "blocks"], rows
    for row in rows:
        ring_mib, levels_mib = float(row[-6]), float(row[-4])   # then the uplinks filled
        assert abs(ring_mib - 3 * levels_mib) < 0.05 * ring_mib, row
