"""Where each array of a snapshot lies in one flat, virtual byte space: the arrays back to back
in snapshot order, no padding. A data file holds exactly that space; a joiner asks donors for
ranges of it. Both sides compute the layout from the manifest alone, so it never travels."""
from __future__ import annotations

import bisect
from dataclasses import dataclass
from typing import Iterator, Sequence

__all__ = ["Layout"]


@dataclass(frozen=True)
class Layout:
    """``names[i]`` lies at bytes ``offsets[i]`` to ``offsets[i] + sizes[i]``; ``total`` is
    the size of the whole space."""

    names: tuple[str, ...]
    offsets: tuple[int, ...]
    sizes: tuple[int, ...]
    total: int

    @classmethod
    def of(cls, names: Sequence[str], sizes: Sequence[int]) -> "Layout":
        offsets, at = [], 0
        for size in sizes:
            offsets.append(at)
            at += size
        return cls(tuple(names), tuple(offsets), tuple(sizes), at)

    def check(self, offset: int, length: int) -> None:
        """ValueError unless [offset, offset + length) lies inside the space."""
        if (isinstance(offset, bool) or isinstance(length, bool)
                or not isinstance(offset, int) or not isinstance(length, int)):
            raise TypeError(f"offset and length must be ints, got {offset!r}, {length!r}")
        if offset < 0 or length < 0 or offset + length > self.total:
            raise ValueError(f"byte range [{offset}, {offset + length}) is outside the "
                             f"snapshot's [0, {self.total})")

    def pieces(self, offset: int, length: int) -> Iterator[tuple[int, int, int]]:
        """The arrays a checked range covers, as (array index, start, stop) within each
        array's bytes, in order. Empty arrays are skipped."""
        self.check(offset, length)
        end = offset + length
        i = bisect.bisect_right(self.offsets, offset) - 1
        while offset < end:
            lo = self.offsets[i]
            stop = min(end, lo + self.sizes[i])
            if stop > offset:
                yield i, offset - lo, stop - lo
                offset = stop
            i += 1

    def ranges(self, chunk_bytes: int) -> list[tuple[int, int]]:
        """The space cut into (offset, length) ranges of at most ``chunk_bytes`` that never
        cross an array's end, so that reading each one is zero-copy."""
        if isinstance(chunk_bytes, bool) or not isinstance(chunk_bytes, int) or chunk_bytes < 1:
            raise ValueError(f"chunk_bytes must be a positive int, got {chunk_bytes!r}")
        out: list[tuple[int, int]] = []
        for lo, size in zip(self.offsets, self.sizes):
            out.extend((at, min(chunk_bytes, lo + size - at))
                       for at in range(lo, lo + size, chunk_bytes))
        return out
