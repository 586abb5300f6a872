"""The torch integration: an optimizer wrapper that runs an averaging policy around each step,
and a helper that starts every peer from the same weights.

    peer = gossip.init()
    gossip.broadcast_parameters(model, root=0, peer=peer)
    opt = gossip.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                      peer=peer, policy="gossip")
    for x, y in data:
        opt.zero_grad()
        loss_fn(model(x), y).backward()
        opt.step()           # policy.after_backward(); optimizer.step(); policy.after_step()
    opt.close()

There is no module-level default peer (two groups may live in one process): pass the peer
you got from ``gossip.init()``. torch is imported lazily, so ``import gossip`` stays light.
"""
from __future__ import annotations

import logging
from collections import Counter
from typing import TYPE_CHECKING, Any, Callable, Iterable, Protocol, TypeVar

import numpy as np

from collectives.arrays import Array
from gossip.policies.base import ParameterSource, Policy, PolicyHost, is_torch_tensor
from gossip.policies.registry import resolve

if TYPE_CHECKING:
    import torch

_Loss = TypeVar("_Loss")   # what a step's closure returns (a loss tensor, a float)


class OptimizerPeer(PolicyHost, Protocol):
    """What DistributedOptimizer and broadcast_parameters ask of their peer (gossip.Peer is
    one): what the policy asks of it, and whether it is entering a running job."""

    @property
    def entering(self) -> bool:
        """True from a join until its first step of its own (Peer.entering)."""
        ...

__all__ = ["DistributedOptimizer", "OptimizerPeer", "broadcast_parameters", "require_peer",
           "POLICY_STATE_KEY"]

#: Key under which DistributedOptimizer.state_dict() keeps the policy's own state.
POLICY_STATE_KEY = "gossip_policy"

log = logging.getLogger("gossip")


def require_peer(peer: OptimizerPeer | None, what: str) -> OptimizerPeer:
    if peer is None:
        raise ValueError(f"{what} needs peer=...: pass the Peer from gossip.init() (there is no "
                         "module-level default peer, so two groups can share a process)")
    for attr in ("rank", "world_size", "broadcast", "entering"):
        if not hasattr(peer, attr):
            raise TypeError(f"peer must be a gossip.Peer (from gossip.init()), got "
                            f"{type(peer).__name__}")
    return peer


def _names_of(params: list, named: list) -> list[str]:
    """Each of the optimizer's ``params``' name in ``named`` ((name, parameter) pairs, as
    model.named_parameters() gives them), else ValueError, as Horovod refuses them: an item
    that is not a pair, a name given twice, or a parameter of the optimizer left unnamed."""
    if any(not isinstance(item, tuple) or len(item) != 2 for item in named):
        raise ValueError("named_parameters must be (name, parameter) pairs, as "
                         "model.named_parameters() gives them")
    twice = sorted(name for name, k in Counter(str(n) for n, _ in named).items() if k > 1)
    if twice:
        raise ValueError(f"named_parameters names {', '.join(twice)} more than once: "
                         f"parameter names must be unique")
    by_id = {id(p): str(n) for n, p in named}
    unnamed = [i for i, p in enumerate(params) if id(p) not in by_id]
    if unnamed:
        raise ValueError(f"named_parameters leaves {len(unnamed)} of the optimizer's "
                         f"{len(params)} parameters unnamed (positions {unnamed[:8]} in "
                         f"param_groups order): pass every parameter, or none")
    return [by_id[id(p)] for p in params]


