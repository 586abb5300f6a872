"""The receiving end of a snapshot sent in chunks: arrays allocated from a manifest, byte
ranges written as they come (from one donor or several, in any order, overlaps allowed),
what is still missing, and a check of every array's digest at the end.

    receiver = SnapshotReceiver(donor_manifest)
    for offset, length in receiver.missing():        # e.g. split over several donors
        receiver.write(offset, donor.read(offset, length))
    snapshot = receiver.finish()                     # SnapshotCorrupt names a bad tensor
"""
from __future__ import annotations

import bisect
import threading
from typing import Any

import numpy as np

from gossip.errors import SnapshotError
from gossip.snapshot import crc as crc32
from gossip.snapshot import manifest as mf
from gossip.snapshot.array_specs import (PIECE_BYTES, allocate, byte_view, digest_of_pieces,
                                    piece_sum, spec_of, verify)
from gossip.snapshot.layout import Layout
from gossip.snapshot.snapshot import Snapshot

__all__ = ["SnapshotReceiver"]


class _Ranges:
    """Disjoint, sorted, merged [start, end) byte ranges."""

    def __init__(self) -> None:
        self.starts: list[int] = []
        self.ends: list[int] = []

    def add(self, lo: int, hi: int) -> None:
        if lo >= hi:
            return
        # Every range that overlaps or touches [lo, hi) merges with it.
        i = bisect.bisect_left(self.ends, lo)
        j = bisect.bisect_right(self.starts, hi)
        if i < j:
            lo, hi = min(lo, self.starts[i]), max(hi, self.ends[j - 1])
        self.starts[i:j], self.ends[i:j] = [lo], [hi]

    def remove(self, lo: int, hi: int) -> None:
        i = bisect.bisect_right(self.ends, lo)
        j = bisect.bisect_left(self.starts, hi)
        keep_s, keep_e = [], []
        if i < j and self.starts[i] < lo:
            keep_s.append(self.starts[i])
            keep_e.append(lo)
        if i < j and self.ends[j - 1] > hi:
            keep_s.append(hi)
            keep_e.append(self.ends[j - 1])
        self.starts[i:j], self.ends[i:j] = keep_s, keep_e

    def gaps(self, total: int) -> list[tuple[int, int]]:
        out, at = [], 0
        for s, e in zip(self.starts, self.ends):
            if s > at:
                out.append((at, s - at))
            at = e
        if at < total:
            out.append((at, total - at))
        return out


