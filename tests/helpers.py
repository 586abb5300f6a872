"""Small helpers several test files share (importable by spawned peers: tests/ is on the
path, as for wire_relay)."""
from __future__ import annotations

import os
from pathlib import Path

import numpy as np

__all__ = ["publish", "read", "batch_plan"]


def publish(path: Path, text: str) -> None:
    """Write ``text`` to ``path`` atomically, for another process polling ``read(path)``."""
    path.with_suffix(".tmp").write_text(text)
    os.replace(path.with_suffix(".tmp"), path)


def read(path: Path) -> str | None:
    """What ``publish`` wrote, or None until then."""
    try:
        return path.read_text()
    except FileNotFoundError:
        return None


def batch_plan(n: int, n_train: int, epochs: int, batch: int) -> list[list[np.ndarray]]:
    """For each step, each peer's batch of indices: peer r trains on its shard (every n-th
    sample from r) only, in an order fixed by epoch and rank."""
    shards = [np.arange(r, n_train, n) for r in range(n)]
    steps = min(len(s) for s in shards) // batch
    plan = []
    for epoch in range(epochs):
        orders = [np.random.default_rng(1000 * epoch + r).permutation(s)
                  for r, s in enumerate(shards)]
        for k in range(steps):
            plan.append([o[k * batch:(k + 1) * batch] for o in orders])
    return plan
