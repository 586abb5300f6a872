"""A step that a recovery cuts off is applied exactly once (issue #35, defect 2): whatever the
parameters are (numpy arrays under a parameter-side policy, a torch model under
DistributedOptimizer), after a death (elastic=True), a restart of the dead slot, or a planned
leave, every member ends where a group without the interruption would. An ElasticSampler
hands a step that is begun again out again, so no sample is trained twice or skipped; a step
completed in the new view keeps its batches (the dead member's is lost with its update).
Real processes, real sockets, real SIGKILLs."""
from __future__ import annotations

import json
import os
import signal

import numpy as np
import pytest

from gossip.testing import spawn

PEER_TIMEOUT = 30.0


def _victim(peer) -> bool:
    """Whether this process is the first incarnation of slot rank2 (the one that dies)."""
    return peer.rank == 2 and os.environ.get("GOSSIP_INCARNATION", "0") == "0"


def _make(kind: str):
    from gossip.policies import LocalSGD, Synchronous
    if kind == "synchronous":
        return Synchronous(elastic=True)
    if kind == "local-sgd":
        return LocalSGD(period=4, elastic=True)
    if kind == "diloco":
        return LocalSGD(period=4, elastic=True, outer_optimizer="diloco")
    raise ValueError(kind)


# ---------------------------------------------------------------- numpy, parameter side
def counting(peer, kind, kill_at, total):
    """x = 0, then x += 1 before each after_step(); the slot rank2 SIGKILLs itself at step
    ``kill_at`` after its update, before its after_step() (the others are in that step's
    averaging then, or reach it)."""
    x = np.zeros(10)
    policy = _make(kind).attach(peer, [x])
    victim = _victim(peer)
    while policy.step < total:
        x += 1.0
        if victim and policy.step == kill_at:
            os.kill(os.getpid(), signal.SIGKILL)
        policy.after_step()
    return policy.step, peer.world_size, x.tobytes()


@pytest.mark.parametrize("kind, kill_at", [("synchronous", 20), ("local-sgd", 19),
                                           ("local-sgd", 18)])
def test_a_step_cut_off_by_a_death_is_applied_once(kind, kill_at):
    # local-sgd averages after steps 3, 7, ..., 19: killed at 19 its averaging is cut off;
    # at 18 the others take step 18 alone and the averaging of step 19 fails.
    results = spawn(counting, n=4, timeout=120, args=(kind, kill_at, 60), tolerate=(2,),
                    peer_timeout=PEER_TIMEOUT)
    assert results[2] is None
    for steps, world, x in (results[0], results[1], results[3]):
        assert (steps, world) == (60, 3)
        assert np.frombuffer(x).tolist() == [60.0] * 10   # not 61: one update per step


def test_diloco_completes_the_outer_step_a_death_cut_off():
    # Every replica's update is the same, so the group's trajectory does not depend on its
    # size: three peers that never lost one are the reference, to the last bit.
    reference = spawn(counting, n=3, timeout=120, args=("diloco", -1, 60),
                      peer_timeout=PEER_TIMEOUT)
    results = spawn(counting, n=4, timeout=120, args=("diloco", 19, 60), tolerate=(2,),
                    peer_timeout=PEER_TIMEOUT)
    expected = reference[0][2]
    assert np.frombuffer(expected)[0] != 60.0   # (the outer optimizer's momentum shows)
    for steps, world, x in (results[0], results[1], results[3]):
        assert (steps, world) == (60, 3)
        assert x == expected, (np.frombuffer(x)[0], np.frombuffer(expected)[0])


def counting_with_restart(peer, total):
    x = np.zeros(10)
    policy = _make("synchronous").attach(peer, [x])   # a restart takes the state here
    victim = _victim(peer)
    while (policy.step < total or peer.world_size < 4) and policy.step < 100_000:
        x += 1.0
        if victim and policy.step == 20:
            os.kill(os.getpid(), signal.SIGKILL)
        policy.after_step()
        np.ones((64, 64)) @ np.ones((64, 64))   # a step's compute
    return policy.step, peer.world_size, x.tobytes()


def test_a_step_cut_off_by_a_death_is_applied_once_when_the_slot_restarts():
    results = spawn(counting_with_restart, n=4, timeout=150, args=(60,), restarts={2: 1},
                    peer_timeout=PEER_TIMEOUT)
    steps = results[0][0]
    assert {(r[0], r[1]) for r in results} == {(steps, 4)}   # one step, one view
    assert steps >= 60
    for _, _, x in results:   # the restarted slot too: it took a replica's state
        assert np.frombuffer(x).tolist() == [float(steps)] * 10


def counting_with_a_leave(peer, total):
    from gossip.policies import Synchronous
    x = np.zeros(10)
    policy = Synchronous().attach(peer, [x])   # not elastic: a leave is no failure
    first = peer.rank
    while policy.step < total:
        if first == 1 and policy.step == 10:
            peer.leave()
            return "left"
        x += 1.0
        policy.after_step()
    return policy.step, peer.world_size, x.tobytes()


def test_a_step_cut_off_by_a_planned_leave_is_applied_once():
    results = spawn(counting_with_a_leave, n=4, timeout=120, args=(40,),
                    peer_timeout=PEER_TIMEOUT)
    assert results[1] == "left"
    for steps, world, x in (results[0], results[2], results[3]):
        assert (steps, world) == (40, 3)
        assert np.frombuffer(x).tolist() == [40.0] * 10


