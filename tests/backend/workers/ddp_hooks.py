"""Run under torchrun (3 ranks): gossip's DDP communication hooks on the "gossip" backend,
each against the same training done by hand. Prints "OK <what>"; a mismatch raises."""
import copy
import sys

import torch
import torch.distributed as dist

from gossip import ddp_hooks   # (importing gossip after torch registers the backend)

STEPS = 4


def say(*parts) -> None:
    """One write per line: the ranks share torchrun's stdout, and print() writes the text
    and its newline apart, so lines of two ranks could run into each other."""
    sys.stdout.write(" ".join(str(p) for p in parts) + "\n")
    sys.stdout.flush()


def batches(n):
    return {k: [torch.randn(16, 6, generator=torch.Generator().manual_seed(100 * k + s))
                for s in range(STEPS)] for k in range(n)}


def model_and_reference():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(6, 8), torch.nn.Tanh(), torch.nn.Linear(8, 1))
    return model, copy.deepcopy(model)


def train(hook, state, r, n, data):
    """DDP with ``hook`` on this rank; the reference takes the ranks' mean gradient."""
    model, reference = model_and_reference()
    ddp = torch.nn.parallel.DistributedDataParallel(model)
    if hook is not None:
        ddp.register_comm_hook(state, hook)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.1)
    ref_opt = torch.optim.SGD(reference.parameters(), lr=0.1)
    for s in range(STEPS):
        opt.zero_grad()
        ddp(data[r][s]).pow(2).mean().backward()
        opt.step()
        ref_opt.zero_grad()
        (sum(reference(data[k][s]).pow(2).mean() for k in range(n)) / n).backward()
        ref_opt.step()
    return model, reference


def hand_periodic(n, data, period, lr, momentum):
    """Every rank's replica under DiLoCo's rule as the hooks apply it: iteration 0 steps on
    the mean gradient and the anchor is taken after it; at iteration 1 + kH the gradient is
    taken at the replica's parameters, the anchor moves by the outer step on the mean
    pseudo-gradient (torch.optim.SGD's Nesterov rule), the replicas are set to the anchor,
    then the inner step (lr 0.1) applies the gradient taken before."""
    replicas = [model_and_reference()[0] for _ in range(n)]
    flat = lambda m: torch.cat([p.detach().reshape(-1) for p in m.parameters()])  # noqa: E731
    anchor, buf = None, None
    for s in range(STEPS):
        grads = []
        for k, m in enumerate(replicas):
            m.zero_grad()
            m(data[k][s]).pow(2).mean().backward()
            grads.append([p.grad.clone() for p in m.parameters()])
        if s == 0:
            grads = [[sum(g) / n for g in zip(*grads)]] * n
        elif s == 1:
            anchor = flat(replicas[0]).clone()
        elif (s - 1) % period == 0:
            g = sum(anchor - flat(m) for m in replicas) / n
            if momentum:
                buf = g.clone() if buf is None else momentum * buf + g
                g = g + momentum * buf
            anchor = anchor - lr * g
            for m in replicas:
                torch.nn.utils.vector_to_parameters(anchor.clone(), m.parameters())
        with torch.no_grad():
            for m, gs in zip(replicas, grads):
                for p, gp in zip(m.parameters(), gs):
                    p -= 0.1 * gp
    return replicas


def gap(model, reference):
    return max(float((p - q).detach().abs().max()) for p, q in zip(model.parameters(),
                                                            reference.parameters()))


def replicas_equal(model):
    flat = torch.cat([p.detach().reshape(-1) for p in model.parameters()])
    every = [torch.empty_like(flat) for _ in range(dist.get_world_size())]
    dist.all_gather(every, flat)
    return all(torch.equal(every[0], f) for f in every)


def main():
    dist.init_process_group("gossip")
    r, n = dist.get_rank(), dist.get_world_size()
    data = batches(n)

    state = ddp_hooks.HookState()
    model, reference = train(ddp_hooks.allreduce_hook, state, r, n, data)
    assert gap(model, reference) < 1e-6, gap(model, reference)
    assert state.step == STEPS, state.step
    say("OK allreduce_hook")

    for codec, bound in (("fp16", 1e-2), ("bf16", 5e-2), ("int8", 5e-2)):
        model, reference = train(ddp_hooks.allreduce_hook, ddp_hooks.HookState(
            compression=codec), r, n, data)
        assert 0 < gap(model, reference) < bound, (codec, gap(model, reference))
        assert replicas_equal(model), codec   # every rank decoded the same bytes
        say("OK codec", codec, gap(model, reference))

    state = ddp_hooks.HookState(compression="topk:0.25")
    model, _ = train(ddp_hooks.allreduce_hook, state, r, n, data)
    assert replicas_equal(model)
    residual = state.state_dict()["residuals"]
    assert residual and all(float(v.abs().sum()) > 0 for v in residual.values()), residual
    say("OK topk_feedback")

    # Ring(3) is the complete graph: one neighbour round is the exact mean.
    model, reference = train(ddp_hooks.gossip_hook, ddp_hooks.HookState(), r, n, data)
    assert gap(model, reference) < 1e-6, gap(model, reference)
    say("OK gossip_hook")

    # DiLoCo (period 2, outer Nesterov SGD 0.7/0.9) and local SGD (outer lr 1), against
    # every replica simulated here; iteration 3 is the outer step.
    for name, hook, lr, momentum in (("diloco_hook", ddp_hooks.diloco_hook, 0.7, 0.9),
                                     ("local_sgd_hook", ddp_hooks.local_sgd_hook, 1.0, 0.0)):
        state = ddp_hooks.HookState(period=2)
        model, _ = train(hook, state, r, n, data)
        want = hand_periodic(n, data, 2, lr, momentum)[r]
        far = max(float((p - q).abs().max()) for p, q in zip(model.parameters(),
                                                              want.parameters()))
        assert far < 1e-5, (name, far)
        assert not replicas_equal(model)    # iteration 3 was local again
        assert state.state_dict()["anchors"] and state.step == STEPS
        say("OK", name, far)

    # torch's own local SGD over the gossip backend: no gradient traffic after step 2,
    # parameters averaged every 2 steps by PeriodicModelAverager (dist.all_reduce).
    from torch.distributed.algorithms.ddp_comm_hooks.post_localSGD_hook import (
        PostLocalSGDState, post_localSGD_hook)
    from torch.distributed.algorithms.model_averaging.averagers import PeriodicModelAverager
    model, _ = model_and_reference()
    ddp = torch.nn.parallel.DistributedDataParallel(model)
    alone, _ = dist.new_subgroups(group_size=1)   # after step 2 no gradient is exchanged
    ddp.register_comm_hook(PostLocalSGDState(process_group=None, subgroup=alone,
                                             start_localSGD_iter=2), post_localSGD_hook)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.1)
    averager = PeriodicModelAverager(period=2, warmup_steps=2)
    for s in range(STEPS):
        opt.zero_grad()
        ddp(data[r][s]).pow(2).mean().backward()
        opt.step()
        averager.average_parameters(ddp.parameters())
    # Steps 0-1 allreduced the gradients, step 2 was local and then averaged, step 3 local
    # only: the replicas are apart; the averager's next period brings them together.
    assert not replicas_equal(model)
    averager.average_parameters(ddp.parameters())
    assert replicas_equal(model)
    say("OK post_localSGD")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
