"""Elastic averaging (EASGD) with the sharded centre follows membership view changes
(gossip/policies/easgd/easgd.py): a joiner enters a running group and the
centre is cut again over the new view; a planned leave hands the leaver's shards over; with
elastic=True a SIGKILLed owner's shards come from their backup. In each the assembled centre
after the change is the assembled centre before it, bitwise. Real peer processes, real
sockets, real SIGKILLs.

The centre is recorded on every member at the switch by ``Recorded`` (a variant of the
policy that writes each member's shards to files when the change begins and once it is
settled, before any round of the new view can reach it), and assembled here."""
from __future__ import annotations

import glob
import os
import threading

import numpy as np
import pytest

from collectives.arrays import segment
from gossip.policies import ElasticAveraging
from gossip.testing import spawn, wait_until
from test_membership import PEER_TIMEOUT, _publish_address, _run_joiner, _worker

# Processes the tests start beside their groups (joiners, restarted members, launchers) must
# hold the group's key: every test here gets one (tests/conftest.py's group_key).
pytestmark = pytest.mark.usefixtures("group_key")

LENGTH = 515   # not a multiple of 4 or 5: segments of unequal sizes


class Recorded(ElasticAveraging):
    """ElasticAveraging(center="sharded") that writes this member's shard (with its bounds)
    to ``workdir``: ``before-v<N>-<name>.npz`` once view N's change has stopped every round
    of the old view (an old member's, after the planned leavers' last rounds; a planned
    leaver's as it hands off) and ``after-v<N>-<name>.npz`` once view N is settled."""

    def __init__(self, workdir, **kwargs):
        super().__init__(center="sharded", **kwargs)
        self.workdir = workdir

    def attach(self, peer, params):
        # Its name: at view_changing the peer's view is the new one already, its rank
        # and transport still the old view's.
        self.member = peer.view.member(peer.rank).name
        return super().attach(peer, params)

    def _write(self, phase, number):
        record(self, self.workdir, f"{phase}-v{number}", self.member)

    def view_changing(self, switch):
        self._number = switch.view.number
        super().view_changing(switch)

    def _wait_for_leavers(self, handoffs):
        super()._wait_for_leavers(handoffs)
        self._write("before", self._number)   # every round of the old view is done

    def hand_off(self, to):
        self._write("before", self._peer.view.number + 1)
        super().hand_off(to)

    def settle_view(self):
        super().settle_view()
        self._write("after", self._peer.view.number)   # before the switch's barrier


def record(policy, workdir, tag, name=None):
    peer = policy.peer
    lo, hi = segment(LENGTH, peer.rank, peer.world_size)
    name = name or peer.view.member(peer.rank).name
    np.savez(os.path.join(workdir, f"{tag}-{name}.npz"), bounds=np.array([lo, hi]),
             center=np.asarray(policy.center[0]))


def assembled(workdir, tag):
    """The whole centre from the ``tag-*.npz`` files, checked to tile [0, LENGTH) once."""
    pieces = sorted((tuple(f["bounds"]), f["center"].copy())
                    for f in map(np.load, glob.glob(os.path.join(workdir, f"{tag}-*.npz"))))
    assert pieces, f"no {tag} records in {workdir}"
    edges = [b for b, _ in pieces]
    assert edges[0][0] == 0 and edges[-1][1] == LENGTH, edges
    assert all(a[1] == b[0] for a, b in zip(edges, edges[1:])), edges
    return np.concatenate([c for _, c in pieces])


def start_x(rank):
    return np.random.default_rng([5, rank]).normal(size=LENGTH)


# ---------------------------------------------------------------- a joiner, 4 -> 5
def train_until(peer, policy, x, size, steps):
    """Steps until the view has ``size`` members and ``steps`` steps are done: the same
    decision on every member (an allreduce, first in a step: a joiner enters at the boundary
    that ends the step before)."""
    done = np.zeros(1)
    while policy.step < 100_000:
        done[0] = peer.world_size >= size and policy.step >= steps
        peer.allreduce(done, op="max")
        if done[0]:
            break
        x -= 0.01 * x                      # a step: every worker pulled towards 0
        policy.after_step()


