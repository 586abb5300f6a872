"""DDP communication hooks over gossip: ``ddp.register_comm_hook(state, hook)``.

    state = gossip.ddp_hooks.HookState(compression="int8")   # the "gossip" process group's
    ddp.register_comm_hook(state, gossip.ddp_hooks.allreduce_hook)   # Peer, or peer=...

- ``allreduce_hook``: each gradient bucket averaged over every rank by gossip's allreduce,
  through ``state.compression``'s codec when set ("fp16", "bf16", "int8", "topk:RATIO";
  top-k keeps its error-feedback residual per bucket in the state); the replicas stay
  bitwise identical (every rank gets the same bytes).
- ``gossip_hook``: each bucket's *gradients* averaged with the topology's neighbours only
  (``peer.neighbor_average``), the state's step advancing once per iteration (time-varying
  graphs): no global synchronisation. This is neighbour gradient averaging, not D-PSGD: each
  replica steps on its neighbourhood's gradient from its own parameters, nothing pulls the
  parameters together, and the replicas drift apart (on a ring of 4, far enough to cost
  accuracy: the Results page has the figures). For D-PSGD, which averages the
  parameters, keep DDP with ``local_hook`` and call ``GossipAverager.average_parameters``
  after the optimizer's step (gossip/torch_backend/gossip_averager.py).
- ``local_hook``: no communication; each rank keeps its own gradients (for ``GossipAverager``,
  or anything else that averages the parameters instead).

- ``diloco_hook`` (DiLoCo, Douillard et al. 2023; ``HookState(period=H,
  outer_optimizer="diloco")``): no communication for H - 1 iterations out of H, each rank
  stepping on its own gradients (after one iteration of allreduced gradients, as torch's
  post-local-SGD warm-up); at every H-th iteration each bucket's pseudo-gradient
  (the bucket's parameters at the last outer step minus now) is averaged over every rank
  (with the state's codec), the outer optimizer (SGD, Nesterov momentum 0.9, lr 0.7) moves
  the anchor by it, and the parameters are set to the new anchor: the replicas are equal
  again. ``local_sgd_hook`` is the same with an outer SGD of lr 1 (the new anchor is the
  plain average of the parameters: local SGD). The outer step runs in the backward pass of
  iteration 1 + kH, once a bucket's gradients are all computed (nothing reads its parameters
  after that), so that iteration's inner step starts from the new anchor with the
  gradient taken before it: one step of staleness per period (torch's ``post_localSGD_hook``
  + ``PeriodicModelAverager``, also served by the "gossip" backend, average after the
  optimizer's step instead, which needs a call in the training loop).

The state names the gossip Peer: by default the one behind the default process group when
its backend is "gossip" (process_group.py); with another backend, pass
``peer=gossip.init(...)`` (a gossip group of its own beside, say, Gloo's).
"""
from typing import TYPE_CHECKING, Any, Dict

import torch
import torch.distributed as dist

from collectives.codecs import CodecSpec, parse as parse_codec
from gossip.policies.synchronous.outer_optimizer import SGD, resolve_outer_optimizer
from gossip.torch_backend.c10d_work import GossipWork
from gossip.torch_backend.process_group import peer_of

# (No postponed annotations in this module: DDP's register_comm_hook compares a hook's
# annotations with torch's own types.)
if TYPE_CHECKING:
    from gossip.peer import Peer

__all__ = ["HookState", "allreduce_hook", "gossip_hook", "local_hook", "diloco_hook",
           "local_sgd_hook"]


class HookState:
    """What the hooks share: the Peer, the codec, top-k's residuals, the iteration count."""

    def __init__(self, peer: "Peer | None" = None, *, compression: CodecSpec = None,
                 process_group: dist.ProcessGroup | None = None, period: int = 1,
                 outer_optimizer: SGD | str | None = None) -> None:
        self.peer = peer if peer is not None else peer_of(process_group, "HookState")
        # Parsed once here: an unknown name fails at set-up, not in the first backward pass.
        self.compression = parse_codec(compression)
        self.step = 0   # iterations completed (a bucket with is_last() ends one)
        self._residuals: Dict[int, Any] = {}
        # diloco_hook / local_sgd_hook: the period H, the outer optimizer (None: set by the
        # hook, "diloco" for diloco_hook, SGD(lr=1) for local_sgd_hook), the anchors.
        if isinstance(period, bool) or not isinstance(period, int) or period < 1:
            raise ValueError(f"HookState: period must be a positive integer, got {period!r}")
        self.period = period
        self.outer = resolve_outer_optimizer(outer_optimizer)
        self._anchors: Dict[int, Any] = {}

    def residual(self, bucket: Any) -> Any:
        """The error feedback of a sparse codec (top-k) for this bucket (float32, its size),
        kept across steps; None for dense codecs, which take none."""
        if self.compression is None or self.compression.dense:
            return None
        buf = bucket.buffer()
        got = self._residuals.get(bucket.index())
        if got is None or got.numel() != buf.numel():
            got = torch.zeros(buf.numel(), dtype=torch.float32)
            self._residuals[bucket.index()] = got
        return got.numpy()   # (the codecs' residual is a host array: the same memory)

    def state_dict(self) -> dict:
        """The iteration count, top-k's residuals (a checkpoint keeps the feedback), and
        DiLoCo's anchors and outer optimizer state."""
        return {"step": self.step,
                "residuals": {k: v.clone() for k, v in self._residuals.items()},
                "anchors": {k: v.clone() for k, v in self._anchors.items()},
                "outer": None if self.outer is None else self.outer.state()}

    def load_state_dict(self, state: dict) -> None:
        self.step = int(state["step"])
        self._residuals = {int(k): v.clone() for k, v in state["residuals"].items()}
        self._anchors = {int(k): v.clone() for k, v in state.get("anchors", {}).items()}
        if state.get("outer") is not None:
            if self.outer is None:
                self.outer = SGD(state["outer"]["lr"], state["outer"]["momentum"],
                                 state["outer"]["nesterov"])
            self.outer.load(state["outer"])