class DistributedOptimizer:
    """Wrap a torch optimizer so each ``step()`` runs an averaging policy around it:
    ``policy.after_backward()`` (gradient averaging), ``optimizer.step()``,
    ``policy.after_step()`` (parameter averaging).

    ``named_parameters``: the model's ``named_parameters()`` (as Horovod takes them), so
    errors name a parameter ("fc.weight"); an optimizer built from ``named_parameters()``
    carries the names itself.

    ``policy``: a Policy instance, or one of the names of gossip.policies.names()
    ("synchronous", "local-sgd", "gossip", "asynchronous", "push-sum", "easgd", "choco") made with
    its defaults. On construction the policy is attached to the optimizer's parameters (in
    param_groups order), which packs them into buckets: ``param.data`` becomes a view of a
    bucket, so build the optimizer after moving the model to its device. An already attached
    policy is accepted if it holds exactly these parameters.

    Everything else is the wrapped optimizer's: ``param_groups``, ``state``, ``defaults`` and
    any other attribute are forwarded, so an LR scheduler built on ``opt.optimizer`` changes
    the same param_groups. ``zero_grad()`` zeroes the gradient buckets in place when the
    policy averages gradients (keeping ``param.grad`` a view of them: no per-step copy), else
    forwards. ``state_dict()`` is the optimizer's, plus the policy's state under the key
    ``"gossip_policy"``; ``load_state_dict()`` accepts both that and a plain optimizer state
    dict. A ``closure`` given to step() runs before the communication (one evaluation; LBFGS,
    which evaluates several times, is not supported).
    """

    def __init__(self, optimizer: torch.optim.Optimizer, peer: OptimizerPeer | None = None,
                 policy: str | Policy = "synchronous", *,
                 named_parameters: Iterable[tuple[str, Any]] | None = None) -> None:
        if not hasattr(optimizer, "param_groups") or not callable(
                getattr(optimizer, "step", None)):
            raise TypeError(f"optimizer must be a torch.optim.Optimizer, got "
                            f"{type(optimizer).__name__}")
        if isinstance(optimizer, DistributedOptimizer):
            raise TypeError("the optimizer is already a DistributedOptimizer")
        policy = resolve(policy)
        params: list = []
        names: list[str] | None = []
        seen: set[int] = set()
        for group in optimizer.param_groups:
            # torch keeps the names of an optimizer built from model.named_parameters().
            group_names = group.get("param_names")
            for k, p in enumerate(group["params"]):
                if id(p) not in seen:
                    seen.add(id(p))
                    params.append(p)
                    if names is not None and group_names is not None \
                            and len(group_names) == len(group["params"]):
                        names.append(str(group_names[k]))
                    else:
                        names = None
        if named_parameters is not None:   # Horovod's habit: model.named_parameters()
            names = _names_of(params, list(named_parameters))
        if policy.attached:
            attached = policy.arrays
            if peer is not None and peer is not policy.peer:
                raise ValueError("the policy is attached to another peer")
            if [id(p) for p in attached] != [id(p) for p in params]:
                raise ValueError("the policy is attached to other parameters than the "
                                 "optimizer's; attach a new policy (or pass it unattached)")
        else:
            # Before attach: a joining peer takes the running job's state there, and the
            # optimizer's state (momentum, moments) must come with the parameters.
            policy.transfer_optimizer = optimizer
            policy.attach(require_peer(peer, "DistributedOptimizer"), params, names=names)
        policy.transfer_optimizer = optimizer
        self.optimizer = optimizer
        self.policy = policy
        self.peer = policy.peer

    # ------------------------------------------------------------------ the step
    def step(self, closure: Callable[[], _Loss] | None = None) -> _Loss | None:
        """Run ``closure`` (if given, with gradients on), policy.after_backward(), the optimizer's
        step unless the policy skips it (nan_guard found non-finite gradients), then
        policy.after_step(); returns the closure's loss."""
        loss = None
        if closure is not None:
            import torch
            with torch.enable_grad():
                loss = closure()
        self.policy.after_backward()
        if not self.policy.skip_update:   # nan_guard found non-finite gradients
            self.optimizer.step()
        self.policy.after_step()
        return loss

    def zero_grad(self, set_to_none: bool = True) -> None:
        """Zero the policy's gradient buckets in place if it has them (``param.grad`` stays a view
        of them), else the optimizer's zero_grad(``set_to_none``)."""
        if not self.policy.zero_grad():
            self.optimizer.zero_grad(set_to_none=set_to_none)

    # ------------------------------------------------------------------ forwarded state
    @property
    def param_groups(self) -> list:
        """The wrapped optimizer's param_groups, the same list (what an LR scheduler changes)."""
        return self.optimizer.param_groups

    @property
    def state(self) -> Any:
        """The wrapped optimizer's per-parameter state."""
        return self.optimizer.state

    @property
    def defaults(self) -> dict:
        """The wrapped optimizer's default hyperparameters."""
        return self.optimizer.defaults

    def add_param_group(self, param_group: dict) -> None:
        """Always RuntimeError: the policy packed the parameters into buckets at construction, and
        buckets cannot grow."""
        raise RuntimeError("parameters cannot be added after the policy packed them into "
                           "buckets; build the optimizer with every parameter group first")

    def state_dict(self) -> dict:
        """The optimizer's state dict, plus the policy's state (its name, step count and own state)
        under POLICY_STATE_KEY."""
        state = dict(self.optimizer.state_dict())
        state[POLICY_STATE_KEY] = self.policy.state_dict()
        return state

    def load_state_dict(self, state_dict: dict) -> None:
        """Restore a state_dict(): the policy's part, if present, into the policy, the rest into the
        optimizer; a plain optimizer state dict leaves the policy as it is."""
        if not isinstance(state_dict, dict):
            raise TypeError(f"state_dict must be a dict, got {type(state_dict).__name__}")
        state = dict(state_dict)
        policy_state = state.pop(POLICY_STATE_KEY, None)
        self.optimizer.load_state_dict(state)
        if policy_state is not None:
            self.policy.load_state_dict(policy_state)

    def stats(self, consensus: bool = False) -> dict:
        """The policy's counters (see Policy.stats)."""
        return self.policy.stats(consensus=consensus)

    # ------------------------------------------------------------------ lifetime
    def close(self) -> None:
        """Close the policy (stops its background threads); the peer stays open."""
        self.policy.close()

    def __enter__(self) -> "DistributedOptimizer":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __getattr__(self, name: str) -> Any:
        # Only reached for attributes not found normally: forward to the wrapped optimizer.
        if name in ("optimizer", "policy", "peer"):
            raise AttributeError(name)
        return getattr(self.optimizer, name)

    def __repr__(self) -> str:
        return f"DistributedOptimizer({self.optimizer!r}, policy={self.policy!r})"


