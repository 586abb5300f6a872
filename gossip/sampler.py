"""A data sampler that survives membership changes: no sample is seen twice in an epoch, and
none is skipped, when peers join, leave or die mid-epoch (Horovod's ElasticSampler
semantics, for lockstep policies).

Each epoch has one order of the dataset (a permutation from ``seed`` and the epoch, the same
on every peer). Step after step the group consumes that order front to back: a step takes the
next ``batch_size * world_size`` positions, and rank r of the current view takes its
``batch_size`` of them. So the only state is (epoch, how far the group got): the cursor. When
the view changes, the new world partitions what is left from the cursor on, and a joiner
receives the cursor with the rest of the state (the sampler registers with the peer, and the
state a member sends a joiner includes it).

    sampler = gossip.ElasticSampler(len(dataset), batch_size=32, peer=peer, seed=0)
    for epoch in range(epochs):
        sampler.set_epoch(epoch)
        for indices in sampler:          # this rank's batch of the current step
            train_step(dataset[indices])
            opt.step()                   # a view change may happen here: the next batch
                                         # is cut from the new partition

For a torch DataLoader: ``DataLoader(dataset, batch_sampler=sampler)``.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Iterator

import numpy as np

if TYPE_CHECKING:
    from gossip.peer import Peer

__all__ = ["ElasticSampler"]


class ElasticSampler:
    """Batches of dataset indices for this peer, cut afresh from what the group has left of
    the epoch whenever the view changes (module docstring). ``drop_last``: the epoch's last
    step, when fewer than ``batch_size * world_size`` samples remain, gives each rank an
    equal share of them (False, the default; a rank may then get fewer, even none) or is
    skipped (True)."""

    def __init__(self, length: int, batch_size: int, *, peer: Peer, shuffle: bool = True,
                 seed: int = 0, drop_last: bool = False) -> None:
        if length < 0 or batch_size < 1:
            raise ValueError(f"need length >= 0 and batch_size >= 1, got {length}, "
                             f"{batch_size}")
        self.length, self.batch_size = int(length), int(batch_size)
        self.shuffle, self.seed, self.drop_last = shuffle, int(seed), drop_last
        self.peer = peer
        self.epoch = 0
        self.cursor = 0        # positions of this epoch's order the group has consumed
        peer.track_state("elastic_sampler", self)

    def set_epoch(self, epoch: int) -> None:
        """Start epoch ``epoch`` (its own order) from its beginning, unless it is the epoch
        in progress (a joiner that took the state mid-epoch goes on from the cursor)."""
        if int(epoch) != self.epoch:
            self.epoch, self.cursor = int(epoch), 0

    def order(self) -> np.ndarray:
        """This epoch's order of the whole dataset (the same on every peer)."""
        if not self.shuffle:
            return np.arange(self.length)
        return np.random.default_rng((self.seed, self.epoch)).permutation(self.length)

    def batch_at(self, cursor: int, rank: int, size: int) -> np.ndarray:
        """Rank ``rank``'s batch of the step that starts at ``cursor`` in a world of
        ``size`` (empty when the epoch is over)."""
        remaining = self.length - cursor
        step = min(self.batch_size * size, max(remaining, 0))
        if step <= 0 or self.drop_last and step < self.batch_size * size:
            return np.empty(0, dtype=np.int64)
        share = -(-step // size)      # ceil: the last step's shares differ by one at most
        lo = cursor + min(rank * share, step)
        hi = cursor + min((rank + 1) * share, step)
        return self.order()[lo:hi]

    def __iter__(self) -> Iterator[list[int]]:
        """This rank's batch of each step until the epoch is used up. Every rank takes the same
        number of steps (lockstep policies need that): on the epoch's last, short step a rank
        may get a shorter batch, or an empty one."""
        while self.cursor < self.length:
            size, rank = self.peer.world_size, self.peer.rank
            step = min(self.batch_size * size, self.length - self.cursor)
            if self.drop_last and step < self.batch_size * size:
                return
            batch = self.batch_at(self.cursor, rank, size)
            # The step's positions are the group's once handed out: a view change at the end
            # of this step partitions what comes after them.
            self.cursor += step
            yield batch.tolist()

    def __len__(self) -> int:
        """Batches left for this rank in the epoch if the world stays as it is."""
        size = self.peer.world_size
        remaining = max(self.length - self.cursor, 0)
        if self.drop_last:
            return remaining // (self.batch_size * size)
        return -(-remaining // (self.batch_size * size))

    def state_dict(self) -> dict:
        return {"epoch": self.epoch, "cursor": self.cursor, "length": self.length,
                "batch_size": self.batch_size, "seed": self.seed}

    def load_state_dict(self, state: dict) -> None:
        for key in ("length", "batch_size", "seed"):
            if state.get(key) != getattr(self, key):
                raise ValueError(f"ElasticSampler state of another sampler: its {key} is "
                                 f"{state.get(key)!r}, this one's {getattr(self, key)!r}")
        self.epoch, self.cursor = int(state["epoch"]), int(state["cursor"])
