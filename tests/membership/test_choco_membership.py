"""CHOCO-SGD across view changes: a joiner (4 -> 5) and a death (4 -> 3) are view changes at
which every member restarts its public copies over the new graph, so the copies stay the same
on every neighbour and the consensus reaches the exact mean of the models at the switch (lr 0:
only the consensus moves them). Real processes, real sockets, a real SIGKILL."""
from __future__ import annotations

import os
import signal

import numpy as np
import pytest

from gossip.testing import spawn
from test_membership import _members_beside, _publish_address, _run_joiner, _worker

# Processes the tests start beside their groups (joiners, restarted members, launchers) must
# hold the group's key: every test here gets one (tests/conftest.py's group_key).
pytestmark = pytest.mark.usefixtures("group_key")

COUNT = 500
ROUNDS_AFTER = 160   # int8, gamma 1: 120 rounds reach 1e-9 on a ring of 4 from the start
POLICY = 'Choco(consensus_step=1.0, compression="int8")'


def train(x, rank):
    """Before the switch, a step of local training: each peer its own direction, so the
    models and their public copies are far apart when the view changes (at consensus, copies
    kept over the old graph would go unnoticed)."""
    x += 0.05 * np.sin(np.arange(x.size) * (rank + 1))


def members(peer, workdir, size):
    from gossip.policies import Choco   # noqa: F401 (POLICY names it)
    _publish_address(peer, workdir)
    x = np.random.default_rng(peer.rank).standard_normal(COUNT)
    policy = eval(POLICY).attach(peer, [x])
    at = {}
    # The rounds after the switch count from its step, the view's, as the joiner's do: a
    # count from each side's own policy.step at the change was one round apart now and then
    # (CI), and the members closed while the joiner still waited on its last round.
    peer.on_view_change(lambda view: at.update(step=view.step, x=x.copy()))
    while (peer.world_size < size or policy.step < at["step"] + ROUNDS_AFTER) and \
            policy.step < 100_000:
        if not at:
            train(x, peer.rank)
        policy.after_step()            # after the switch lr = 0: the consensus alone
    policy.close()
    return peer.world_size, peer.view.number, at["x"], x.copy()


def test_a_joiner_enters_a_running_choco_group_and_the_consensus_is_exact(tmp_path):
    workdir, path, box = str(tmp_path), str(tmp_path / "joiner.npz"), {}

    def joiner():
        _, box["out"] = _run_joiner(workdir, _worker("choco_joiner.py"),
                                    [COUNT, ROUNDS_AFTER, path], "joiner", POLICY=POLICY)

    results, line = _members_beside(joiner, box, members, (workdir, 4), "JOINED",
                                    timeout=150)
    assert line, box.get("out", "")[-3000:]
    _, rank, size, number = line[0].split()
    assert (int(rank), int(size), int(number)) == (3, 4, 1)
    assert all(r[:2] == (4, 1) for r in results), [r[:2] for r in results]
    data = np.load(path)
    # The joiner's parameters are a member's, as that member held them at the switch.
    assert any(np.array_equal(data["at"], r[2]) for r in results)
    mean = np.mean([r[2] for r in results] + [data["at"]], axis=0)
    for final in [r[3] for r in results] + [data["x"]]:
        assert np.abs(final - mean).max() < 1e-9, np.abs(final - mean).max()


VICTIM, KILL_STEP = 3, 30


def survivors(peer):
    from gossip.policies import Choco   # noqa: F401
    x = np.random.default_rng(peer.rank).standard_normal(COUNT)
    policy = eval(POLICY).attach(peer, [x])
    at = {}
    peer.on_view_change(lambda view: at.update(step=policy.step, x=x.copy()))
    while not at or policy.step < at["step"] + ROUNDS_AFTER:
        if peer.rank == VICTIM and policy.step == KILL_STEP:
            os.kill(os.getpid(), signal.SIGKILL)
        if not at:
            train(x, peer.rank)
        policy.after_step()
        if policy.step > 100_000:
            raise RuntimeError("no view change")
    policy.close()
    return peer.world_size, peer.view.number, at["x"], x.copy()


def test_choco_survivors_of_a_death_re_form_and_reach_the_exact_mean():
    out = spawn(survivors, n=4, timeout=120, peer_timeout=10, tolerate=[VICTIM])
    assert out[VICTIM] is None
    alive = [out[r] for r in range(4) if r != VICTIM]
    assert all(r[:2] == (3, 1) for r in alive), [r[:2] for r in alive]
    mean = np.mean([r[2] for r in alive], axis=0)
    for _, _, _, final in alive:
        assert np.abs(final - mean).max() < 1e-9, np.abs(final - mean).max()
