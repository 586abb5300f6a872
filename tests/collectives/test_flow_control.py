"""An honest sender running far ahead of its receiver: the receiver holds what arrives for
operations it has not started up to its pause threshold, then asks the sender to wait (HOLD),
and lets it go on once it catches up. Nothing is dropped, every array arrives exact, and the
receiver never holds more than its per-link bound from that sender: what the sender still has
in flight is bounded in bytes by its send window (ACKs), even for whole 4 MiB messages posted
at once, in both directions at once, and when it closes with its window full. Over tcp:
shared-memory chunks are bounded by their ring instead. The bounds are the receiver's own
(flow_control.HeldBounds): smaller without a cluster key than with one; the tests that depend
on them run both ways."""
from __future__ import annotations

import time

import numpy as np
import pytest

from collectives import defaults
from collectives.security import write_cluster_key
from collectives.transport.flow_control import KEYED_BOUNDS, OPEN_BOUNDS
from gossip.testing import spawn, wait_until
from helpers import wait_steady


@pytest.fixture(params=["no-key", "key"])
def keyed(request, tmp_path):
    """spawn() options of a group without a cluster key, or with one; the bounds it uses."""
    if request.param == "no-key":
        return {"insecure": True}, OPEN_BOUNDS
    path = tmp_path / "cluster.key"
    write_cluster_key(path)
    return {"key": str(path)}, KEYED_BOUNDS

MESSAGES = 24
SIZE = 16 << 20  # 24 x 16 MiB = 384 MiB: past the pause and the hard bound both


def run_ahead(peer):
    if peer.rank == 1:
        for i in range(MESSAGES):
            peer.send(0, np.full(SIZE, i % 251, dtype=np.uint8))  # waits while held
        peer.barrier()
        return peer.stats()["holds_received"]
    t = peer.transport
    # The receiver starts nothing until it has asked the sender to wait: everything the
    # sender sent so far is for operations not started.
    wait_until(lambda: t.stats()["holds_sent"]["pause"] >= 1, 60, what="a pause")
    exact = True
    for i in range(MESSAGES):
        x = peer.recv(1)
        exact &= x.size == SIZE and int(x[0]) == i % 251 and int(x[-1]) == i % 251
    peer.barrier()
    stats = peer.stats()
    return exact, stats["dropped"], stats["held_peak"], stats["holds_sent"]


def test_fast_sender_waits_instead_of_being_dropped(keyed):
    options, bounds = keyed
    (exact, dropped, peak, sent), received = spawn(run_ahead, n=2, timeout=120,
                                                  transport="tcp", **options)
    assert exact and dropped == 0
    assert bounds.pause < peak <= bounds.per_link, peak
    assert sent["pause"] >= 1 and sent["resume"] >= 1, sent
    assert received["pause"] >= 1 and received["resume"] >= 1, received
    print(f"\nrun ahead: {MESSAGES} x {SIZE >> 20} MiB, held peak {peak / 2**20:.1f} MiB, "
          f"holds {sent}, 0 dropped")


# ---------------------------------------------------------------- the send window
# Whole messages: up to whole_message_bytes (4 MiB) an array travels as one frame, so libzmq's
# queues (send_hwm messages, and the receiver's unbounded ones) would let 256 MiB and more of
# them be in flight past a pause. The send window bounds that in bytes (collectives/transport/flow_control.py).
WHOLE = 4 << 20
POSTED = 160  # 640 MiB posted at once, without waiting: more than twice the keyed per-link bound
BASE = (np.arange(WHOLE) % 251).astype(np.uint8)


def honest_bound(bounds) -> int:
    """What a receiver may hold from an honest source (defaults.py's derivation): the pause
    threshold, the message that crossed it, and one send window."""
    return bounds.pause + WHOLE + defaults.HELD_OVERHEAD + bounds.window



