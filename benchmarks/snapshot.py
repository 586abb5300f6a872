#!/usr/bin/env python3
"""Snapshot throughput against the same run's memory copy rate, for a float32 torch model.

For each of ``--repeats`` rounds (medians printed) on a model of ``--mib`` MiB (16 linear
layers): the numpy copy rate of one array of the model's size (the memory's bound: a copy
reads and writes each byte once), and the same copy into fresh memory (what a receiver or a
load pays too: page faults); the digest of a fresh snapshot (the CRC-32 of every 4 MiB piece,
in threads); read(): the byte space handed out in 4 MiB ranges (zero-copy views), and copied
into a SnapshotReceiver, whose finish() checks the digests (an in-memory transfer); save()
and load() through a directory (default: a fresh one under /dev/shm, so the disk is not what
is measured; pass --dir for a real one). Usage:

    python benchmarks/snapshot.py [--mib 256] [--repeats 3] [--chunk-mib 4] [--dir PATH]
"""
from __future__ import annotations

import argparse
import os
import shutil
import statistics
import tempfile
import time

import numpy as np
import torch

from gossip import Snapshot, SnapshotReceiver


def model_of(mib: int) -> torch.nn.Module:
    width = int((mib * 2**20 / 4 / 16) ** 0.5)   # 16 layers of width x width float32
    torch.manual_seed(0)
    return torch.nn.Sequential(*[torch.nn.Linear(width, width) for _ in range(16)])


def timed(fn) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def one_round(model: torch.nn.Module, chunk: int, directory: str) -> dict:
    nbytes = sum(p.numel() * 4 for p in model.state_dict().values())
    src = np.ones(nbytes // 4, dtype=np.float32)
    dst = np.ones_like(src)   # its pages touched: the copy alone
    out = {"numpy copy": nbytes / timed(lambda: np.copyto(dst, src)),
           # what a receiver or a load also pays: fresh memory, faulted in by the copy
           "numpy copy, fresh dst": nbytes / timed(lambda: np.copyto(np.empty_like(src), src))}

    snap = Snapshot.of(model=model)
    out["digest"] = nbytes / timed(lambda: snap.digests)
    ranges = snap.layout().ranges(chunk)
    out["read() (views, no copy)"] = nbytes / timed(lambda: [snap.read(o, n) for o, n in ranges])
    receiver = SnapshotReceiver(snap.manifest)

    def transfer():
        for o, n in ranges:
            receiver.write(o, snap.read(o, n))
    out["read() into receiver"] = nbytes / timed(transfer)     # its fresh arrays fault in
    out["  again (pages warm)"] = nbytes / timed(transfer)      # the per-chunk cost alone
    out["receiver finish()"] = nbytes / timed(receiver.finish)

    fresh = Snapshot.of(model=model)   # digests not computed yet: save() hashes as it writes
    out["save()"] = nbytes / timed(lambda: fresh.save(directory))
    out["load()"] = nbytes / timed(lambda: Snapshot.load(directory))
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mib", type=int, default=256)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--chunk-mib", type=int, default=4)
    parser.add_argument("--dir", default=None)
    args = parser.parse_args()
    torch.set_num_threads(1)
    model = model_of(args.mib)
    nbytes = sum(p.numel() * 4 for p in model.state_dict().values())
    directory = args.dir or tempfile.mkdtemp(dir="/dev/shm" if os.path.isdir("/dev/shm")
                                             else None)
    try:
        rounds = [one_round(model, args.chunk_mib << 20, directory)
                  for _ in range(args.repeats)]
    finally:
        if args.dir is None:
            shutil.rmtree(directory, ignore_errors=True)
    print(f"model: {nbytes / 2**20:.0f} MiB float32 in {len(model.state_dict())} arrays; "
          f"{os.cpu_count()} CPUs; medians of {args.repeats}; directory {directory}")
    print(f"{'what':<28}{'GB/s':>8}  {'x numpy copy':>12}  all rounds (GB/s)")
    copy = statistics.median(r["numpy copy"] for r in rounds)
    for what in rounds[0]:
        rates = [r[what] for r in rounds]
        med = statistics.median(rates)
        print(f"{what:<28}{med / 1e9:>8.2f}  {med / copy:>12.2f}  "
              f"{', '.join(f'{x / 1e9:.2f}' for x in rates)}")


if __name__ == "__main__":
    main()
