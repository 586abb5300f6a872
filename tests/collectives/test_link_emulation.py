"""Link emulation (GOSSIP_LINK, collectives/transport/emulation.py) with real peer processes: a
rate and a latency make communication cost at least what they say (lower bounds only: the
behaviour itself, never a timing threshold from above), results stay bit-exact, bad values are
a ValueError naming the setting, and close() does not wait for what the emulation holds."""
from __future__ import annotations

import threading
import time

import numpy as np
import pytest

import gossip
from collectives.config import TransportConfig
from collectives.errors import OperationTimeout
from collectives.transport.emulation import LinkSpec, Pacer, parse_link
from gossip.testing import spawn, wait_until

MIB = 1 << 20


def exchange(peer, nbytes):
    """Both peers send ``nbytes`` to each other at once; the seconds it took, and whether what
    came is what was sent."""
    other = 1 - peer.rank
    mine = np.arange(nbytes // 4, dtype=np.float32) + peer.rank
    peer.barrier()
    start = time.monotonic()
    # Send from a thread: a send returns once its buffer is free, which the link delays too.
    sender = threading.Thread(target=peer.send, args=(other, mine))
    sender.start()
    got = peer.recv(other)
    sender.join(peer.timeout)
    elapsed = time.monotonic() - start
    expected = np.arange(nbytes // 4, dtype=np.float32) + other
    return elapsed, bool(np.array_equal(got, expected)), peer.stats().get("link_emulation")


@pytest.mark.parametrize("transport", ["tcp", "auto"])
def test_rate_bounds_a_bulk_exchange(transport):
    # 80 Mbit/s is 10 MB/s: 4 MiB less one burst (64 KiB) cannot cross in less than 0.41 s.
    results = spawn(exchange, n=2, args=(4 * MIB,), timeout=60, transport=transport,
                    env={"GOSSIP_LINK": "80mbit,0"})
    for elapsed, exact, held in results:
        assert exact
        assert held["link"] == "80mbit,0" and held["bytes_delayed"] >= 4 * MIB - 64 * 1024
        assert held["seconds_held"] > 0
    # The peer that left the barrier first waits for all of the other's bytes from its own
    # start (the other may start later, never earlier): that one bounds the link.
    assert max(r[0] for r in results) >= (4 * MIB - 64 * 1024) / 10e6, results


def ping_pong(peer, rounds):
    """``rounds`` round trips of a small array; the seconds each took at least."""
    small = np.ones(4, dtype=np.float32)
    peer.barrier()
    start = time.monotonic()
    for _ in range(rounds):
        if peer.rank == 0:
            peer.send(1, small)
            peer.recv(1)
        else:
            peer.send(0, peer.recv(0))
    elapsed = time.monotonic() - start
    # Rank 1 must not close before its last reply arrives: close() releases what the link
    # still holds at once (it was sent), and that reply would come early.
    peer.barrier()
    return elapsed / rounds


@pytest.mark.parametrize("transport", ["tcp", "ipc"])
def test_latency_bounds_a_round_trip(transport):
    # 50 ms each way: a round trip takes at least 100 ms.
    results = spawn(ping_pong, n=2, args=(3,), timeout=60, transport=transport,
                    env={"GOSSIP_LINK": "1gbit,50ms"})
    assert results[0] >= 0.1, results


def collectives_round(peer):
    """An allreduce (large: shared memory and chunks; small: inline) and a gossip round."""
    rng = np.random.default_rng(peer.rank)
    big = rng.standard_normal(3 * MIB // 4).astype(np.float32)
    small = rng.standard_normal(1000).astype(np.float64)
    gossiped = rng.standard_normal(200_000).astype(np.float32)
    peer.allreduce(big, op="sum")
    peer.allreduce(small, op="mean")
    peer.neighbor_average(gossiped, step=0)
    return big.tobytes(), small.tobytes(), gossiped.tobytes()


def test_results_are_bit_exact_under_emulation():
    # Against the same algorithms without emulation: emulated peers on one host do not meet in
    # shared memory (below), so the plain run is one whose peers cannot either (tcp).
    plain = spawn(collectives_round, n=3, timeout=60, transport="tcp")
    emulated = spawn(collectives_round, n=3, timeout=60, env={"GOSSIP_LINK": "1gbit,2ms"})
    assert emulated == plain


def timed_collectives(peer, nbytes):
    """The seconds a barrier, an allreduce and a neighbour average of ``nbytes`` took here."""
    data = np.ones(nbytes // 4, dtype=np.float32)
    seconds = []
    peer.barrier()
    for op in (peer.barrier, lambda: peer.allreduce(data),
               lambda: peer.neighbor_average(data, step=0)):
        start = time.monotonic()
        op()
        seconds.append(time.monotonic() - start)
    return seconds


def test_collectives_on_one_host_cross_the_emulated_link():
    # Two peers on one host would otherwise meet in shared memory (a barrier, an allreduce
    # and a neighbour exchange that read each other's memory), which no network delays: the
    # emulated run would cost nothing the network would. 50 ms one way: a barrier waits for
    # a message from the other peer; 80 Mbit/s: 4 MiB sent either way (the ring's two
    # halves, or the whole array to the neighbour) cannot cross in under 0.41 s.
    results = spawn(timed_collectives, n=2, args=(4 * MIB,), timeout=90,
                    env={"GOSSIP_LINK": "80mbit,50ms"})
    barrier, allreduce, neighbor = (max(r[k] for r in results) for k in range(3))
    assert barrier >= 0.05, results
    assert allreduce >= (4 * MIB - 64 * 1024) / 10e6, results
    assert neighbor >= (4 * MIB - 64 * 1024) / 10e6, results


def test_bad_values_name_the_setting(monkeypatch):
    for bad in ("fast", "1gbits,2ms", "1gbit,2m", "0,1ms", "-5mbit", "1gbit,2ms,3"):
        with pytest.raises(ValueError, match="GOSSIP_LINK"):
            parse_link(bad)
        monkeypatch.setenv("GOSSIP_LINK", bad)
        with pytest.raises(ValueError, match="GOSSIP_LINK"):
            gossip.init(rank=0, world_size=1)
        monkeypatch.delenv("GOSSIP_LINK")
        with pytest.raises(ValueError, match="link="):
            gossip.init(rank=0, world_size=1, link=bad)
        with pytest.raises(ValueError, match="link"):
            TransportConfig(link=bad)
    assert parse_link("off") is None and parse_link("") is None
    assert parse_link("100mbit,500us") == LinkSpec(12.5e6, 500e-6, "100mbit,500us")
    assert parse_link("500MB/s,0").rate == 500e6
    assert parse_link("125000000,1s").rate == 125e6
    assert parse_link("10gbit,2ms").latency == pytest.approx(0.002)


def test_bucket_paces_a_stream_and_allows_a_burst():
    spec = parse_link("80mbit,1ms")   # 10 MB/s; burst 64 KiB
    pacer = Pacer(spec)
    # An idle link sends one burst at once (plus the latency) ...
    assert pacer.due(64 * 1024, now=100.0) == pytest.approx(100.001)
    # ... then the stream is paid for at the rate, queued behind what went before, in order.
    assert pacer.due(1_000_000, now=100.0) == pytest.approx(100.0 + 0.1 + 0.001)
    assert pacer.due(1_000_000, now=100.0) == pytest.approx(100.0 + 0.2 + 0.001)
    # Idle for long: the bucket refills to one burst, not more.
    assert pacer.due(1_000_000, now=200.0) == pytest.approx(200.0 + 0.1 - 0.0065536 + 0.001)


def wait_past_timeout(peer):
    """Rank 1 waits 0.5 s for a message the link holds for 3 s: its timeout fires first."""
    small = np.arange(8, dtype=np.float32)
    if peer.rank == 0:
        peer.send(1, small)
        peer.barrier(timeout=30)
        return None
    start = time.monotonic()
    try:
        peer.recv(0, timeout=0.5)
    except OperationTimeout as exc:
        waited = time.monotonic() - start
        outcome = ("timeout", str(exc))
    else:
        return ("received", time.monotonic() - start)
    got = peer.recv(0, timeout=30)   # it still comes, once the link delivers it
    peer.barrier(timeout=30)
    return outcome, waited, got.tolist()


def test_a_timeout_fires_on_time_while_the_link_holds_the_message():
    results = spawn(wait_past_timeout, n=2, timeout=60, peer_timeout=30,
                    env={"GOSSIP_LINK": "1gbit,3s"})
    (outcome, message), waited, got = results[1]
    assert outcome == "timeout" and "rank 1" in message, message
    assert waited >= 0.5
    assert got == list(range(8))


def send_held_then_close(peer, nbytes):
    """Rank 0 sends ``nbytes`` that the emulation holds for 20 s, from a thread (a large send
    returns once its buffer is free, which the link delays), and closes meanwhile; rank 1 gets
    them (close releases what is held, as it would be in flight) and closes too."""
    data = np.arange(nbytes // 4, dtype=np.float32)
    if peer.rank == 0:
        errors = []

        def send():
            try:
                peer.send(1, data)
            except Exception as exc:  # reported below: the send must end, and end well
                errors.append(repr(exc))

        sender = threading.Thread(target=send)
        sender.start()
        wait_until(lambda: peer.stats()["link_emulation"]["bytes_delayed"] >= nbytes, 10,
                   what="the message queued and held by the emulation")
        peer.close()
        sender.join(10)
        return sender.is_alive(), errors
    got = peer.recv(0, timeout=30)
    peer.close()
    return bool(np.array_equal(got, data))


@pytest.mark.parametrize("transport, nbytes", [("auto", 32), ("auto", 8 * MIB), ("tcp", 8 * MIB)])
def test_close_does_not_wait_for_held_messages(transport, nbytes):
    # The run's deadline is shorter than the latency: close() must not wait it out.
    results = spawn(send_held_then_close, n=2, args=(nbytes,), timeout=15, peer_timeout=60,
                    transport=transport, env={"GOSSIP_LINK": "1gbit,20s"})
    assert results == [(False, []), True]
