"""How far a peer is from its neighbours, estimated from the gossip round it makes anyway: no
message, no collective.

A round moves a peer's parameters by ``x' - x = sum_j w_ij (x_j - x)`` (j its in-neighbours),
so ``||x' - x|| / (1 - w_ii)`` is its distance to its neighbours' weighted mean as the round
began: zero in consensus, and of the order of the consensus distance ``||x - mean||`` then
(1.4x on a ring of 4 with independent starting points, tests/policies/test_disagreement.py).
The probe reads a fixed sample of the coordinates (256 per bucket, the same every round)
before and after the round and scales the sampled norm to the whole vector, so it costs two
gathers of a few hundred numbers per bucket and round. It is an estimate: a codec's error
and a round cut short move it; ``policy.consensus_distance()`` measures the real one (a
collective).
"""
from __future__ import annotations

import math
from typing import Any, Sequence

import numpy as np

__all__ = ["DisagreementProbe", "SAMPLE"]

SAMPLE = 256
"""Coordinates read per bucket."""


def _take(flat: Any, index: np.ndarray) -> np.ndarray:
    if isinstance(flat, np.ndarray):
        return flat[index].astype(np.float64)
    import torch   # a torch tensor (imported only then: a numpy peer never needs torch)
    picked = flat.detach()[torch.as_tensor(index, device=flat.device)]
    return picked.double().cpu().numpy()


class DisagreementProbe:
    """The distance estimate of one policy's rounds (``before``, the round, ``after``)."""

    def __init__(self, sample: int = SAMPLE, seed: int = 0) -> None:
        self._sample = sample
        self._seed = seed
        self._index: list[np.ndarray] = []
        self._before: list[np.ndarray] = []
        #: The last estimate (None before the first round).
        self.last: float | None = None

    def before(self, flats: Sequence[Any]) -> None:
        """Read the sample of each bucket's flat vector, before the round."""
        if len(self._index) != len(flats):
            rng = np.random.default_rng(self._seed)
            self._index = [np.sort(rng.choice(len(f), size=min(self._sample, len(f)),
                                              replace=False)) for f in flats]
        self._before = [_take(f, i) for f, i in zip(flats, self._index)]

    def after(self, flats: Sequence[Any], self_weight: float) -> float | None:
        """Read them again after the round: the estimate (also kept in ``last``)."""
        if not self._before or self_weight >= 1.0:
            return None   # no round, or one without neighbours (all lost)
        total = 0.0
        for flat, index, old in zip(flats, self._index, self._before):
            if len(index):
                moved = _take(flat, index) - old
                total += float(moved @ moved) * (len(flat) / len(index))
        self._before = []
        self.last = math.sqrt(total) / (1.0 - self_weight)
        return self.last
