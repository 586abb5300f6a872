"""DDP communication hooks over gossip: ``ddp.register_comm_hook(state, hook)``.

    state = gossip.ddp_hooks.HookState(compression="int8")   # the "gossip" process group's
    ddp.register_comm_hook(state, gossip.ddp_hooks.allreduce_hook)   # Peer, or peer=...

- ``allreduce_hook``: each gradient bucket averaged over every rank by gossip's allreduce,
  through ``state.compression``'s codec when set ("fp16", "bf16", "int8", "topk:RATIO";
  top-k keeps its error-feedback residual per bucket in the state); the replicas stay
  bitwise identical (every rank gets the same bytes).
- ``gossip_hook``: each bucket averaged with the topology's neighbours only (one D-PSGD
  round of the gradients, ``peer.neighbor_average``), the state's step advancing once per
  iteration (time-varying graphs): no global synchronisation, replicas drift apart by design
  and stay close as the graph mixes.

Local SGD and DiLoCo need no hook of ours: torch's ``post_localSGD_hook`` with its
``PeriodicModelAverager`` (torch.distributed.algorithms) run over the "gossip" backend, or
gossip's own ``LocalSGD(period=H, outer_optimizer=...)`` policy on the model's parameters.

The state names the gossip Peer: by default the one behind the default process group when
its backend is "gossip" (gossip/torch_backend.py); with another backend, pass
``peer=gossip.init(...)`` (a gossip group of its own beside, say, Gloo's).
"""
from typing import Any, Dict

import torch
import torch.distributed as dist

from collectives.codecs.registry import parse as parse_codec
from gossip.torch_work import GossipWork

__all__ = ["HookState", "allreduce_hook", "gossip_hook"]


class HookState:
    """What the hooks share: the Peer, the codec, top-k's residuals, the iteration count."""

    def __init__(self, peer: Any = None, *, compression: Any = None,
                 process_group: Any = None) -> None:
        if peer is None:
            group = process_group if process_group is not None else dist.group.WORLD
            peer = getattr(group, "peer", None)
            if peer is None:
                raise ValueError("HookState: the process group is not a gossip one "
                                 "(dist.init_process_group('gossip')): pass peer=gossip.init()")
        self.peer = peer
        # Parsed once here: an unknown name fails at set-up, not in the first backward pass.
        self.compression = parse_codec(compression)
        self.step = 0   # iterations completed (a bucket with is_last() ends one)
        self._residuals: Dict[int, Any] = {}

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
        """The iteration count and top-k's residuals (a checkpoint keeps the feedback)."""
        return {"step": self.step,
                "residuals": {k: v.clone() for k, v in self._residuals.items()}}

    def load_state_dict(self, state: dict) -> None:
        self.step = int(state["step"])
        self._residuals = {int(k): v.clone() for k, v in state["residuals"].items()}


# (No ``from __future__ import annotations`` here: DDP checks the hooks' annotations as
# objects, dist.GradBucket and torch.futures.Future[torch.Tensor].)
def allreduce_hook(state: HookState, bucket: dist.GradBucket) -> torch.futures.Future[torch.Tensor]:
    """The bucket's gradients averaged over every rank (with the state's codec)."""
    buf = bucket.buffer()
    work = state.peer.allreduce(buf, op="mean", wait=False, compression=state.compression,
                                residual=state.residual(bucket))
    return _future(work, buf, state, bucket)


def gossip_hook(state: HookState, bucket: dist.GradBucket) -> torch.futures.Future[torch.Tensor]:
    """The bucket's gradients averaged with the neighbours (one round at ``state.step``)."""
    buf = bucket.buffer()
    work = state.peer.neighbor_average(buf, state.step, wait=False,
                                       compression=state.compression)
    return _future(work, buf, state, bucket)


def _future(work: Any, buf: Any, state: HookState, bucket: Any) -> torch.futures.Future:
    """A torch Future of ``buf`` that completes with gossip's ``work`` (or its error)."""
    if bucket.is_last():
        state.step += 1
    return GossipWork([work], buf).get_future()