def isend(peer, dst: int, x, seq: int):
    """A non-blocking send (mpi4py's isend): the messages peer.send(dst, x) would send as its
    ``seq``-th to ``dst``, posted at once; wait with ``wait_sent(call, ticket)``. The peer
    must make no peer.send of its own to ``dst`` (it would take the same sequence numbers)."""
    from collectives.algorithms.p2p import Call, post_range
    from collectives.communicator import P2P_CHANNEL
    from collectives.staging import flat_of

    adapter, flat, dtype = flat_of(x)
    call = Call(peer.transport, P2P_CHANNEL, seq, "send", dtype, tuple(x.shape),
                time.monotonic() + peer.timeout)
    return call, post_range(call, dst, adapter, flat, 0, adapter.size(flat), track=True)


def message(i: int) -> np.ndarray:
    return BASE + np.uint8(i % 256)  # a different array per message, wrapping in uint8


def wait_all(sent) -> None:
    from collectives.algorithms.p2p import wait_sent
    for call, ticket in sent:
        wait_sent(call, ticket)


def receive_all(peer, src: int, count: int) -> int:
    """Receive ``count`` messages from ``src``; how many were not exactly what was sent."""
    wrong = 0
    for i in range(count):
        x = peer.recv(src)
        wrong += not (x.shape == (WHOLE,) and np.array_equal(x, message(i)))
    return wrong


def posted_ahead(peer):
    """Rank 1 posts POSTED whole 4 MiB messages without waiting; rank 0 receives none of them
    until it has asked rank 1 to pause and then slept, so everything rank 1 could get in flight
    has landed: rank 0 then holds as much from rank 1 as it ever will before it reads."""
    t = peer.transport
    if peer.rank == 1:
        arrays = [message(i) for i in range(POSTED)]
        sent = [isend(peer, 0, x, i) for i, x in enumerate(arrays)]
        wait_all(sent)  # returns once rank 0 took everything: nobody was cut
        return {"acks": t.stats()["acks_received"], "holds": t.stats()["holds_received"],
                "queued": len(t._links[0].queue)}
    wait_until(lambda: t.stats()["holds_sent"]["pause"] >= 1, 60, what="a pause")
    # what rank 1 has in flight lands meanwhile: what rank 0 holds from it stops growing
    held_before_reading = wait_steady(lambda: t.inbox.held()[0].get(1, 0), 60,
                                      what="rank 1's messages in flight landing")
    wrong = receive_all(peer, 1, POSTED)
    stats = t.stats()
    return {"wrong": wrong, "dropped": stats["dropped"], "by_reason": stats["dropped_by_reason"],
            "peak": stats["held_peak"], "held": held_before_reading,
            "acks": stats["acks_sent"]}


def test_posted_sends_of_whole_messages_wait_in_the_window_and_all_arrive(keyed):
    options, bounds = keyed
    receiver, sender = spawn(posted_ahead, n=2, timeout=240, peer_timeout=120, transport="tcp",
                             **options)
    honest = honest_bound(bounds)
    assert receiver["wrong"] == 0, receiver
    assert receiver["dropped"] == 0 and not receiver["by_reason"], receiver  # never cut
    assert bounds.pause < receiver["peak"] <= honest < bounds.per_link, receiver
    assert bounds.pause < receiver["held"] <= receiver["peak"], receiver
    assert sender["holds"]["pause"] >= 1 and sender["acks"] >= 1, sender
    assert sender["queued"] == 0, sender
    print(f"\nposted ahead: {POSTED} x 4 MiB, held peak {receiver['peak'] / 2**20:.1f} MiB "
          f"(bound {honest / 2**20:.1f}), {receiver['held'] / 2**20:.1f} MiB held before "
          f"reading, {sender['acks']} ACKs, holds {sender['holds']}, 0 dropped")


STREAM = 48  # 4 MiB messages, then 64 MiB arrays (in 1 MiB chunks)
BIG = 4


