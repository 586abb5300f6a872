"""Tagged messages (MPI's and torch.distributed's tags): a receive for a tag gets the earliest
message of that tag from its source; messages of other tags that came first stay receivable,
in order, whatever their size (mpi4py's test_p2p_buf testSendrecv / testProbe and torch's
test_send_recv_with_tag check the same). Real peers over tcp and over shared memory."""
from __future__ import annotations

import time

import numpy as np
import pytest

import gossip
from gossip.testing import spawn


def out_of_order(peer):
    """Rank 0 sends tag 5 (16 MiB: many shared-memory chunks, more than its ring holds),
    tag 7, tag 5 again, then tag 9; rank 1 asks for 7 first, then 5 twice (the big one into
    out=), then any tag."""
    r = peer.rank
    big = np.arange(4 << 20, dtype=np.float32)
    if r == 0:
        requests = [peer.isend(1, big, tag=5),   # (Peer.isend: a SendRequest)
                    peer.isend(1, np.full(3, 7.0), tag=7),
                    peer.isend(1, np.full(2, 5.0, np.float32), tag=5),
                    peer.isend(1, np.full(1, 9, np.int64), tag=9)]
        for request in requests:
            request.wait()
        peer.barrier()
        return None
    seven = peer.recv(0, tag=7)
    into = np.empty_like(big)
    try:   # an out that does not fit the earliest tag-5 message: it stays receivable
        peer.recv(0, np.empty(3, np.float32), tag=5)
        refused = False
    except ValueError:
        refused = True
    first = peer.recv(0, into, tag=5)
    second = peer.recv(0, tag=5)
    rest = peer.recv(0)   # any tag
    peer.barrier()
    return (seven.tolist(), refused, first is into and bool((into == big).all()),
            second.tolist(), rest.tolist(), str(rest.dtype))


@pytest.mark.parametrize("transport", ["tcp", "auto"])
def test_a_receive_for_a_tag_gets_its_message_and_keeps_the_others_in_order(transport):
    results = spawn(out_of_order, n=2, timeout=90, transport=transport)
    assert results[1] == ([7.0] * 3, True, True, [5.0, 5.0], [9], "int64"), results[1]


def probing(peer):
    r, comm = peer.rank, peer.communicator
    if r == 0:
        for tag in (1, 2):
            peer.send(1, np.full(2, float(tag)), tag=tag)
        peer.send(0, np.full(2, 8.0), tag=8)      # to itself
        peer.send(0, np.full(2, 4.0), tag=4)
        mine = (comm.probe(0, tag=4), comm.probe(0, tag=5), peer.recv(0, tag=4).tolist(),
                peer.recv(0).tolist())
        peer.barrier()
        return mine
    waited = comm.wait_any([0], timeout=30, tag=2)           # the tag-1 message came first
    seen = (waited, comm.probe(0, tag=1), comm.probe(0, tag=3), comm.probe(0))
    try:
        peer.recv(0, tag=3, timeout=0.5)                     # never sent
        timed_out = False
    except gossip.OperationTimeout:
        timed_out = True
    got = (peer.recv(0, tag=2).tolist(), peer.recv(0, tag=1).tolist())
    peer.barrier()
    return seen, timed_out, got


def test_probe_and_wait_any_look_for_a_tag():
    mine, theirs = spawn(probing, n=2, timeout=60)
    assert mine == (True, False, [4.0, 4.0], [8.0, 8.0]), mine
    assert theirs == ((0, True, False, True), True, ([2.0, 2.0], [1.0, 1.0])), theirs


def bad_tags(peer):
    errors = []
    for call in (lambda: peer.send(1 - peer.rank, np.ones(2), tag=-1),
                 lambda: peer.recv(1 - peer.rank, tag="x"),
                 lambda: peer.communicator.wait_any([0], tag=2 ** 31)):
        try:
            call()
        except ValueError as exc:
            errors.append(str(exc))
    # (nothing was sent or taken: the pair is still in step)
    peer.send(1 - peer.rank, np.full(1, float(peer.rank)))
    return errors, peer.recv(1 - peer.rank).tolist()


