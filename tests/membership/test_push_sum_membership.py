"""Push-sum (SGP) follows membership view changes with its mass kept exact (PushSum's
docstring, "Views"): a joiner takes half of its donor's (x, w), a planned leaver hands its
(x, w) to a member, and every member then scales its pair by n_new / n_old, so the total
weight is the number of members and the consensus sum x / sum w is unchanged. Real peer
processes, real sockets; lr 0 (no local update: pure averaging), so the mass is all there
is to watch."""
from __future__ import annotations

import math
import os
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
PUSH_SUM_JOINER = _worker("push_sum_joiner.py")   # a joiner


def start_vector(rank: int) -> np.ndarray:
    return np.random.default_rng([17, rank]).normal(loc=rank, size=LENGTH)


def _pair(policy, x) -> tuple:
    """(x, w, the model x / w) of a one-bucket policy, as copies."""
    return policy.numerators[0].copy(), policy.weights[0], x.copy()


def _relative(a, b) -> float:
    return float(np.abs(np.asarray(a) - np.asarray(b)).max() / np.abs(np.asarray(b)).max())


def _members_and_joiners(tmp_path, members, args, joiners, timeout=60):
    """Spawn 3 members running ``members(peer, workdir, *args)`` while the joiner scripts
    (name -> (script path, args)) run as processes of their own; the members' results and each
    joiner's (exit code, output)."""
    workdir, outs = str(tmp_path), {}

    def run(name, script, extra):
        outs[name] = _run_joiner(workdir, script, extra, name, timeout=timeout)

    threads = [threading.Thread(target=run, args=(name, *job)) for name, job in joiners.items()]
    for t in threads:
        t.start()
    try:
        results = spawn(members, n=3, timeout=timeout, args=(workdir, *args),
                        peer_timeout=PEER_TIMEOUT)
    finally:
        for t in threads:
            t.join(timeout)
    return results, outs


# ---------------------------------------------------------------- joins
def push_sum_members(peer, workdir, overlap, size):
    from gossip.policies import PushSum
    _publish_address(peer, workdir)
    x = start_vector(peer.rank)
    policy = PushSum(overlap=overlap).attach(peer, [x])      # OnePeerExponential(n)
    at_change = []
    peer.on_view_change(lambda view: at_change.append(_pair(policy, x)))
    while peer.world_size < size and policy.step < 100_000:
        policy.after_step()
        np.ones((96, 96)) @ np.ones((96, 96))   # a step's compute
    return peer.world_size, peer.view.number, at_change[-1], _final_pair(peer, policy, x)


def _final_pair(peer, policy, x) -> tuple:
    """ROUNDS_AFTER more rounds, then the pair once every round is absorbed everywhere."""
    for _ in range(ROUNDS_AFTER):
        policy.after_step()
    policy.flush()
    final = _pair(policy, x)
    peer.barrier()
    policy.close()
    return final


def _joined(outs, name, path):
    code, out = outs[name]
    line = [ln.split() for ln in out.splitlines() if ln.startswith("JOINED")]
    assert code == 0 and line, out[-3000:]
    data = np.load(path)
    return line[0], (data["at_x"], float(data["at_w"]), data["at_m"]), \
        (data["x"], float(data["w"]), data["m"])


def _check_mass(pairs, expected_x, expected_w, what):
    total_x = sum(p[0] for p in pairs)
    total_w = sum(p[1] for p in pairs)
    assert _relative(total_x, expected_x) < 1e-12, (what, _relative(total_x, expected_x))
    assert abs(total_w - expected_w) / expected_w < 1e-12, (what, total_w, expected_w)


@pytest.mark.parametrize("overlap", [False, True])
def test_a_joiner_takes_half_of_its_donors_mass_and_the_total_weight_is_the_members(
        tmp_path, overlap):
    path = str(tmp_path / "joiner.npz")
    results, outs = _members_and_joiners(
        tmp_path, push_sum_members, (overlap, 4),
        {"joiner": (PUSH_SUM_JOINER, [overlap, ROUNDS_AFTER, path, LENGTH, 4])})
    (_, rank, size, number), at_join, final = _joined(outs, "joiner", path)
    assert (int(rank), int(size), int(number)) == (3, 4, 1)
    assert all(r[:2] == (4, 1) for r in results), [r[:2] for r in results]
    initial = sum(start_vector(r) for r in range(3))     # lr 0: rounds keep the mass
    # At the switch (nothing in transit: a boundary, the exchange in flight flushed): the
    # 3 members' mass, scaled by 4/3, over the 4; total weight 4.
    _check_mass([r[2] for r in results] + [at_join], initial * 4 / 3, 4.0, "at the join")
    # The joiner's model is its donor's, bitwise (k = 1: halves are exact), and weighs half.
    donors = [r[2] for r in results if r[2][2].tobytes() == at_join[2].tobytes()]
    assert donors and abs(donors[0][1] - at_join[1]) <= 1e-15 * at_join[1], \
        ([r[2][1] for r in results], at_join[1])
    # 60 rounds later: the same mass, and every model at the pre-join consensus.
    _check_mass([r[3] for r in results] + [final], initial * 4 / 3, 4.0, "after the rounds")
    mean = initial / 3
    for model in [r[3][2] for r in results] + [final[2]]:
        assert _relative(model, mean) < 1e-9, _relative(model, mean)