def sharded_members(peer, workdir, size, steps):
    _publish_address(peer, workdir)
    x = start_x(peer.rank)
    policy = Recorded(workdir, period=1).attach(peer, [x])
    train_until(peer, policy, x, size, steps)
    record(policy, workdir, "end")
    stats = policy.stats()
    policy.close()
    return peer.world_size, peer.view.number, policy.step, stats["segments_rebuilt"]


def test_a_joiner_enters_a_sharded_group_and_the_centre_is_conserved_bitwise(tmp_path):
    workdir, box, steps = str(tmp_path), {}, 30
    tests = os.path.dirname(os.path.abspath(__file__))

    def joiner():
        box["out"] = _run_joiner(workdir, _worker("sharded_easgd_joiner.py"),
                                 [5, LENGTH, workdir, tests, steps], "joiner")

    thread = threading.Thread(target=joiner)
    thread.start()
    try:
        results = spawn(sharded_members, n=4, timeout=150, args=(workdir, 5, steps),
                        peer_timeout=PEER_TIMEOUT)
    finally:
        thread.join(150)
    code, out = box["out"]
    lines = [ln.split() for ln in out.splitlines() if ln.startswith("JOINED")]
    assert code == 0 and lines, out[-3000:]
    _, rank, size, joiner_steps = lines[0]
    assert (int(rank), int(size)) == (4, 5)
    for world, number, member_steps, rebuilt in results:
        assert (world, number, rebuilt) == (5, 1, 0), results
        assert member_steps == int(joiner_steps)       # one step count in the view
    before, after = assembled(workdir, "before-v1"), assembled(workdir, "after-v1")
    assert len(glob.glob(os.path.join(workdir, "after-v1-*.npz"))) == 5
    assert before.tobytes() == after.tobytes()         # no centre mass lost or duplicated
    assert np.isfinite(assembled(workdir, "end")).all()   # 5 owners tile the centre


# ---------------------------------------------------------------- a planned leave, 5 -> 4
def sharded_leaver(peer, workdir, leaver, leave_at, extra):
    x = start_x(peer.rank)
    policy = Recorded(workdir, period=1).attach(peer, [x])
    first_rank = peer.rank
    while policy.step < 100_000:
        if peer.view.number >= 1 and policy.step >= peer.view.step + extra:
            break   # the same step on all: the boundary's, and ``extra`` more
        if first_rank == leaver and policy.step == leave_at:
            peer.leave()   # planned: rounds to the agreed boundary, then its shards go
            return "left"
        x -= 0.01 * x
        policy.after_step()
        if first_rank == leaver:   # slower than the others: far behind their boundary
            np.ones((160, 160)) @ np.ones((160, 160))
    peer.barrier()   # the others' last rounds need this peer's shard
    record(policy, workdir, "end")
    stats = policy.stats()
    policy.close()
    return peer.world_size, peer.view.number, policy.step, stats["segments_rebuilt"]


def test_a_member_leaves_a_sharded_group_and_hands_its_shards_over(tmp_path):
    # The leaver is slower: the others reach the boundary while it still takes its rounds
    # to it, which need their servers (before, they stopped serving: every member hung).
    workdir = str(tmp_path)
    results = spawn(sharded_leaver, n=5, timeout=150, args=(workdir, 2, 10, 20),
                    peer_timeout=PEER_TIMEOUT)
    assert results[2] == "left"
    stayers = [results[r] for r in (0, 1, 3, 4)]
    assert len(set(stayers)) == 1 and stayers[0][:2] == (4, 1) and stayers[0][3] == 0, results
    assert len(glob.glob(os.path.join(workdir, "before-v1-*.npz"))) == 5   # the leaver's too
    before, after = assembled(workdir, "before-v1"), assembled(workdir, "after-v1")
    assert before.tobytes() == after.tobytes()
    assert np.isfinite(assembled(workdir, "end")).all()


# ---------------------------------------------------------------- a death, elastic=True
PIECES = (200, 200, 115)   # three parameters, a bucket each: plans over several buckets


