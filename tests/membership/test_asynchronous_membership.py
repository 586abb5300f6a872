"""Asynchronous gossip follows membership view changes (gossip/policies/asynchronous/
asynchronous.py): a joiner takes a share of its source's weights and its model,
every member scales its weights by n_new / n_old once the pushes between members are
absorbed, so across a join the mass is exact and the consensus value does not move; a killed
peer started again rejoins and takes the state; a leaver goes at once and the others go on in
a smaller view. Real peer processes, real sockets; lr 0 (no local update: pure averaging),
so the mass is all there is to watch."""
from __future__ import annotations

import os
import signal
import threading

import numpy as np
import pytest

from gossip.testing import spawn, wait_until
from test_membership import PEER_TIMEOUT, _publish_address, _run_joiner, _worker

# Processes the tests start beside their groups (joiners, restarted members, launchers) must
# hold the group's key: every test here gets one (tests/conftest.py's group_key).
pytestmark = pytest.mark.usefixtures("group_key")

LENGTH = 64
ROUNDS_AFTER = 60     # rounds every member takes in the final view
MEAN = 1.5            # ranks 0..3 start at their rank


def _step() -> None:
    np.ones((96, 96)) @ np.ones((96, 96))   # a step's compute


def _done(workdir) -> bool:
    return os.path.exists(os.path.join(workdir, "done"))


def train_in_view(peer, policy, rounds, *, x=None, agree=None):
    """At least ``rounds`` rounds, then on until every member of the view has sent and
    absorbed a push in it (decided together every 10 rounds: a push takes longer than a
    round here, and a member that stopped would push no more), and, with ``agree``, until
    the members' ``x`` differ by at most that (how many rounds mixing takes depends on how
    often the pushing threads get the CPU: under load, more), then quiesce()."""
    done = np.zeros(1)
    while policy.step < 100_000:
        for _ in range(10):
            policy.after_step()
            np.ones((96, 96)) @ np.ones((96, 96))   # a step's compute
        rounds -= 10
        stats = policy.stats()   # (the counts are this view's)
        done[0] = rounds <= 0 and sum(stats["messages_sent_to"]) > 0 \
            and sum(stats["messages_absorbed_from"]) > 0
        if agree is not None:
            high, low = x.copy(), x.copy()
            peer.allreduce(high, op="max")
            peer.allreduce(low, op="min")
            done[0] = done[0] and float((high - low).max()) <= agree
        peer.allreduce(done, op="min")
        if done[0]:
            break
    policy.quiesce()          # no push in flight anywhere, every arrival folded in


# ---------------------------------------------------------------- a join
def asynchronous_members(peer, workdir, size, slow_rank=None, exchange="push"):
    from gossip.policies import Asynchronous
    _publish_address(peer, workdir)
    x = np.full(LENGTH, float(peer.rank))
    policy = Asynchronous(exchange=exchange).attach(peer, [x])      # OnePeerExponential(n)
    at_change = []
    peer.on_view_change(lambda view: at_change.append((policy.weights[0], x.copy())))
    # Until the joiner is in, or it finished without joining (the test's file: refused).
    stopped_at = None   # this member's own count when it stopped for the view change
    while peer.world_size < size and not _done(workdir) and policy.step < 100_000:
        stopped_at = policy.step
        policy.after_step()   # (the view's common count from here on: the source's)
        _step()
        if peer.rank == slow_rank:   # a member many steps behind the others at the join
            for _ in range(20):
                _step()
    train_in_view(peer, policy, ROUNDS_AFTER)
    final = policy.weights[0], x.copy()
    stats = policy.stats()
    peer.barrier()
    policy.close()
    return (peer.world_size, peer.view.number, at_change, final, stats["messages_absorbed"],
            stopped_at)