# (No ``from __future__ import annotations`` here: DDP checks the hooks' annotations as
# objects, dist.GradBucket and torch.futures.Future[torch.Tensor].)
def allreduce_hook(state: HookState, bucket: dist.GradBucket) -> torch.futures.Future[torch.Tensor]:
    """The bucket's gradients averaged over every rank (with the state's codec)."""
    buf = bucket.buffer()
    work = state.peer.allreduce(buf, op="mean", wait=False, compression=state.compression,
                                residual=state.residual(bucket))
    return _future([work], buf, state, bucket)


def gossip_hook(state: HookState, bucket: dist.GradBucket) -> torch.futures.Future[torch.Tensor]:
    """The bucket's gradients averaged with the neighbours (one round at ``state.step``)."""
    buf = bucket.buffer()
    work = state.peer.neighbor_average(buf, state.step, wait=False,
                                       compression=state.compression)
    return _future([work], buf, state, bucket)


def local_hook(state: object, bucket: dist.GradBucket) -> torch.futures.Future[torch.Tensor]:
    """No communication: the bucket's gradients stay this rank's own (``state`` is unused;
    pass None). With ``GossipAverager`` after the optimizer's step: D-PSGD in DDP code."""
    future: torch.futures.Future[torch.Tensor] = torch.futures.Future()
    future.set_result(bucket.buffer())
    return future


def diloco_hook(state: HookState, bucket: dist.GradBucket) -> torch.futures.Future[torch.Tensor]:
    """Local gradients, and at every ``state.period``-th iteration DiLoCo's outer step on
    the bucket's parameters (module docstring); the outer optimizer defaults to DiLoCo's."""
    if state.outer is None:
        state.outer = SGD.diloco()
    return _periodic(state, bucket, state.outer)


def local_sgd_hook(state: HookState, bucket: dist.GradBucket) -> torch.futures.Future[torch.Tensor]:
    """Local gradients, and at every ``state.period``-th iteration the bucket's parameters
    set to their average over every rank (an outer SGD of lr 1)."""
    if state.outer is None:
        state.outer = SGD(lr=1.0)
    return _periodic(state, bucket, state.outer)


def _periodic(state: HookState, bucket: Any, outer: SGD) -> torch.futures.Future:
    buf = bucket.buffer()
    if state.step == 0:
        # The first iteration allreduces the gradients, as torch's post-local-SGD warm-up:
        # DDP rebuilds its buckets (another order of parameters) after it, and the anchors,
        # taken at iteration 1, are then the same on every rank and in the final order.
        return allreduce_hook(state, bucket)
    params = [p for p in bucket.parameters()]
    k = bucket.index()
    anchor = state._anchors.get(k)
    if anchor is None:
        wide = torch.float64 if any(p.dtype == torch.float64 for p in params) else torch.float32
        anchor = state._anchors[k] = _flat_params(params).to(wide)
    if state.step == 1 or (state.step - 1) % state.period:
        return _future([], buf, state, bucket)   # the local gradients, at once
    # The pseudo-gradient: how far this replica moved since the last outer step.
    pseudo = anchor - _flat_params(params).to(anchor.dtype)
    work = state.peer.allreduce(pseudo, op="mean", wait=False,
                                compression=state.compression, residual=state.residual(bucket))

    def outer_step() -> None:
        with torch.no_grad():
            outer.step(k, anchor, pseudo)
            at = 0
            for p in params:
                m = p.numel()
                p.copy_(anchor[at:at + m].view_as(p))
                at += m
    return _future([work], buf, state, bucket, outer_step)


def _flat_params(params: list) -> Any:
    return torch.cat([p.detach().reshape(-1) for p in params])


def _future(handles: list, buf: Any, state: HookState, bucket: Any,
            finish: Any = None) -> torch.futures.Future:
    """A torch Future of ``buf`` that completes once gossip's ``handles`` (none: at once)
    and then ``finish`` did (or with their error); the bucket that ends an iteration counts
    it in ``state.step``."""
    if bucket.is_last():
        state.step += 1
    return GossipWork(handles, buf, finish).get_future()