def _tensors_of(obj: Any) -> list:
    if hasattr(obj, "parameters") and hasattr(obj, "buffers") and callable(obj.parameters):
        return list(obj.parameters()) + list(obj.buffers())  # a torch module
    if isinstance(obj, dict):
        return list(obj.values())  # a state dict
    if is_torch_tensor(obj) or isinstance(obj, np.ndarray):
        return [obj]
    if isinstance(obj, Iterable):   # tensors, or (name, tensor) pairs: named_parameters()
        return [item[1] if isinstance(item, tuple) and len(item) == 2 else item
                for item in obj]
    raise TypeError(f"broadcast_parameters takes a torch module, a state dict, or a list of "
                    f"tensors or arrays (or of (name, tensor) pairs), got "
                    f"{type(obj).__name__}")


def broadcast_parameters(model_or_params: Iterable[Array] | ParameterSource, root: int = 0, *,
                         peer: OptimizerPeer | None = None) -> None:
    """Copy ``root``'s parameters (and a module's buffers) to every peer, in place, so
    training starts from the same weights everywhere: a module, its ``state_dict()``, or a
    list of tensors or of (name, tensor) pairs (``named_parameters()``, as Horovod takes). A collective: every peer calls it with
    the same model. Tensors are packed per (dtype, device) into one flat buffer and sent in
    one broadcast each (a one-time allocation of the model's size).

    Skipped, by design, on a peer that joins a running job (a process restarted by
    ``gossip run --max-restarts``, a joiner; ``peer.entering``, from its join to its first
    step): the members made this collective at their start, long ago, and the joiner's
    parameters come with the state it takes when its policy attaches (before or after this
    call), so the same script serves both. A log line says so."""
    peer = require_peer(peer, "broadcast_parameters")
    if peer.entering:
        log.info("rank %d: broadcast_parameters skipped: this peer joined a running job; its "
                 "parameters come with the state it takes when its policy attaches", peer.rank)
        return
    if isinstance(root, bool) or not isinstance(root, int) or not 0 <= root < peer.world_size:
        raise ValueError(f"root must be a rank in [0, {peer.world_size}), got {root!r}")
    items = []
    seen: set[int] = set()
    for t in _tensors_of(model_or_params):
        if not (is_torch_tensor(t) or isinstance(t, np.ndarray)):
            raise TypeError(f"cannot broadcast a {type(t).__name__}; pass tensors or arrays")
        if id(t) not in seen:
            seen.add(id(t))
            items.append(t)
    groups: dict[tuple, list] = {}
    for t in items:
        key = (("numpy", t.dtype.str) if isinstance(t, np.ndarray)
               else ("torch", str(t.dtype), str(t.device)))
        groups.setdefault(key, []).append(t)
    for key, tensors in sorted(groups.items(), key=lambda kv: kv[0]):
        if key[0] == "numpy":
            flat = np.concatenate([np.ravel(t) for t in tensors])   # (a group has one or more)
            peer.broadcast(flat, root=root)
            offset = 0
            for t in tensors:
                t[...] = flat[offset:offset + t.size].reshape(t.shape)
                offset += t.size
        else:
            import torch
            with torch.no_grad():
                packed = torch.cat([t.detach().reshape(-1) for t in tensors])
                peer.broadcast(packed, root=root)
                offset = 0
                for t in tensors:
                    t.copy_(packed[offset:offset + t.numel()].view_as(t))
                    offset += t.numel()