# It failed once in the final .ci/run of 2026-12-01 ("no view change committed within 30s") and
# took 15-30 s in 3 of 10 runs on 2026-12-02: members far behind the boundary step the
# fastest member set trained for that long to reach it. Asynchronous members now stop at
# their next boundary whatever their count (Policy.own_steps): 10 of 10 runs in 3-6 s.
@pytest.mark.parametrize("exchange", ["push", "pairwise"])
def test_a_joiner_enters_a_running_asynchronous_group_and_the_mass_stays_exact(exchange,
                                                                               tmp_path):
    workdir, path, box = str(tmp_path), str(tmp_path / "joiner.npz"), {}

    def joiner():
        try:
            box["out"] = _run_joiner(workdir, _worker("asynchronous_joiner.py"),
                                     [ROUNDS_AFTER, path, LENGTH,
                                      os.path.dirname(os.path.abspath(__file__)), exchange],
                                     "joiner", timeout=120)
        finally:
            open(os.path.join(workdir, "done"), "w").close()   # a refused joiner: stop

    thread = threading.Thread(target=joiner)
    thread.start()
    try:
        results = spawn(asynchronous_members, n=4, timeout=150, args=(workdir, 5, 3, exchange),
                        peer_timeout=PEER_TIMEOUT)
    finally:
        thread.join(150)
    code, out = box["out"]
    line = [ln.split() for ln in out.splitlines() if ln.startswith("JOINED")]
    assert code == 0 and line, out[-3000:]          # before: REFUSED, exit code 3
    _, rank, size, number, absorbed = line[0]
    assert (int(rank), int(size), int(number)) == (4, 5, 1)
    assert int(absorbed) > 0                        # the members pushed to it
    assert all(r[:2] == (5, 1) for r in results), [r[:2] for r in results]
    # Each member stopped at a boundary of its own (Policy.own_steps), at its own count (rank
    # 3, slowed down, is behind), instead of every member training up to one boundary step
    # (what a synchronous policy does: members behind walk to it, those past it are "late"
    # and a later one is named), where all counts would be equal.
    steps = [r[5] for r in results]
    assert len(set(steps)) > 1, steps
    data = np.load(path)
    at_join = float(data["at_w"]), data["at_m"]
    # At the switch (every push between members absorbed, nothing in transit): the total
    # weight is 5 and the mass is the 4 starting values' (their mean 1.5), scaled by 5/4.
    at_change = [r[2][-1] for r in results] + [at_join]
    assert abs(sum(w for w, _ in at_change) - 5.0) < 1e-9, [w for w, _ in at_change]
    mass = sum(w * m for w, m in at_change)
    assert np.abs(mass - 5 * MEAN).max() < 1e-9, np.abs(mass - 5 * MEAN).max()
    # The joiner's model is its source's, bitwise, and weighs what the source kept (k = 1).
    sources = [c for c in at_change[:4] if c[1].tobytes() == at_join[1].tobytes()]
    assert any(w == at_join[0] for w, _ in sources), ([c[0] for c in at_change], at_join[0])
    # After the rounds and quiesce(): the same mass, and every model near the consensus.
    final = [r[3] for r in results] + [(float(data["w"]), data["m"])]
    assert abs(sum(w for w, _ in final) - 5.0) < 1e-9, [w for w, _ in final]
    mass = sum(w * m for w, m in final)
    assert np.abs(mass - 5 * MEAN).max() < 1e-9, np.abs(mass - 5 * MEAN).max()
    start = max(abs(r - MEAN) for r in range(4))
    spread = max(float(np.abs(m - MEAN).max()) for _, m in final)
    assert spread < start / 100, spread            # converging to 1.5, not elsewhere


def refusal_with_asynchronous(peer):
    from gossip.policies import Asynchronous
    policy = Asynchronous().attach(peer, [np.zeros(4)])
    why = peer.membership.refusal()
    policy.close()
    return why


def test_joiners_are_not_refused_while_asynchronous_is_attached():
    assert spawn(refusal_with_asynchronous, n=2, timeout=30) == [None, None]


# ---------------------------------------------------------------- a kill and a restart
def asynchronous_restarted(peer, victim, kill_at):
    from gossip.policies import Asynchronous
    first = os.environ.get("GOSSIP_INCARNATION") == "0"
    joined = peer.joining             # a restarted process: it takes the state at attach
    x = np.full(LENGTH, float(peer.rank))
    policy = Asynchronous().attach(peer, [x])
    start = policy.step
    first_answer = None
    if joined:
        # Its exchanges, a step each 20 ms, up to the first one a member answered (not
        # refused): the members open their pairs at their first step in the new view.
        def answered():
            policy.after_step()
            stats = policy.stats()
            return stats["exchange_answers_taken"] > 0 and stats["exchanges_started"]
        first_answer = wait_until(answered, 30, what="a member's answer to the restarted peer")
    while peer.view.number < 1 and policy.step < 100_000:   # until the restart is back
        if first and peer.rank == victim and policy.step == kill_at:
            os.kill(os.getpid(), signal.SIGKILL)
        policy.after_step()
        # Steps of 2 ms (a small model's): the members' requests to the victim are still
        # unacknowledged when it dies, as in training, where the stall above showed.
        threading.Event().wait(0.002)
    train_in_view(peer, policy, ROUNDS_AFTER)
    stats = policy.stats()
    peer.barrier()
    policy.close()
    return (peer.world_size, peer.view.number, [m.name for m in peer.view.members], joined,
            dict(peer.join_stats), start, policy.step, sum(stats["messages_sent_to"]),
            sum(stats["messages_absorbed_from"]), first_answer)


