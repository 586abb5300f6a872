"""The line the torch.distributed workers print at the end (tests/backend/workers/ddp_dpsgd.py,
tests/integrations/workers/lightning_fit.py): every rank's test accuracy gathered and the
replicas' mean distance to their average, over the default process group (a collective:
every rank calls it); rank 0 prints ``RESULT LABEL mean=.. worst=.. consensus=.. EXTRA``."""
from __future__ import annotations

import sys
from typing import Iterable

import torch
import torch.distributed as dist

__all__ = ["report"]


def report(label: str, accuracy: torch.Tensor, parameters: Iterable[torch.Tensor],
           extra: str = "") -> None:
    world = dist.get_world_size()
    accuracies = [torch.zeros(1) for _ in range(world)]
    dist.all_gather(accuracies, accuracy.reshape(1).float())
    flat = torch.cat([p.detach().reshape(-1) for p in parameters])
    average = flat.clone()
    dist.all_reduce(average)
    average /= world
    distance = torch.linalg.vector_norm(flat - average).reshape(1)
    dist.all_reduce(distance)
    if dist.get_rank() == 0:
        values = torch.cat(accuracies)
        sys.stdout.write(f"RESULT {label} mean={float(values.mean()):.4f} "
                         f"worst={float(values.min()):.4f} "
                         f"consensus={float(distance[0]) / world:.4f} {extra}\n")
        sys.stdout.flush()