def sharded_killed(peer, victim, kill_at, total, min_peers):
    import hashlib
    import signal

    from gossip.errors import PeerLost
    x = start_x(peer.rank)
    params = np.split(x, np.cumsum(PIECES)[:-1])
    policy = ElasticAveraging(center="sharded", period=1, elastic=True, min_peers=min_peers,
                              bucket_bytes=8 * PIECES[0]).attach(peer, params)
    first_rank = peer.rank   # ranks are renumbered densely by a view change
    try:
        while policy.step < total:
            for p in params:
                p -= 0.01 * p
            if first_rank == victim and policy.step == kill_at:
                os.kill(os.getpid(), signal.SIGKILL)   # the others are in their rounds
            policy.after_step()
        n, rank = peer.world_size, peer.rank
        shards = [np.asarray(c).size for c in policy.center]
        policy.load_center()   # a collective over the new view: the whole centre, here
        whole = hashlib.sha256(b"".join(p.tobytes() for p in params)).hexdigest()
    except PeerLost as exc:
        return "PeerLost", str(exc)
    stats = policy.stats()
    policy.close()
    return (n, peer.view.number, policy.step, stats["segments_rebuilt"], rank, shards,
            whole, all(np.isfinite(p).all() for p in params))


def test_survivors_of_an_elastic_sharded_group_re_form_it_with_one_centre():
    # Rank 3 dies before its round of step 15; the others are in theirs, each needing its
    # shard: they re-form the group (view 1) and the shards come from its backup.
    results = spawn(sharded_killed, n=4, timeout=150, args=(3, 15, 40, 1), tolerate=(3,),
                    peer_timeout=PEER_TIMEOUT)
    assert results[3] is None
    survivors = results[:3]
    for n, number, steps, rebuilt, *_ in survivors:
        assert (n, number, steps, rebuilt) == (3, 1, 40, 0), survivors
    # Each survivor owns its segment of each bucket in the new view, and every one
    # assembled the same bytes.
    assert sorted(r[4] for r in survivors) == [0, 1, 2]
    for *_, rank, shards, _, _ in survivors:
        assert shards == [np.subtract(*segment(k, rank, 3)[::-1]) for k in PIECES]
    assert len({r[6] for r in survivors}) == 1 and all(r[7] for r in survivors), survivors


def test_a_sharded_group_below_min_peers_raises_peer_lost_on_every_survivor():
    results = spawn(sharded_killed, n=4, timeout=150, args=(3, 15, 40, 4), tolerate=(3,),
                    peer_timeout=PEER_TIMEOUT)
    for kind, text in results[:3]:
        assert kind == "PeerLost" and "fewer than min_peers=4" in text, results


def sharded_below_min_between_rounds(peer, workdir, victim):
    """min_peers=4 and a death seen by ranks 1 and 2 between their rounds (period 2, step 12
    has none): they take the recovery at their step boundary, not in _recover."""
    from gossip.errors import PeerLost
    x = start_x(peer.rank)
    policy = ElasticAveraging(center="sharded", period=2, elastic=True,
                              min_peers=4).attach(peer, [x])
    first_rank, killed = peer.rank, False
    try:
        while policy.step < 30:
            if policy.step == 12 and not killed:
                killed = True
                _quiet_death(peer, workdir, victim, first_rank)
                if first_rank != 0:   # rank 0's round of step 13 proposes the recovery
                    wait_until(peer.changing_now, PEER_TIMEOUT,
                               what=f"the recovery proposed to rank {first_rank}")
            x -= 0.01 * x
            policy.after_step()
    except PeerLost as exc:
        return "PeerLost", str(exc)
    return "finished", peer.world_size


def test_survivors_between_rounds_below_min_peers_raise_peer_lost_too(tmp_path):
    results = spawn(sharded_below_min_between_rounds, n=4, timeout=150,
                    args=(str(tmp_path), 3), tolerate=(3,), peer_timeout=PEER_TIMEOUT)
    # Each at once, in view 1 of 3: not after the others closed (a later death, 2 left).
    for kind, text in results[:3]:
        assert kind == "PeerLost" and "3 members left, fewer than min_peers=4" in text, results