def test_two_joiners_from_one_donor_take_a_third_each(tmp_path):
    paths = {f"j{i}": str(tmp_path / f"j{i}.npz") for i in range(2)}
    results, outs = _members_and_joiners(
        tmp_path, push_sum_members, (False, 5),
        {name: (PUSH_SUM_JOINER, [False, ROUNDS_AFTER, path, LENGTH, 5])
         for name, path in paths.items()})
    joined = [_joined(outs, name, path) for name, path in paths.items()]
    assert sorted(int(j[0][1]) for j in joined) == [3, 4], [j[0] for j in joined]
    initial = sum(start_vector(r) for r in range(3))
    # Whether both came in one view (one donor, 3 shares: x - 2 fl(x / 3) is exact) or
    # in two: 5/3 of the mass, total weight 5.
    _check_mass([r[3] for r in results] + [j[2] for j in joined], initial * 5 / 3, 5.0,
                "after the rounds")
    for model in [r[3][2] for r in results] + [j[2][2] for j in joined]:
        assert _relative(model, initial / 3) < 1e-9


def donor_splits(peer, overlap, parts_list):
    """A member's pair split as a donor of k = parts - 1 joiners splits it: what it keeps
    and k shares (the state a joiner is sent) against the pair before, per k."""
    from gossip.policies import PushSum
    x = start_vector(peer.rank)
    policy = PushSum(overlap=overlap).attach(peer, [x])
    for _ in range(7):
        policy.after_step()                  # numerators mixed
    policy.flush()
    policy._scale(1 / 3 + peer.rank / 7)    # weights off one (a regular graph keeps them)
    out = {}
    for parts in parts_list:
        before = [a.copy() for a in policy.numerators], policy.weights
        policy._split(parts)
        state = policy.state_dict()          # what the joiners get
        policy.state_sent()
        kept = policy.numerators, policy.weights
        share_w = state["weights"][0]
        share_x = state["numerators"][0] if "numerators" in state else share_w * x
        # Summed exactly (fsum), so any error is the split's own.
        total_x = np.array([math.fsum([k] + [s] * (parts - 1))
                            for k, s in zip(kept[0][0], share_x)])
        total_w = math.fsum([kept[1][0]] + [share_w] * (parts - 1))
        out[parts] = (_relative(total_x, before[0][0]),
                      abs(total_w - before[1][0]) / before[1][0],
                      bool((kept[0][0] == share_x).all()), kept[1][0] == share_w,
                      before[1][0])
        policy._scale(float(parts))          # back to a pair like the one before
    policy.close()
    return out


@pytest.mark.parametrize("overlap", [False, True])
def test_a_donors_split_into_k_plus_1_shares_keeps_the_mass(overlap):
    out = spawn(donor_splits, n=2, timeout=30, args=(overlap, list(range(2, 10))))
    assert any(splits[2][4] != 1.0 for splits in out), out   # weights off one
    for rank, splits in enumerate(out):
        for parts, (error_x, error_w, equal_x, equal_w, _) in splits.items():
            # Exact when parts or parts - 1 is a power of two (w - 2 fl(w / 3) is exact, by
            # Sterbenz's lemma); otherwise off by the rounding of k fl(w / parts).
            exact = parts & (parts - 1) == 0 or (parts - 1) & (parts - 2) == 0
            assert error_w <= (0.0 if exact else 2.0 ** -52), (rank, parts, error_w)
            # Without overlap the numerators are split themselves; with it x = w m.
            assert error_x <= (0.0 if exact and not overlap else 1e-15), (rank, parts, error_x)
            if parts & (parts - 1) == 0:   # the source keeps one share itself, bitwise
                assert equal_w and (equal_x or overlap), (rank, parts)


# ---------------------------------------------------------------- a death, then a join
def push_sum_death_then_join(peer, workdir, victim):
    import topologies
    from helpers import export_and_die, quiet_point
    from gossip.policies import PushSum
    _publish_address(peer, workdir)
    x = start_vector(peer.rank)
    policy = PushSum(topology=topologies.Ring(4)).attach(peer, [x])   # undirected: exact
    for _ in range(5):
        policy.after_step()
    quiet_point(peer, victim)                    # nothing in transit when it dies
    if peer.rank == victim:
        export_and_die(os.path.join(workdir, "victim.npy"), policy.numerators[0].copy(),
                       policy.weights[0])
    # Rounds with the dead neighbour complete without it (exact on a ring); the coordinator
    # leaves it out of the view that takes the joiner in.
    while peer.view.number < 1 and policy.step < 100_000:   # until the joiner is in
        policy.after_step()
        np.ones((96, 96)) @ np.ones((96, 96))   # a step's compute
    for _ in range(ROUNDS_AFTER):
        policy.after_step()
    final = _pair(policy, x)
    peer.barrier()
    policy.close()
    return peer.world_size, peer.view.number, [m.name for m in peer.view.members], final


