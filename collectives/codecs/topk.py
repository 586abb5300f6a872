"""top-k: the k largest-magnitude elements, as (index, value) pairs; the rest read as zero.

Meant for gradients and differences with error feedback (what is not sent is kept in a
residual and added to the next step's input: operations/compressed_allreduce.py), not for
parameters.
Layout for ``count`` elements: k uint32 indices, strictly increasing, then k float32 values,
k = min(count, max(1, ceil(ratio * count))) (0 for count 0).
"""
from __future__ import annotations

import math
from typing import Any

from collectives.codecs.codec import Codec, CodecError, array_module

__all__ = ["TopK", "DEFAULT_RATIO"]

DEFAULT_RATIO = 0.01
"""The fraction of the elements ``"topk"`` keeps when no ratio is given ("topk:RATIO")."""


class TopK(Codec):
    """Sparsification to a fraction ``ratio`` in (0, 1] of the elements. Error: the dropped
    elements, |e_i| <= |x_i| and ||e||^2 <= (1 - k/count) ||x||^2 (a contraction)."""

    family = "topk"
    dense = False

    def __init__(self, ratio: float = DEFAULT_RATIO) -> None:
        if isinstance(ratio, bool) or not isinstance(ratio, (int, float)) or \
                not math.isfinite(ratio) or not 0 < ratio <= 1:
            raise ValueError(f"top-k ratio must be a number in (0, 1], got {ratio!r}")
        self.ratio = float(ratio)

    @property
    def name(self) -> str:
        return f"topk:{self.ratio!r}"

    def k(self, count: int) -> int:
        """Elements kept of ``count``."""
        if count <= 0:
            return 0
        return min(count, max(1, math.ceil(self.ratio * count)))

    def encoded_nbytes(self, count: int) -> int:
        if count >= 2 ** 32:
            raise ValueError(f"top-k indexes with uint32: {count} elements are too many")
        return 8 * self.k(count)

    def _split(self, data: Any, k: int) -> tuple[Any, Any]:
        xp = array_module(data)
        return data[:4 * k].view(xp.uint32), data[4 * k:8 * k].view(xp.float32)

    def encode(self, x: Any, out: Any) -> None:
        xp = array_module(x)
        count = x.size
        k = self.k(count)
        if not k:
            return
        indices, values = self._split(out, k)
        if k == count:
            chosen = xp.arange(count)
        else:
            chosen = xp.argpartition(xp.abs(x), count - k)[count - k:]
            chosen.sort()
        xp.copyto(indices, chosen, casting="unsafe")
        xp.take(x, chosen, out=values)

    def decode(self, data: Any, out: Any) -> None:
        xp = array_module(out)
        count = out.size
        k = self.k(count)
        out.fill(0)
        if not k:
            return
        indices, values = self._split(data, k)
        # The one codec whose bytes can contradict themselves: indices must be in range and
        # strictly increasing (the encoder sorts them), or a hostile payload would write
        # anywhere, or twice.
        if int(indices[-1]) >= count or (k > 1 and not bool((indices[1:] > indices[:-1]).all())):
            raise CodecError(f"top-k payload of {k} indices for {count} elements is out of "
                             "range or not strictly increasing")
        out[indices] = values

    def error_bound(self, x: Any) -> Any:
        xp = array_module(x)
        return xp.abs(x).astype(xp.float32)
