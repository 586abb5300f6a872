"""Lightning: decentralized training in a ``Trainer`` (``GossipStrategy``), and DDP over the
"gossip" backend (``DDPStrategy(process_group_backend="gossip")``, nothing of this module
needed: torch loads the backend itself).

    from gossip.lightning import GossipStrategy
    trainer = L.Trainer(accelerator="cpu", devices=4,
                        strategy=GossipStrategy(policy="gossip"))   # or Trainer(strategy="gossip")
    trainer.fit(module, datamodule)

``GossipStrategy`` is Lightning's ``DDPStrategy`` (the same launch: Lightning's own processes,
torchrun, SLURM; the same ``DistributedSampler``, logging with ``sync_dist``, barriers and
broadcasts over the "gossip" process group) with one difference: the model is not wrapped in
``DistributedDataParallel``. Each optimizer is run as a ``gossip.DistributedOptimizer`` with
the averaging policy: its ``step`` runs Lightning's closure (forward, backward, then gradient
clipping and ``on_before_optimizer_step``), ``policy.after_backward()`` (the gradient-side
communication: the synchronous policy's allreduce), the optimizer's step unless the policy's
nan_guard skipped it, and ``policy.after_step()`` (the parameter-side communication: a
gossip round, local SGD's or DiLoCo's periodic average, the asynchronous policy's pushes).

``policy``: a name of ``gossip.policies.names()`` ("gossip", "local-sgd", "asynchronous",
"push-sum", "easgd", "choco", "synchronous") made with its defaults, a callable returning a
new Policy (one per optimizer: ``lambda: LocalSGD(period=16, outer_lr=0.7, outer_momentum=0.9)``
is DiLoCo), or a Policy instance (one optimizer only). The topology is the Peer's
(``GOSSIP_TOPOLOGY``; a ring by default).

What differs from DDP, stated: gradient clipping sees each rank's own gradients, before the
policy averages them (DDP clips the allreduced ones); the policies' own state (a DiLoCo outer
momentum, push-sum weights) is not in Lightning's checkpoints, only the optimizer's.
"""
from __future__ import annotations

from collections.abc import Callable
from datetime import timedelta
from typing import Any, Literal

import torch
from lightning.pytorch import LightningModule, Trainer
from lightning.pytorch.core.optimizer import LightningOptimizer
from lightning.pytorch.strategies import DDPStrategy, StrategyRegistry
from lightning.pytorch.trainer.states import TrainerFn
from torch.distributed.constants import default_pg_timeout

from gossip.optim import DistributedOptimizer, broadcast_parameters
from gossip.policies.base import Policy
from gossip.policies.registry import resolve
from gossip.torch_backend.process_group import BACKEND_NAME, peer_of

__all__ = ["GossipStrategy", "PolicySpec"]

PolicySpec = str | Policy | Callable[[], Policy]
"""What ``GossipStrategy(policy=...)`` takes: a policy's name, a callable making a new Policy
per optimizer, or one Policy instance."""


