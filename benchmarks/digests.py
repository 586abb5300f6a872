#!/usr/bin/env python3
"""The checksums a snapshot's digests could be over, on this machine: GB/s over 4 MiB pieces
(arrays.PIECE_BYTES) of a buffer larger than the caches, on one core and in the summing pool of
gossip/snapshot/crc.py (one piece per task; zlib's CRC-32 also as version-2 snapshots sum it,
in 1 MiB parts combined), and the time of one piece fresh from a transfer (in cache).

Usage:
  python benchmarks/digests.py [--mib 256] [--repeats 5]

Candidates: XXH3-64 (xxhash, what version-3 snapshots use), CRC-32C (the crc32c wheel, if
installed: pip install crc32c) and zlib's CRC-32 (version 2). Medians over --repeats; the
load average is printed with them (figures from a loaded machine are lower bounds).
"""
from __future__ import annotations

import argparse
import os
import statistics
import time
import zlib

import numpy as np
import xxhash

from gossip.snapshot import crc
from gossip.snapshot.array_specs import PIECE_BYTES


def candidates() -> dict:
    found = {"xxh3_64 (xxhash)": xxhash.xxh3_64_intdigest}
    try:
        import crc32c
        found["crc32c (crc32c)"] = crc32c.crc32c
    except ImportError:
        pass
    found["crc32 (zlib)"] = zlib.crc32
    return found


def rate(fn, nbytes: int, repeats: int) -> float:
    """GB/s of ``fn()`` over ``nbytes``: the median of ``repeats`` timings."""
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return nbytes / statistics.median(times) / 1e9


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--mib", type=int, default=256, help="buffer size in MiB")
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args(argv)
    data = np.random.default_rng(0).integers(0, 256, args.mib << 20, dtype=np.uint8)
    view = memoryview(data)
    pieces = [view[at:at + PIECE_BYTES] for at in range(0, len(view), PIECE_BYTES)]
    pool = crc.warm()
    print(f"# {args.mib} MiB in {len(pieces)} pieces of {PIECE_BYTES >> 20} MiB; pool of "
          f"{crc.workers()} threads; {os.cpu_count()} CPUs; load average "
          + " ".join(f"{x:.2f}" for x in os.getloadavg()))
    print(f"{'checksum':>18} {'1 core GB/s':>12} {'pool GB/s':>10} {'1 piece ms':>11}")
    for name, fn in candidates().items():
        one = rate(lambda: [fn(p) for p in pieces], len(view), args.repeats)
        both = rate(lambda: [f.result() for f in [pool.submit(fn, p) for p in pieces]],
                    len(view), args.repeats)
        fn(pieces[0])   # in cache, as a piece that just landed is
        hot = PIECE_BYTES / rate(lambda: fn(pieces[0]), PIECE_BYTES, 20 * args.repeats) / 1e6
        print(f"{name:>18} {one:12.2f} {both:10.2f} {hot:11.3f}", flush=True)
    split = rate(lambda: [p.result() for p in [crc.checksum(p) for p in pieces]], len(view),
                 args.repeats)
    print(f"{'crc32 split (v2)':>18} {'':>12} {split:10.2f}   (1 MiB parts combined: "
          "crc.checksum)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