# ---------------------------------------------------------------- torch, gradient side
def torch_training(peer, total):
    """Every rank trains on the batch of the step count (the same everywhere), so the
    group's trajectory is that of one process on the same batches, whatever its size."""
    import torch
    import gossip
    torch.manual_seed(0)
    model = torch.nn.Linear(8, 1)
    opt = gossip.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.05,
                                                      momentum=0.9),
                                      peer=peer, policy=_make("synchronous"))
    victim = _victim(peer)
    while opt.policy.step < total:
        if victim and opt.policy.step == 20:   # before its backward launches any allreduce
            os.kill(os.getpid(), signal.SIGKILL)
        x, y = _batch(opt.policy.step)
        opt.zero_grad()
        torch.nn.functional.mse_loss(model(x), y).backward()
        opt.step()
    return opt.policy.step, peer.world_size, [p.detach().numpy().copy()
                                              for p in model.parameters()]


def _batch(step):
    import torch
    g = torch.Generator().manual_seed(step)
    x = torch.randn(16, 8, generator=g)
    return x, x.sum(dim=1, keepdim=True)


def test_a_torch_step_cut_off_by_a_death_is_done_again_exactly_once():
    torch = pytest.importorskip("torch")
    results = spawn(torch_training, n=4, timeout=150, args=(60,), tolerate=(2,),
                    peer_timeout=PEER_TIMEOUT, preload=("torch",))
    torch.manual_seed(0)
    model = torch.nn.Linear(8, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    for step in range(60):
        x, y = _batch(step)
        opt.zero_grad()
        torch.nn.functional.mse_loss(model(x), y).backward()
        opt.step()
    expected = [p.detach().numpy() for p in model.parameters()]
    for steps, world, params in (results[0], results[1], results[3]):
        assert (steps, world) == (60, 3)
        for mine, theirs in zip(params, expected):
            np.testing.assert_allclose(mine, theirs, rtol=1e-5, atol=1e-6)


# ---------------------------------------------------------------- the elastic sampler
def sampled_epoch(peer, workdir, kind, length):
    """One epoch of an ElasticSampler; each member logs the batches of the steps it
    completed (the step count moved on), the dying one too until its death."""
    import gossip
    sampler = gossip.ElasticSampler(length, batch_size=4, peer=peer, seed=3)
    first = peer.rank
    victim = _victim(peer)
    took: list[int] = []
    if kind == "torch":
        import torch
        model = torch.nn.Linear(1, 1)
        opt = gossip.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.01),
                                          peer=peer, policy=_make("synchronous"))
        policy = opt.policy
    else:
        x = np.zeros(4)
        policy = _make("synchronous").attach(peer, [x])
    with open(os.path.join(workdir, f"trained-{first}"), "w") as log:
        for indices in sampler:
            before = policy.step
            if kind == "torch":
                if victim and before == 20:   # before its backward launches any allreduce
                    os.kill(os.getpid(), signal.SIGKILL)
                data = torch.tensor(indices, dtype=torch.float32).reshape(-1, 1)
                opt.zero_grad()
                model(data).sum().backward()
                opt.step()   # the gradients' allreduce: cut off at step 20, begun again
            else:
                x += 1.0
                if victim and before == 20:
                    os.kill(os.getpid(), signal.SIGKILL)
                policy.after_step()   # the parameters' allreduce: completed at step 20
            if policy.step > before:
                log.write(json.dumps(indices) + "\n")
                log.flush()
            if policy.step > before + 1:   # took a source's state that completes the next
                took.append(before + 1)     # step: that step's own batch never came
    return policy.step, peer.world_size, took


@pytest.mark.parametrize("kind", [pytest.param("torch", marks=pytest.mark.slow), "numpy"])
def test_no_sample_is_trained_twice_or_skipped_when_a_death_cuts_a_step_off(tmp_path, kind):
    if kind == "torch":
        pytest.importorskip("torch")
    length = 4 * 4 * 30 + 6   # 30 steps of 4 peers, then fewer peers, a short last step
    results = spawn(sampled_epoch, n=4, timeout=150, args=(str(tmp_path), kind, length),
                    tolerate=(2,), peer_timeout=PEER_TIMEOUT,
                    preload=("torch",) if kind == "torch" else ())
    assert results[2] is None and {r[1] for r in results if r} == {3}
    trained = []
    for rank in range(4):
        with open(tmp_path / f"trained-{rank}") as f:
            trained += [i for line in f for i in json.loads(line)]
    assert len(trained) == len(set(trained)), "a sample trained twice"
    skipped = set(range(length)) - set(trained)
    if kind == "torch":   # step 20 is begun again: its positions cut over the survivors
        assert not skipped, f"{len(skipped)} samples skipped"
    else:
        # The victim dies after its step 19 completed there, before its update of step 20
        # is combined; its last sends of step 19 may die with it (SIGKILL drops what its
        # sockets still queue), so a survivor may still be in step 19 then. Three timings:
        # - every survivor completed 19: step 20 is completed over the survivors' own
        #   updates; the victim's batch of it (positions 8-11 of the step's 16) went down
        #   with its update;
        # - some survivors are behind: each takes the state of one that completed 19, whose
        #   update of step 20 stands for its own: its batch of step 20 is never handed out
        #   (seen in CI), besides the victim's;
        # - every survivor is behind: they complete 19 over their own updates and step 20
        #   is cut from the new view: nothing is skipped.
        order = np.random.default_rng((3, 0)).permutation(length)
        behind = [rank for rank, r in enumerate(results) if r and r[2]]
        assert all(results[rank][2] == [20] for rank in behind), results
        lost = [2] + behind
        expected = {int(order[20 * 16 + 4 * rank + i]) for rank in lost for i in range(4)}
        assert skipped in (expected, set()), (sorted(skipped), behind)
        if not skipped:
            assert not behind, behind
