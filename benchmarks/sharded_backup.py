#!/usr/bin/env python3
"""What the sharded EASGD centre's backups cost (``ElasticAveraging(center="sharded",
elastic=True)``: every update an owner applies is forwarded to the next rank's replica), and
what a view change's re-shard costs, in the same run on the same machine.

Usage:
  python benchmarks/sharded_backup.py [-n 4] [--size 4M] [--rounds 20] [--repeats 5]

The same n processes run ``--repeats`` rounds of two blocks in turn: ``--rounds`` elastic
rounds (period 1, float32 parameters of ``--size`` elements, lr 0) without backups, then
with them (a fresh policy per block, 2 untimed rounds first). Per block: the wall time per
round of the slowest rank (the training thread's: what a worker waits for) and the bytes all
ranks sent per round (peer.stats(), all channels). The re-shard of a view change is one
allgather of the whole centre per bucket: its time is measured on the same buffer (median
of ``--repeats``), beside a round's. Medians over the repeats; the ratio backup / plain.
"""
from __future__ import annotations

import argparse
import statistics
import time

import numpy as np

from gossip.testing import spawn


def _size(text: str) -> int:
    units = {"K": 1 << 10, "M": 1 << 20}
    return int(text[:-1]) * units[text[-1].upper()] if text[-1].upper() in units else int(text)


def _block(peer, x, elastic, rounds):
    from gossip.policies import ElasticAveraging
    policy = ElasticAveraging(center="sharded", period=1, elastic=elastic).attach(peer, [x])
    for _ in range(2):
        policy.after_step()
    peer.barrier()
    sent0 = peer.stats()["bytes_sent"]
    t0 = time.perf_counter()
    for _ in range(rounds):
        policy.after_step()
    seconds = time.perf_counter() - t0
    peer.barrier()   # the others' last rounds need this peer's shard
    sent = peer.stats()["bytes_sent"] - sent0
    policy.close()
    return seconds / rounds, sent / rounds


def bench(peer, size, rounds, repeats):
    x = np.random.default_rng(peer.rank).normal(size=size).astype(np.float32)
    out = {"plain": [], "backup": [], "allgather": []}
    for _ in range(repeats):
        for case, elastic in (("plain", False), ("backup", True)):
            seconds, sent = _block(peer, x, elastic, rounds)
            worst = peer.allreduce(np.array([seconds]), op="max")[0]
            total = peer.allreduce(np.array([float(sent)]), op="sum")[0]
            out[case].append((worst, total))
        part = x[size * peer.rank // peer.world_size:size * (peer.rank + 1) // peer.world_size]
        peer.barrier()
        t0 = time.perf_counter()
        peer.allgather(part.copy(), variable=True)
        out["allgather"].append(peer.allreduce(np.array([time.perf_counter() - t0]),
                                               op="max")[0])
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("-n", type=int, default=4)
    ap.add_argument("--size", default="4M", help="float32 parameters (K, M suffixes)")
    ap.add_argument("--rounds", type=int, default=20)
    ap.add_argument("--repeats", type=int, default=5)
    args = ap.parse_args()
    size = _size(args.size)
    out = spawn(bench, n=args.n, timeout=1800, args=(size, args.rounds, args.repeats))[0]
    mib = size * 4 / 2**20
    print(f"{args.n} peers, {mib:.1f} MiB of float32 parameters (P), period 1, "
          f"{args.repeats} x {args.rounds} rounds per case")
    med = {}
    for case in ("plain", "backup"):
        t = statistics.median(w for w, _ in out[case])
        b = statistics.median(s for _, s in out[case])
        med[case] = (t, b)
        spread = ", ".join(f"{w * 1e3:.1f}" for w, _ in out[case])
        print(f"  {case:7s} round {t * 1e3:8.2f} ms (runs: {spread})   sent by all per round "
              f"{b / 2**20:8.1f} MiB = {b / (size * 4):.2f} P")
    print(f"  backup / plain: time {med['backup'][0] / med['plain'][0]:.2f}x, bytes "
          f"{med['backup'][1] / med['plain'][1]:.2f}x")
    ag = statistics.median(out["allgather"])
    print(f"  re-shard allgather of the centre (a view change): {ag * 1e3:.2f} ms "
          f"= {ag / med['plain'][0]:.2f} plain rounds")


if __name__ == "__main__":
    main()