def plain_stream(peer):
    """A stream the receiver keeps up with: whole messages posted at once, then sends of
    chunked 64 MiB arrays one at a time; every one exact. The window is in use (ACKs) and
    changes nothing else here: no drop."""
    t = peer.transport
    if peer.rank == 1:
        wait_all([isend(peer, 0, message(i), i) for i in range(STREAM)])
        for k in range(BIG):
            x = np.full(64 << 20, 7 + k, dtype=np.uint8)
            wait_all([isend(peer, 0, x, STREAM + k)])  # what peer.send does
        return {"acks": t.stats()["acks_received"]}
    wrong = receive_all(peer, 1, STREAM)
    for k in range(BIG):
        x = peer.recv(1)
        wrong += not (x.size == 64 << 20 and int(x.min()) == int(x.max()) == 7 + k)
    stats = t.stats()
    return {"wrong": wrong, "dropped": stats["dropped"], "acks": stats["acks_sent"]}


def test_the_window_keeps_a_plain_stream_exact():
    receiver, sender = spawn(plain_stream, n=2, timeout=240, peer_timeout=120, transport="tcp")
    assert receiver["wrong"] == 0 and receiver["dropped"] == 0, receiver
    # The window was in use: 448 MiB is 14 windows. (How many ACKs exactly depends on
    # timing: a receiver that falls behind pauses, and one ACK then covers more.)
    assert sender["acks"] >= 1 and receiver["acks"] >= sender["acks"], (sender, receiver)


BOTH = 100


def both_ways(peer):
    """Both peers post BOTH whole messages to each other before receiving any: each pauses the
    other and withholds its ACKs, each one's data waits in its window, and the pauses, resumes
    and ACKs (ahead of the queued data) still let everything through: no deadlock."""
    other = 1 - peer.rank
    arrays = [message(i) for i in range(BOTH)]
    sent = [isend(peer, other, x, i) for i, x in enumerate(arrays)]
    wrong = receive_all(peer, other, BOTH)
    wait_all(sent)
    stats = peer.stats()
    return {"wrong": wrong, "dropped": stats["dropped"], "peak": stats["held_peak"],
            "holds": stats["holds_sent"], "honest": honest_bound(peer.transport.bounds)}


def test_both_directions_heavy_at_once_do_not_deadlock(keyed):
    options, _ = keyed
    results = spawn(both_ways, n=2, timeout=240, peer_timeout=120, transport="tcp", **options)
    for r in results:
        assert r["wrong"] == 0 and r["dropped"] == 0, results
        assert r["peak"] <= r["honest"], results
    print(f"\nboth ways: {BOTH} x 4 MiB each way, held peaks "
          f"{[round(r['peak'] / 2**20, 1) for r in results]} MiB, pauses "
          f"{[r['holds']['pause'] for r in results]}, 0 dropped")


SMALL_SENDS = 20000   # 4 KiB messages: 80 MiB, more than a send window and a pause hold


def stream_then_close(peer):
    """Rank 0 sends SMALL_SENDS small messages and closes at once (a send returns once queued,
    so most are still queued then); rank 1 must get every one, in order: close() lets what is
    queued for a live receiver leave first."""
    x = np.zeros(1024, dtype=np.float32)
    peer.barrier()
    if peer.rank == 0:
        for i in range(SMALL_SENDS):
            x[0] = i
            peer.send(1, x)
        backlog = peer.transport._links[1].backlog()[0]
        started = time.monotonic()
        peer.close()
        return backlog, time.monotonic() - started
    wrong = [i for i in range(SMALL_SENDS) if int(peer.recv(0)[0]) != i]
    return wrong[:10]


@pytest.mark.parametrize("transport", ["auto", "tcp"])
def test_sends_queued_at_close_reach_a_receiver_that_takes_them(transport):
    # Before Peer.close drained its links, the receiver got PeerLost part way through.
    (backlog, took), wrong = spawn(stream_then_close, n=2, timeout=120, transport=transport)
    assert wrong == []
    assert backlog > 0, "nothing was queued at close(): the test proves nothing"
    print(f"\n{transport}: {backlog} of {SMALL_SENDS} messages queued at close(); all arrived "
          f"(close took {took:.2f}s)")