class SnapshotReceiver:
    """Assemble the snapshot ``manifest`` describes from byte ranges of its flat space
    (Snapshot.layout(); the receiver's own ``layout`` is the same, computed from the
    manifest). The manifest is checked before anything is allocated (it may come from
    another peer), but what it describes is what gets allocated: check a donor's manifest
    against your own state first (Snapshot.check_compatible). The arrays are allocated once
    and written in place.

    ``into``: arrays of the caller's to receive into, by name (a joiner's own parameters:
    memory its model has touched already, where fresh pages would cost a page fault each,
    and no copy afterwards); one whose kind, dtype or shape differ from the manifest's, or
    that is not contiguous and writable, is not used (a fresh array is allocated instead).

    ``write`` may be called from several threads (one per donor). ``finish()`` checks every
    array's digest and returns the Snapshot; a corrupted array raises SnapshotCorrupt naming
    the first, and every corrupted array's range counts as missing again, so the caller can
    fetch it from another donor and call finish() again.

    A write (or ``wrote``) that covers whole pieces of an array (array_specs.PIECE_BYTES from its
    start: what Layout.ranges(PIECE_BYTES) cuts) has them checksummed at once, in
    snapshot.crc's threads, while the writer receives the next chunk, so finish() has little
    left to do; a piece written in parts in order is summed part by part; pieces written
    otherwise are checksummed at finish(). The checksums are the manifest's version's
    (array_specs.DIGEST_VERSIONS): a version-2 snapshot is received and checked as well.
    """

    def __init__(self, manifest: dict, into: dict[str, Any] | None = None) -> None:
        self._specs, self._digests, self._parts = mf.parse(manifest)
        self._version = mf.version_of(manifest)
        self._digest = mf.digest(manifest)
        self._layout = Layout.of([s.name for s in self._specs],
                                 [s.nbytes for s in self._specs])
        into = into or {}
        self._arrays = [_own(into.get(s.name), s) for s in self._specs]
        self._views = [byte_view(a) for a in self._arrays]
        self._have = _Ranges()
        # piece -> its checksum, pending (summed in snapshot.crc's threads as written)
        self._crcs: list[dict[int, Any]] = [{} for _ in self._specs]
        # (array, piece) -> (bytes summed from its start, their pending checksum): a piece
        # written in parts in order is summed part by part (version 2: each part in the
        # threads while the writer receives the next; 3: each part as it comes)
        self._running: dict[tuple[int, int], tuple[int, Any]] = {}
        self._lock = threading.Lock()
        self._finished = False
        crc32.warm()   # the summing threads, started before the first chunk lands

    @property
    def layout(self) -> Layout:
        """Where each array lies in the flat byte space (``total`` bytes in all)."""
        return self._layout

    @property
    def digest(self) -> str:
        """The snapshot's digest, from the manifest: compare it with the donors'."""
        return self._digest

    def write(self, offset: int, data: Any) -> None:
        """Copy ``data`` (bytes, a memoryview, a contiguous array: any buffer) into bytes
        [offset, offset + len) of the flat space."""
        if self._finished:
            raise RuntimeError("the receiver has finished: its arrays are the snapshot's")
        src = memoryview(data).cast("B")
        at = 0
        for i, lo, hi in self._layout.pieces(offset, src.nbytes):
            self._views[i][lo:hi] = src[at:at + hi - lo]
            at += hi - lo
        self.wrote(offset, src.nbytes)

    def target(self, offset: int, length: int) -> memoryview:
        """The receiver's own bytes [offset, offset + length), writable, for a range within
        one array (Layout.ranges() cuts them so): receive straight into it, then say so with
        ``wrote``; no copy."""
        if self._finished:
            raise RuntimeError("the receiver has finished: its arrays are the snapshot's")
        pieces = list(self._layout.pieces(offset, length))
        if len(pieces) != 1:
            raise ValueError(f"bytes [{offset}, {offset + length}) cross an array's end: use "
                             "write(), or ranges from Layout.ranges()")
        i, lo, hi = pieces[0]
        return self._views[i][lo:hi]

    def wrote(self, offset: int, length: int) -> None:
        """Bytes [offset, offset + length) were written through ``target``."""
        with self._lock:
            for i, lo, hi in self._layout.pieces(offset, length):
                size = self._layout.sizes[i]
                for first in range(lo - lo % PIECE_BYTES, hi, PIECE_BYTES):
                    self._sum(i, first, min(first + PIECE_BYTES, size), lo, hi)
            self._have.add(offset, offset + length)

    def _sum(self, i: int, first: int, end: int, lo: int, hi: int) -> None:
        """(Holding _lock.) Array i's piece [first, end) has bytes [lo, hi) written: summed
        now if that makes it whole (at once, or as the next part of a piece written in
        order), else left to finish()."""
        piece, view = first // PIECE_BYTES, self._views[i]
        summed, before = self._running.pop((i, piece), (first, None))
        lo, hi = max(lo, first), min(hi, end)
        if lo != summed and lo != first:   # out of order: the piece is summed at finish()
            self._crcs[i].pop(piece, None)
            return
        if lo == first:
            before = None   # (re)written from its start
        crc = self._start_sum(view[lo:hi], whole=lo == first and hi == end, before=before)
        if hi == end:
            self._crcs[i][piece] = crc
        else:
            self._crcs[i].pop(piece, None)
            self._running[(i, piece)] = (hi, crc)

    def _start_sum(self, part: memoryview, *, whole: bool, before: Any) -> Any:
        """The pending checksum of a piece's bytes up to the end of ``part``, ``before``
        that of the bytes before it (None: ``part`` starts the piece)."""
        if self._version == 2:
            return crc32.checksum(part, before)
        if whole:
            return crc32.xxh3(part)
        return (before or crc32.Xxh3Stream()).update(part)

    def missing(self) -> list[tuple[int, int]]:
        """The (offset, length) ranges not written yet, in order."""
        with self._lock:
            return self._have.gaps(self._layout.total)

    @property
    def complete(self) -> bool:
        """Every byte has been written (not yet checked: see finish())."""
        return not self.missing()

    def finish(self) -> Snapshot:
        """The snapshot, after every array's digest was checked. SnapshotError if ranges are
        still missing; SnapshotCorrupt naming the first corrupted tensor (its range is then
        missing again)."""
        gaps = self.missing()
        if gaps:
            offset, length = gaps[0]
            raise SnapshotError(f"{sum(n for _, n in gaps)} bytes in {len(gaps)} ranges not "
                                f"received yet, the first [{offset}, {offset + length}) in "
                                f"{self._name_at(offset)!r}")
        got = [digest_of_pieces(spec, sums, self._version)
               for spec, sums in zip(self._specs, self.piece_crcs())]
        with self._lock:
            for i, (g, want) in enumerate(zip(got, self._digests)):
                if g != want:
                    lo = self._layout.offsets[i]
                    self._have.remove(lo, lo + self._layout.sizes[i])
                    self._crcs[i].clear()
        verify(self._specs, got, self._digests, self._layout.offsets, "the chunks received")
        self._finished = True
        return Snapshot(list(zip(self._layout.names, self._arrays)), self._parts,
                        digests=self._digests, version=self._version)

    def piece_crcs(self) -> list[list[int]]:
        """The checksum of each piece of each array as received, in the manifest's version's
        scheme (after finish(), also when it failed): compared with the donors' own
        (Snapshot.piece_crcs), they name the bad pieces."""
        out = []
        for i, view in enumerate(self._views):
            with self._lock:
                known = dict(self._crcs[i])
            out.append([known[p].result() if p in known else
                        piece_sum(view[p * PIECE_BYTES:(p + 1) * PIECE_BYTES], self._version)
                        for p in range(-(-len(view) // PIECE_BYTES))])
        return out

    def _name_at(self, offset: int) -> str:
        i, _, _ = next(self._layout.pieces(offset, 1))
        return self._layout.names[i]


def _own(array: Any, spec: Any) -> Any:
    """``array`` if it can hold ``spec``'s bytes in place, else a fresh array."""
    if array is None:
        return allocate(spec)
    contiguous = array.flags.c_contiguous if isinstance(array, np.ndarray) else (
        getattr(array, "is_contiguous", lambda: False)()
        and getattr(getattr(array, "device", None), "type", "") == "cpu")
    if not contiguous:   # byte_view would be of a copy
        return allocate(spec)
    try:
        mine = spec_of(spec.name, array)
        view = byte_view(array)
    except (TypeError, ValueError):
        return allocate(spec)
    if not mine.same_as(spec) or view.readonly:
        return allocate(spec)
    return array