def test_a_killed_asynchronous_peer_restarted_rejoins_takes_the_state_and_trains():
    results = spawn(asynchronous_restarted, n=4, timeout=150, args=(3, 200),
                    restarts={3: 1}, peer_timeout=PEER_TIMEOUT)
    for rank, r in enumerate(results):
        world, number, names, joined, join_stats, start, steps, sent, absorbed, first = r
        assert (world, number, names) == (4, 1, ["rank0", "rank1", "rank2", "rank3"]), r
        assert joined == (rank == 3), r                     # only the restart took the state
        # Every member, the restarted one too, pushed and absorbed in the new view.
        assert steps - start >= ROUNDS_AFTER and sent > 0 and absorbed > 0, r
    _, _, _, _, join_stats, start, *_, first = results[3]
    assert join_stats["state_bytes"] >= LENGTH * 8 and join_stats["donors"], join_stats
    assert start > 0          # it went on from its source's step, not from 0
    # The members went on at once after the switch. They stood still for 0.5 s while their old
    # transport closed (its link to the killed member lingered on data the dead never
    # acknowledged), refusing every request: the restarted peer's first 25 exchanges or so
    # were refused (all of them, in the demo's kill scenario, where it rejoined near the end).
    assert first <= 10, first


# ---------------------------------------------------------------- a leave
def asynchronous_leaver(peer, leaver, paused, exchange):
    from gossip.policies import Asynchronous
    first_rank = peer.rank
    x = np.full(LENGTH, float(peer.rank))
    policy = Asynchronous(exchange=exchange).attach(peer, [x])
    quiet = None
    # Paused: soon (what is exact does not need mixing); else once the four have mixed (a
    # push leaves every few steps here), so that the three then agree.
    leave_at = 20 if paused else 400
    while peer.world_size == 4 and policy.step < 100_000:
        if paused and policy.step == 10:
            policy.quiesce()                     # nothing in transit from here on
            stats = policy.stats()
            quiet = policy.weights[0], x.copy(), stats["background_rounds"]
        if first_rank == leaver and policy.step == leave_at:
            w = policy.weights[0]
            peer.leave()                         # at once: its mass goes with it
            return "left", w
        policy.after_step()
        _step()
    # A user's pause survives the change: no push until resume().
    stats = policy.stats()
    held = quiet is None or stats["background_rounds"] == quiet[2]
    restarted = stats.get("weights_restarted", 0)   # (push only: a pairwise w never drops)
    if paused:
        policy.resume()
    # (Not paused: on until the three agree, which the test asserts they do.)
    train_in_view(peer, policy, ROUNDS_AFTER, x=x, agree=None if paused else 0.05)
    w = policy.weights[0]
    peer.barrier()
    policy.close()
    return (peer.world_size, peer.view.number, repr(policy.topology), w, x.copy(), held,
            quiet and quiet[:2], restarted)


@pytest.mark.parametrize("exchange", ["push", "pairwise"])
@pytest.mark.parametrize("paused", [False, True])
def test_a_member_leaves_an_asynchronous_group_and_the_others_go_on_in_a_smaller_view(
        paused, exchange):
    from gossip.policies import Asynchronous
    results = spawn(asynchronous_leaver, n=4, timeout=150, args=(1, paused, exchange),
                    peer_timeout=PEER_TIMEOUT)
    assert results[1][0] == "left", results[1]
    left_w = results[1][1]
    rest = [results[r] for r in (0, 2, 3)]
    for world, number, topology, w, _, held, _, _ in rest:
        assert (world, number, topology, held) == (3, 1, "OnePeerExponential(3)", True)
        assert w > 0
    total_w = sum(r[3] for r in rest)
    mass = sum(r[3] * r[4] for r in rest)
    if paused:
        # Nothing in transit at the leave: exactly the leaver's (m, w) is gone, and every
        # weight is scaled by 3/4. No member restarts its weight, however light: none pushed
        # to the leaver since quiesce(), so none lost mass to it. Nothing more moves the
        # mass in the view of 3.
        quiet = [r[6] for r in rest]
        assert abs(sum(w for w, _ in quiet) + left_w - 4.0) < 1e-9, (quiet, left_w)
        kept = [w * 3 / 4 for w, _ in quiet]
        assert [r[7] for r in rest] == [0, 0, 0], rest
        assert abs(total_w - sum(kept)) < 1e-9, (total_w, kept)
        expected = sum(k * m for k, (_, m) in zip(kept, quiet))
        assert np.abs(mass - expected).max() < 1e-9, np.abs(mass - expected).max()
    else:
        # The leaver's mass and what was in transit went with it; the models, each
        # unchanged by the change itself, mix on in the view of three and agree (they went
        # on until they did: a view change that broke their mixing would time out).
        models = [r[4] for r in rest]
        assert max(float(np.abs(m - models[0]).max()) for m in models) < 0.1