def close_with_full_window(peer):
    """Rank 1 posts more to rank 0 than the pause and the window let through, then closes with
    its window full, rank 0 taking nothing: close() gives rank 0 up after CLOSE_DRAIN_STALL and
    returns (the harness would see a hang), the queued sends fail with PeerLost instead of
    waiting, and a warning names what was dropped."""
    import logging
    import gossip
    t = peer.transport
    if peer.rank == 0:
        wait_until(lambda: t.is_lost(1), 60, what="rank 1 gone")
        return t.lost_ranks()[1]
    arrays = [message(i) for i in range(40)]  # 160 MiB
    sent = [isend(peer, 0, x, i) for i, x in enumerate(arrays)]
    link = t._links[0]
    cost = WHOLE + defaults.HELD_OVERHEAD
    wait_until(lambda: link.queue and not link.window.room(cost), 60, what="a full window")
    records: list = []
    handler = logging.Handler()
    handler.emit = records.append   # type: ignore[method-assign]
    logging.getLogger("gossip.events").addHandler(handler)
    peer.close()
    warned = [r.getMessage() for r in records if r.levelno == logging.WARNING]
    return sum(isinstance(ticket.error, gossip.PeerLost) for _, ticket in sent), warned


def test_close_with_a_full_window_fails_the_queued_sends():
    lost, (failed, warned) = spawn(close_with_full_window, n=2, timeout=120, transport="tcp")
    assert failed > 0 and lost
    assert len(warned) == 1 and "to rank 0 still queued: they are dropped" in warned[0], warned
    print(f"\nclosed with a full window: {failed} queued sends failed; rank 0: {lost}")


def forged_acks(peer):
    """Rank 1 acknowledges what rank 0 never sent, and goes backwards: each is dropped as a
    strike, a sound one still applies, and after MAX_STRIKES rank 0 cuts rank 1."""
    from collectives.transport.wire import ACK, Channel, Header, encode_header
    t = peer.transport
    if peer.rank == 0:
        for i in range(3):
            peer.send(1, np.full(10, i))
        wait_until(lambda: t.stats()["dropped_by_reason"].get("malformed", 0)
                   >= defaults.MAX_STRIKES, 60, what="the strikes")
        link = t._links[1]
        result = (t.stats()["dropped_by_reason"], link.window.acked_number, link.sent_number,
                  t.stats()["acks_received"])
        peer.send(1, np.zeros(1))  # rank 1 may go (its goodbye would be one more drop)
        return result
    for _ in range(3):
        peer.recv(0)
    numbers = [1, 10**9, 0, 1] + [10**9] * (defaults.MAX_STRIKES - 2)
    for number in numbers:
        t.send(0, encode_header(Header(ACK, 1, Channel.LINK, number)))
    peer.recv(0)
    return None


def test_forged_acks_are_strikes_and_never_open_the_window():
    (reasons, acked, sent_number, acks), _ = spawn(forged_acks, n=2, timeout=120,
                                                   transport="tcp")
    assert reasons == {"malformed": defaults.MAX_STRIKES}, reasons
    assert acked == 1 and sent_number >= 3 and acks == 2, (acked, sent_number, acks)


def test_window_accounts_by_message_number():
    from collectives.transport.flow_control import Acks, SendWindow, message_cost
    w = SendWindow(limit=100, every=25)
    assert w.room(1000)  # nothing unacknowledged: even a message larger than the window
    for cost in (40, 40, 10):
        w.on_sent(cost)
    assert w.in_flight == 90 and w.room(10) and not w.room(11)
    w.on_ack(1)
    assert w.in_flight == 50 and w.acked_number == 1
    w.on_ack(3)
    assert w.in_flight == 0
    w.on_sent(24)
    assert w.room(10**6)  # below `every` the receiver may owe no ACK: a big one may go
    assert message_cost((b"h", memoryview(bytes(10)))) == 10 + defaults.HELD_OVERHEAD
    acks = Acks(0, 2, {}, None, None, lambda src: False)
    assert acks.on_ack(1, 5) is None and acks.received == 0  # no link: nothing to open