def _quiet_death(peer, workdir, victim, first_rank, policy=None):
    """Everyone at a barrier after its rounds so far; the victim leaves it only once the
    others did (its own last messages of it may still be in its I/O thread), writes its
    shard (with ``policy``) and dies; the others return once their transport knows."""
    import signal
    peer.barrier()
    if first_rank != victim:
        open(os.path.join(workdir, f"passed-{first_rank}"), "w").close()
    else:
        if policy is not None:
            record(policy, workdir, "before-v1")   # its primary, as its backup holds it
        wait_until(lambda: len(glob.glob(os.path.join(workdir, "passed-*"))) == 3,
                   PEER_TIMEOUT, what="the others past the barrier")
        os.kill(os.getpid(), signal.SIGKILL)
    wait_until(lambda: victim in peer.lost_peers(), PEER_TIMEOUT,
               what=f"rank {victim}'s death seen by rank {first_rank}")


def sharded_killed_quietly(peer, workdir, victim, kill_at, total):
    """A death at a point where nothing is in flight (a barrier after every round up to
    ``kill_at``, which the victim leaves only once the others did: its own last messages of
    it may still be in its I/O thread): the victim writes its shard, then dies; the
    survivors wait until their transport knows it, then take their round, which finds its
    owner lost before sending."""
    x = start_x(peer.rank)
    policy = Recorded(workdir, period=1, elastic=True).attach(peer, [x])
    first_rank, killed = peer.rank, False
    while policy.step < total:
        if policy.step == kill_at and not killed:
            killed = True
            _quiet_death(peer, workdir, victim, first_rank, policy)
        x -= 0.01 * x
        policy.after_step()
    peer.barrier()   # the others' last rounds need this peer's shard (a close is a death)
    stats = policy.stats()
    policy.close()
    return (peer.world_size, peer.view.number, policy.step, stats["segments_rebuilt"],
            stats["reshards"])


@pytest.mark.parametrize("victim", [3, 0])
def test_a_killed_owners_shards_come_from_its_backup_bitwise(tmp_path, victim):
    # Rank 0 too: the first coordinator, whose backup is rank 1.
    workdir = str(tmp_path)
    results = spawn(sharded_killed_quietly, n=4, timeout=150,
                    args=(workdir, victim, 12, 30), tolerate=(victim,),
                    peer_timeout=PEER_TIMEOUT)
    survivors = [r for i, r in enumerate(results) if i != victim]
    assert results[victim] is None
    assert survivors == [(3, 1, 30, 0, 1)] * 3, survivors
    before, after = assembled(workdir, "before-v1"), assembled(workdir, "after-v1")
    assert before.tobytes() == after.tobytes()   # the dead owner's shard, whole


# ---------------------------------------------------------------- a death without elastic
def sharded_restarted(peer, victim, kill_at, extra):
    """Without elastic=True: the victim dies, the others skip its segments, it is started
    again and joins (view 1), and its old segments, which nobody held, are rebuilt."""
    import signal
    x = start_x(peer.rank)
    policy = ElasticAveraging(center="sharded", period=1).attach(peer, [x])
    first_rank, restarted = peer.rank, peer.view.number > 0   # (a restart joins view 1)
    while policy.step < 100_000:
        if peer.view.number >= 1 and policy.step >= peer.view.step + extra:
            break   # the same step on all: they share the step count from the boundary on
        if first_rank == victim and not restarted and policy.step == kill_at:
            os.kill(os.getpid(), signal.SIGKILL)
        x -= 0.01 * x
        policy.after_step()
        np.ones((96, 96)) @ np.ones((96, 96))   # a step's compute
    peer.barrier()
    stats = policy.stats()
    shard = np.asarray(policy.center[0])
    policy.close()
    return (peer.world_size, peer.view.number, policy.step, stats["segments_rebuilt"],
            restarted, bool(np.isfinite(shard).all()))


def test_without_elastic_a_dead_owners_segments_are_rebuilt_when_it_comes_back():
    results = spawn(sharded_restarted, n=4, timeout=150, args=(3, 15, 20),
                    restarts={3: 1}, peer_timeout=PEER_TIMEOUT)
    steps = {r[2] for r in results}
    assert len(steps) == 1, results
    for world, number, _, rebuilt, restarted, finite in results:
        assert (world, number, rebuilt, finite) == (4, 1, 1, True), results
    assert [r[4] for r in results] == [False, False, False, True]
