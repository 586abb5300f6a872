"""broadcast_optimizer_state (Horovod's): root's optimizer state on every peer, over real
peers, for SGD with momentum and Adam (plain and wrapped in a DistributedOptimizer), and a peer
whose optimizer holds other parameters failing on every peer."""
from __future__ import annotations

import numpy as np

import gossip
from gossip.testing import spawn
from helpers import mlp, regression_batch


def _plain(x):
    """A state dict with its tensors as (dtype, numpy array) pairs, to come back from a peer."""
    import torch
    if isinstance(x, dict):
        return {k: _plain(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_plain(v) for v in x]
    if isinstance(x, torch.Tensor):
        return (str(x.dtype), x.detach().numpy().copy())
    return x


def _same(a, b) -> bool:
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    if isinstance(a, list):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b))
    if isinstance(a, tuple):   # a tensor
        return isinstance(b, tuple) and a[0] == b[0] and np.array_equal(a[1], b[1])
    return a == b


def optimizer_states(peer):
    import torch
    r = peer.rank
    out = {}
    for name, make in (("sgd", lambda p: torch.optim.SGD(p, lr=0.1 * (r + 1), momentum=0.9)),
                       ("adam", lambda p: torch.optim.Adam(p, lr=1e-3 * (r + 1)))):
        model = mlp(seed=r)
        opt = make(model.parameters())
        for step in range(r + 1):   # different states (and steps) on every peer
            x, y = regression_batch(r, step)
            opt.zero_grad()
            torch.nn.functional.mse_loss(model(x), y).backward()
            opt.step()
        gossip.broadcast_optimizer_state(opt, root=1, peer=peer)
        out[name] = _plain(opt.state_dict())
    # Wrapped: the wrapped optimizer's state (a step of every peer, then root's own change).
    model = mlp(seed=0)
    wrapped = gossip.DistributedOptimizer(torch.optim.Adam(model.parameters(), lr=1e-3),
                                          peer=peer, policy="synchronous")
    x, y = regression_batch(r, 0)
    wrapped.zero_grad()
    torch.nn.functional.mse_loss(model(x), y).backward()
    wrapped.step()
    if r == 0:
        for state in wrapped.optimizer.state.values():
            state["exp_avg"].add_(1.0)
    gossip.broadcast_optimizer_state(wrapped, root=0, peer=peer)
    out["wrapped"] = _plain(wrapped.optimizer.state_dict())
    wrapped.close()
    # An optimizer over other parameters on one peer: every peer raises, naming it.
    other = torch.optim.SGD(mlp(seed=0, sizes=(20, 8, 8, 5) if r == 2 else (20, 32, 5))
                            .parameters(), lr=0.1, momentum=0.9)
    for p in other.param_groups[0]["params"]:
        other.state[p]["momentum_buffer"] = torch.ones_like(p)
    try:
        gossip.broadcast_optimizer_state(other, root=0, peer=peer)
        out["refused"] = None
    except Exception as exc:
        out["refused"] = f"{type(exc).__name__}: {exc}"
    return out


def test_every_peer_takes_the_roots_optimizer_state():
    n = 3
    out = spawn(optimizer_states, n=n, timeout=120)
    for name, root in (("sgd", 1), ("adam", 1), ("wrapped", 0)):
        want = out[root][name]
        assert want["state"], name   # (something to compare: root stepped)
        for r in range(n):
            assert _same(out[r][name], want), (name, r)
    assert out[0]["sgd"]["param_groups"][0]["lr"] == 0.2   # root 1's, not rank 0's 0.1
    assert float(out[2]["adam"]["state"][0]["step"][1]) == 2   # root's two steps
    for r in range(n):
        refused = out[r]["refused"]
        assert refused is not None, r
        if r == 2:   # its own error: the optimizer's load_state_dict says why
            assert "ValueError" in refused or "RuntimeError" in refused, refused
        else:
            assert f"rank {r}: broadcast_optimizer_state: rank(s) [2] could not load rank 0's" \
                in refused, refused
