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

A step that a recovery cuts off (a death with ``elastic=True``, a leave at once) is either
begun again or completed in the new view (gossip/policies/base/policy.py, after_step). The
sampler follows the peer's step boundaries (gossip.tracked.StepTracked): it keeps what it
handed out since the last completed boundary apart, and when the step is begun again (the
torch gradient path: the interrupted step's optimizer step is skipped) it hands those
positions out again, cut from the new view's partition; when the step is completed (the
numpy parameter path) they stay the step's. So no sample is trained twice or skipped, but
for the batch of a member lost in a step that is completed: it went down with that member's
update (the step is completed over the survivors' own). Likewise a survivor that was still
finishing the step before when the death cut it off (the dead member's last sends of that
step died with it) takes the state of a member that completed it, whose update of the next
step stands for its own in that step's averaging: its batch of that step is never handed
out. The state a member sends is that of the boundary the group goes on from. This needs the batches
consumed as they are handed out: a plain loop over the sampler, or a DataLoader with
``num_workers=0`` (workers prefetch batches a re-handed step would then also train).

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

from collections import deque
from typing import TYPE_CHECKING, Any, Iterator

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
        self.cursor = 0        # positions of this epoch's order the group has handed out
        # Positions of each step handed out since the last completed boundary, oldest first:
        # a step a recovery begins again hands them out again (step_resumed).
        self._unfinished: deque[int] = deque()
        peer.track_state("elastic_sampler", self)

    def set_epoch(self, epoch: int) -> None:
        """Start epoch ``epoch`` (its own order) from its beginning, unless it is the epoch
        in progress (a joiner that took the state mid-epoch goes on from the cursor)."""
        if int(epoch) != self.epoch:
            self.epoch, self.cursor = int(epoch), 0
            self._unfinished.clear()

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
            # of this step partitions what comes after them (a recovery that begins the step
            # again hands them out again: step_resumed).
            self.cursor += step
            self._unfinished.append(step)
            yield batch.tolist()

    def __len__(self) -> int:
        """Batches left for this rank in the epoch if the world stays as it is."""
        size = self.peer.world_size
        remaining = max(self.length - self.cursor, 0)
        if self.drop_last:
            return remaining // (self.batch_size * size)
        return -(-remaining // (self.batch_size * size))

    @property
    def completed(self) -> int:
        """Positions of this epoch's order consumed by completed steps (``cursor`` less what
        the step in progress was handed)."""
        return self.cursor - sum(self._unfinished)

    # ------------------------------------------------------------------ the peer's calls
    def step_completed(self, step: int) -> None:
        """(The peer, at each step boundary.) The oldest hand-out not yet completed was the
        completed step's."""
        if self._unfinished:
            self._unfinished.popleft()

    def step_resumed(self, complete: bool) -> None:
        """(The peer, at a view change.) The step in progress is completed (its hand-out
        stays), or begun again: what was handed out since the last boundary is handed out
        again, from the new view's partition."""
        if not complete:
            self.cursor = self.completed
            self._unfinished.clear()

    def state_dict(self) -> dict[str, int | list[int]]:
        """The epoch and the cursor of the last completed boundary; ``unfinished``: the
        positions of each step handed out since (a source inside a step that the receivers
        complete sends its hand-out with it)."""
        return {"epoch": self.epoch, "cursor": self.completed, "length": self.length,
                "batch_size": self.batch_size, "seed": self.seed,
                "unfinished": list(self._unfinished)}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        for key in ("length", "batch_size", "seed"):
            if state.get(key) != getattr(self, key):
                raise ValueError(f"ElasticSampler state of another sampler: its {key} is "
                                 f"{state.get(key)!r}, this one's {getattr(self, key)!r}")
        unfinished = [int(n) for n in state.get("unfinished") or ()]
        self.epoch = int(state["epoch"])
        self.cursor = int(state["cursor"]) + sum(unfinished)
        self._unfinished = deque(unfinished)