def test_a_tag_out_of_range_is_refused_before_anything_moves():
    for r, (errors, got) in enumerate(spawn(bad_tags, n=2, timeout=60)):
        assert len(errors) == 3 and all("a tag is an integer from 0" in e for e in errors), errors
        assert got == [float(1 - r)]


def test_a_tag_travels_in_the_signature_and_only_sends_have_one():
    # wait_errors asks the peers where they are only for a collective's signature: a tagged
    # send's must not count as one (its peers would be asked about a call they never made).
    from collectives.transport.wire import send_signature, send_tag
    assert [send_tag(send_signature(t)) for t in (0, 1, 7, 2 ** 31 - 1)] == [0, 1, 7, 2 ** 31 - 1]
    assert send_signature(0) == "send"
    for other in ("allreduce(sum,ring)", "send#", "send#-1", "send#x", "sendrecv", ""):
        assert send_tag(other) is None, other


def probe_while_a_big_message_arrives(peer):
    """rank 1 probes for tag 7 in a loop while a 16 MiB tag-5 message (many chunks) that was
    sent first is still arriving: the probe receives it whole on the way (it must not give up
    on it half-way at its own deadline, now, and lose it), then both are receivable."""
    big = np.arange(4 << 20, dtype=np.float32)
    if peer.rank == 0:
        peer.send(1, big, tag=5)
        peer.send(1, np.full(2, 7.0), tag=7)
        peer.barrier()
        return None
    probes, deadline = 1, time.monotonic() + 30
    while not peer.probe(0, tag=7):
        probes += 1
        if time.monotonic() > deadline:
            raise AssertionError(f"rank 1: no tag-7 message within 30 s ({probes} probes)")
    seven, five = peer.recv(0, tag=7), peer.recv(0, tag=5)
    peer.barrier()
    return probes, seven.tolist(), bool((five == big).all())


@pytest.mark.parametrize("transport", ["tcp", "auto"])
def test_a_probe_for_a_tag_receives_an_earlier_message_whole(transport):
    probes, seven, five = spawn(probe_while_a_big_message_arrives, n=2, timeout=60,
                                transport=transport)[1]
    assert seven == [7.0, 7.0] and five, (probes, seven, five)


def statuses(peer):
    """mpi4py's testProbe and Status: what a probe finds waiting (without receiving it) and
    what a recv of any tag received: source, tag, dtype, shape, bytes; from another peer, out
    of what was held for a later tag, and from this peer itself."""
    r = peer.rank
    if r == 0:
        peer.send(1, np.zeros((2, 3), np.float32), tag=4)
        peer.send(1, np.arange(5, dtype=np.int64), tag=9)
        peer.send(1, np.ones(1), tag=0)
        peer.barrier()
        return None
    seen = []

    def note(status):
        seen.append((status.source, status.tag, status.dtype, status.shape, status.nbytes))

    waiting = gossip.Status()
    assert peer.communicator.wait_any([0], timeout=30) == 0
    assert peer.probe(0, status=waiting)
    note(waiting)                                        # tag 4's, not taken
    got = gossip.Status()
    nine = peer.recv(0, tag=9, status=got)               # tag 4's is held on the way
    note(got)
    probed = gossip.Status()
    assert peer.probe(0, tag=4, status=probed)            # the held one
    note(probed)
    for _ in range(2):                                   # any tag: 4 (held), then 0
        peer.recv(0, status=got)
        note(got)
    peer.send(1, np.full(3, 2, np.uint8), tag=11)         # to itself
    peer.recv(1, status=got)
    note(got)
    peer.barrier()
    return seen, nine.tolist()


def test_a_status_tells_what_a_probe_found_and_a_recv_received():
    seen, nine = spawn(statuses, n=2, timeout=60)[1]
    assert nine == list(range(5))
    assert seen == [(0, 4, "float32", (2, 3), 24), (0, 9, "int64", (5,), 40),
                    (0, 4, "float32", (2, 3), 24), (0, 4, "float32", (2, 3), 24),
                    (0, 0, "float64", (1,), 8), (1, 11, "uint8", (3,), 3)], seen