class GossipStrategy(DDPStrategy):
    """Lightning's DDP strategy without the DDP wrapper: every optimizer step runs a gossip
    averaging policy around it (see the module's text). ``timeout``: the process group's and
    the gossip Peer's; ``start_method``: how Lightning starts its processes, as DDPStrategy."""

    strategy_name = "gossip"

    def __init__(self, policy: PolicySpec = "gossip", *,
                 timeout: timedelta | None = default_pg_timeout,
                 start_method: Literal["popen", "spawn", "fork", "forkserver"] = "popen",
                 **kwargs: Any) -> None:
        if "process_group_backend" in kwargs and kwargs["process_group_backend"] != BACKEND_NAME:
            raise ValueError("GossipStrategy runs over the 'gossip' process group, got "
                             f"process_group_backend={kwargs['process_group_backend']!r}")
        kwargs.pop("process_group_backend", None)
        if not (isinstance(policy, (str, Policy)) or callable(policy)):
            raise TypeError("GossipStrategy: policy must be a policy's name, a Policy or a "
                            f"callable returning one, got {type(policy).__name__}")
        super().__init__(process_group_backend=BACKEND_NAME, timeout=timeout,
                         start_method=start_method, **kwargs)
        self.policy_spec = policy
        self._wrapped: dict[int, DistributedOptimizer] = {}   # id(torch optimizer) ->

    # ------------------------------------------------------------------ set-up
    def configure_ddp(self) -> None:
        """No DDP wrapper: the model stays the LightningModule; every rank starts from rank 0's
        parameters and buffers (as DDP's constructor does), except a rank that joins a running
        job, which takes the job's state when its policy attaches."""
        assert isinstance(self.model, LightningModule)
        broadcast_parameters(self.model, root=0, peer=self.peer)

    def setup(self, trainer: Trainer) -> None:
        """DDPStrategy's set-up, then (when fitting) each optimizer wrapped with its policy,
        which packs the parameters into the policy's buckets."""
        super().setup(trainer)
        if trainer.state.fn != TrainerFn.FITTING:
            return
        raw = [self._unwrapped(o) for o in self.optimizers]
        if isinstance(self.policy_spec, Policy) and len(raw) > 1:
            raise ValueError(f"GossipStrategy: one Policy instance cannot serve {len(raw)} "
                             "optimizers: pass its name or a callable that makes one")
        self._wrapped = {id(o): DistributedOptimizer(o, peer=self.peer, policy=self._policy())
                         for o in raw}

    @property
    def peer(self) -> Any:
        """The gossip Peer behind the default ("gossip") process group."""
        return peer_of(None, "GossipStrategy")

    @property
    def policies(self) -> list[Policy]:
        """The policies of the optimizers, in the optimizers' order (empty before fit)."""
        return [d.policy for d in self._wrapped.values()]

    # ------------------------------------------------------------------ the step
    def optimizer_step(self, optimizer: Any, closure: Callable[[], Any],
                       model: LightningModule | torch.nn.Module | None = None,
                       **kwargs: Any) -> Any:
        """The precision plugin's step on the optimizer's DistributedOptimizer: the closure,
        policy.after_backward(), the optimizer's step, policy.after_step()."""
        wrapped = self._wrapped.get(id(self._unwrapped(optimizer)))
        if wrapped is None:
            raise RuntimeError("GossipStrategy: an optimizer the strategy did not set up "
                               "(configure_optimizers' optimizers are wrapped when fit starts)")
        model = model or self.lightning_module
        assert isinstance(model, LightningModule)
        # (Lightning's Steppable protocol spells step's overloads; DistributedOptimizer's one
        # generic step(closure) is what it calls.)
        return self.precision_plugin.optimizer_step(
            wrapped, model=model, closure=closure, **kwargs)  # type: ignore[arg-type]

    def teardown(self) -> None:
        """Close the policies (their background threads stop), then DDPStrategy's teardown."""
        for wrapped in self._wrapped.values():
            wrapped.close()
        self._wrapped = {}
        super().teardown()

    # ------------------------------------------------------------------ helpers
    def _policy(self) -> Policy:
        spec = self.policy_spec
        if isinstance(spec, (str, Policy)):
            return resolve(spec)
        made = spec()
        if not isinstance(made, Policy):
            raise TypeError(f"GossipStrategy: policy() returned {type(made).__name__}, "
                            "not a gossip Policy")
        return made

    @staticmethod
    def _unwrapped(optimizer: Any) -> Any:
        return optimizer._optimizer if isinstance(optimizer, LightningOptimizer) else optimizer

    @classmethod
    def register_strategies(cls, strategy_registry: Any) -> None:
        """``Trainer(strategy="gossip")``: GossipStrategy with the gossip policy."""
        if cls.strategy_name not in strategy_registry:
            strategy_registry.register(cls.strategy_name, cls,
                                       description="decentralized training: gossip policies "
                                                   "over the 'gossip' process group")


GossipStrategy.register_strategies(StrategyRegistry)