def test_a_join_after_a_death_leaves_the_dead_out_and_the_survivors_mass_stays(tmp_path):
    workdir, path, box = str(tmp_path), str(tmp_path / "joiner.npz"), {}
    victim_file = os.path.join(workdir, "victim.npy")

    def joiner():
        wait_until(lambda: os.path.exists(victim_file), 60, what="the victim's death")
        box["out"] = _run_joiner(workdir, PUSH_SUM_JOINER,
                                 [False, ROUNDS_AFTER, path, LENGTH, 4, "ring"], "joiner",
                                 timeout=60)

    thread = threading.Thread(target=joiner)
    thread.start()
    try:
        results = spawn(push_sum_death_then_join, n=4, timeout=60, args=(workdir, 3),
                        tolerate=(3,), peer_timeout=10)
    finally:
        thread.join(60)
    (_, rank, size, number), _, final = _joined({"joiner": box["out"]}, "joiner", path)
    survivors = results[:3]
    assert (int(rank), int(size), int(number)) == (3, 4, 1)
    for world, views, names, _ in survivors:    # the dead one out, the joiner in its place
        assert (world, views, names) == (4, 1, ["rank0", "rank1", "rank2", "joiner"])
    dead = np.load(victim_file)
    # n_new / n_old = 4 / 4: the survivors' total, the initial one minus what the dead
    # peer held, is what the 4 hold now; every model at the survivors' consensus.
    left_x = sum(start_vector(r) for r in range(4)) - dead[:-1]
    left_w = 4.0 - dead[-1]
    _check_mass([r[3] for r in survivors] + [final], left_x, left_w, "after the rounds")
    for model in [r[3][2] for r in survivors] + [final[2]]:
        assert _relative(model, left_x / left_w) < 1e-9, _relative(model, left_x / left_w)


# ---------------------------------------------------------------- a planned leave
def push_sum_leaver(peer, overlap, leaver):
    from gossip.policies import PushSum
    first_rank = peer.rank
    x = start_vector(peer.rank)
    policy = PushSum(overlap=overlap).attach(peer, [x])
    at_change = []
    peer.on_view_change(lambda view: at_change.append(_pair(policy, x)))
    while peer.world_size == 4 and policy.step < 100_000:
        if first_rank == leaver and policy.step == 20:
            peer.leave()                         # rounds to the boundary, mass handed over
            # (closed now, so read the pair itself: what it still holds)
            return "left", policy._w[0] if overlap else float(policy._z[0][-1])
        policy.after_step()
        np.ones((96, 96)) @ np.ones((96, 96))   # a step's compute
    return peer.world_size, peer.view.number, at_change[-1], _final_pair(peer, policy, x)


@pytest.mark.parametrize("overlap", [False, True])
def test_a_member_that_leaves_hands_its_mass_over_and_the_consensus_stays(overlap):
    results = spawn(push_sum_leaver, n=4, timeout=60, args=(overlap, 1),
                    peer_timeout=PEER_TIMEOUT)
    assert results[1] == ("left", 0.0), results[1]
    rest = [results[r] for r in (0, 2, 3)]
    assert all(r[:2] == (3, 1) for r in rest), [r[:2] for r in rest]
    initial = sum(start_vector(r) for r in range(4))
    # The leaver's pair went to a member, then 3/4 of the whole: total weight 3, and the
    # consensus sum x / sum w still the 4 starting vectors' mean.
    _check_mass([r[2] for r in rest], initial * 3 / 4, 3.0, "at the leave")
    _check_mass([r[3] for r in rest], initial * 3 / 4, 3.0, "after the rounds")
    for model in [r[3][2] for r in rest]:
        assert _relative(model, initial / 4) < 1e-9, _relative(model, initial / 4)


# ---------------------------------------------------------------- the door
def refusal_with_push_sum(peer):
    from gossip.policies import PushSum
    policy = PushSum().attach(peer, [np.zeros(4)])
    why = peer.membership.refusal()
    policy.close()
    return why


def test_joiners_are_not_refused_while_push_sum_is_attached():
    assert spawn(refusal_with_push_sum, n=2, timeout=30) == [None, None]


def refusal_with_choco(peer):
    from gossip.policies import Choco
    policy = Choco(compression="topk:0.5").attach(peer, [np.zeros(4)])
    why = peer.membership.refusal()
    policy.close()
    return why


def test_joiners_are_not_refused_while_choco_is_attached():
    # Choco restarts its public copies at every view change (test_choco_membership.py).
    assert spawn(refusal_with_choco, n=2, timeout=30) == [None, None]
