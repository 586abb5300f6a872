"""D-PSGD in DDP code: the parameters averaged with the topology's neighbours after each
optimizer step, the DDP model and optimizer kept as they are.

    ddp = DistributedDataParallel(model)
    ddp.register_comm_hook(None, ddp_hooks.local_hook)    # each rank keeps its own gradients
    averager = GossipAverager()                            # the "gossip" group's Peer
    for x, y in loader:
        optimizer.zero_grad()
        loss_fn(ddp(x), y).backward()
        optimizer.step()                                   # a local step (adapt) ...
        averager.average_parameters(ddp.parameters())      # ... then one gossip round (combine)

This is D-PSGD (Lian et al. 2017) in its adapt-then-combine form, x_i <- sum_j W_ij (x_i - lr
g_i), as torch's ``PeriodicModelAverager`` is periodic model averaging: one call after the
optimizer's step. What DDP would have done with the gradients (an allreduce, so that every
replica is the same) is replaced by ``local_hook``; without it the gradients are allreduced
first and the gossip round has nothing left to mix. The replicas stay apart by the
consensus distance the graph allows (``consensus_distance()`` measures it).

``gossip_hook`` is something else: it averages the *gradients* with the neighbours and lets
each replica step on its own, so the replicas drift apart (on a ring of 4, far enough to cost
accuracy); averaging the parameters is what D-PSGD's analysis needs.
"""
from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING

import torch
import torch.distributed as dist

from collectives.codecs import CodecSpec, parse as parse_codec
from gossip.torch_backend.process_group import peer_of

if TYPE_CHECKING:
    from gossip.peer import Peer

__all__ = ["GossipAverager"]


class GossipAverager:
    """Averages a model's parameters with the gossip Peer's topology neighbours, one round
    per ``average_parameters`` call (every ``period``-th call, after ``warmup_steps`` calls
    that do nothing, as torch's ``PeriodicModelAverager``). ``peer``: by default the one behind
    ``process_group`` (the default group), whose backend must be "gossip"; the topology is
    the Peer's (``gossip.init(topology=...)``, ``GOSSIP_TOPOLOGY``; a ring by default).
    ``compression``: a codec for the round ("fp16", "bf16", "int8")."""

    def __init__(self, peer: Peer | None = None, *, process_group: dist.ProcessGroup | None = None,
                 period: int = 1, warmup_steps: int = 0,
                 compression: CodecSpec = None) -> None:
        if isinstance(period, bool) or not isinstance(period, int) or period < 1:
            raise ValueError(f"GossipAverager: period must be a positive integer, got {period!r}")
        if isinstance(warmup_steps, bool) or not isinstance(warmup_steps, int) \
                or warmup_steps < 0:
            raise ValueError("GossipAverager: warmup_steps must be a non-negative integer, got "
                             f"{warmup_steps!r}")
        self.peer = peer if peer is not None else peer_of(process_group, "GossipAverager")
        self.period = period
        self.warmup_steps = warmup_steps
        self.compression = parse_codec(compression)
        self.step = 0     # average_parameters calls so far
        self.rounds = 0   # gossip rounds taken (the step of a time-varying topology)

    def average_parameters(self, params: Iterable[torch.Tensor]) -> None:
        """One gossip round of ``params`` (a model's ``parameters()``, tensors of one floating
        dtype on one device), in place, unless this call falls in the warm-up or between two
        periods. Every rank must call it at the same points."""
        self.step += 1
        if self.step <= self.warmup_steps or (self.step - self.warmup_steps) % self.period:
            return
        tensors = [p for p in params]
        if not tensors:
            return
        flat = self._flat(tensors)
        self.peer.neighbor_average(flat, self.rounds, compression=self.compression)
        self.rounds += 1
        offset = 0
        with torch.no_grad():
            for p in tensors:
                n = p.numel()
                p.copy_(flat[offset:offset + n].view_as(p))
                offset += n

    def consensus_distance(self, params: Iterable[torch.Tensor]) -> float:
        """The replicas' mean distance to their average (every rank calls it: an allreduce of
        the parameters and one of a scalar): how far apart the gossip rounds leave them."""
        flat = self._flat([p for p in params])
        mean = flat.clone()
        self.peer.allreduce(mean)
        mean /= self.peer.world_size
        distance = torch.linalg.vector_norm(flat - mean).reshape(1).to(torch.float64).cpu()
        self.peer.allreduce(distance)
        return float(distance[0]) / self.peer.world_size

    @staticmethod
    def _flat(tensors: list[torch.Tensor]) -> torch.Tensor:
        """The parameters in one contiguous tensor (a copy), refused unless they share one
        dtype and one device."""
        kinds = {(p.dtype, p.device) for p in tensors}
        if len(kinds) != 1:
            raise ValueError("GossipAverager: the parameters must share one dtype and device, "
                             f"got {sorted(str(k) for k in kinds)}")
        return torch.cat([p.detach().reshape(-1) for p in tensors])
