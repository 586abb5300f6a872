#!/usr/bin/env python3
"""Averaging policies against what they replace, in the same run on the same machine.

Usage:
  python benchmarks/policies.py [-n 4] [--steps 30] [--warmup 5] [--iters 10]
      [--repeats 15] [--block 20] [--gossip-bytes 64M] [--only sync,overlap,gossip]
      [--json rows.jsonl]

Three tables:

1. ``sync``: Synchronous (gradients allreduced in 25 MiB buckets that start during backward)
   against torch DistributedDataParallel over Gloo (``init_process_group("gloo")`` in separate
   processes, default 25 MiB buckets), same model, per-peer batch, thread count (1) and
   process count; plus the same n processes training without communication (the floor).
   Models: a small MLP (784-512-512-10, batch 64) and a small CNN (two 3x3 convolutions and
   a linear layer on 3x32x32 images, batch 32).
2. ``overlap``: the CNN step (compute-bound) with Asynchronous (as by default, and with
   max_staleness=None: no wait for the last exchange) and PushSum(overlap=True), and
   for reference PushSum, Gossip and Synchronous: the slowdown against no communication.
   The same processes run ``--repeats`` rounds of ``--block`` steps of each case in turn
   (the order rotating; each block attaches its policy to a fresh model after ``--warmup``
   untimed steps); each case is divided by the no-communication block of its own round,
   and the median over rounds is reported with its quartiles. Short interleaved blocks keep
   the baseline seconds away from each case, so the drift of a shared machine cancels out
   of the ratios.
3. ``gossip``: one Gossip round (policy.after_step) on a torch parameter of ``--gossip-bytes``
   (64 MiB) on a ring of n, against the neighbour exchange a user writes with
   torch.distributed (isend to both ring neighbours, irecv from both, wait, average: as
   shared/bench/bench_gossip_torch.py).

Method: step times are the wall time of ``--steps`` (overlap: ``--block``) steps after
``--warmup`` untimed ones, divided by the steps, on the slowest rank. A gossip round is
``barrier(); t0; round; t1`` and the figure is the median over ``--iters`` rounds of the
slowest rank's time. ratio = baseline time / gossip time (> 1: gossip is faster). On a
shared 2-core machine expect 10-30% noise between runs with 4 processes; compare ratios
within a run.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time

from gossip.bench import parse_size
from gossip.launch.supervisor import first_failure, free_port, supervise
from gossip.testing import spawn


# ---------------------------------------------------------------------------- models
def make_model(kind: str):
    import torch
    torch.manual_seed(0)
    nn = torch.nn
    if kind == "mlp":
        return nn.Sequential(nn.Flatten(), nn.Linear(784, 512), nn.ReLU(), nn.Linear(512, 512),
                             nn.ReLU(), nn.Linear(512, 10))
    if kind == "cnn":
        return nn.Sequential(nn.Conv2d(3, 32, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
                             nn.Conv2d(32, 64, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
                             nn.Flatten(), nn.Linear(64 * 8 * 8, 256), nn.ReLU(),
                             nn.Linear(256, 10))
    raise ValueError(kind)


def make_batch(kind: str, rank: int):
    import torch
    g = torch.Generator().manual_seed(rank)
    if kind == "mlp":
        x = torch.randn(64, 1, 28, 28, generator=g)
    else:
        x = torch.randn(32, 3, 32, 32, generator=g)
    return x, torch.randint(0, 10, (x.shape[0],), generator=g)


def timed_steps(model, opt, x, y, steps: int, warmup: int) -> float:
    import torch
    loss_fn = torch.nn.functional.cross_entropy
    for i in range(warmup + steps):
        if i == warmup:
            start = time.perf_counter()
        opt.zero_grad()
        loss_fn(model(x), y).backward()
        opt.step()
    return (time.perf_counter() - start) / steps


# ---------------------------------------------------------------------------- gossip side
def gossip_training(peer, kind: str, policy_name: str, kwargs: dict, steps: int, warmup: int):
    import torch
    import gossip
    torch.set_num_threads(1)
    model = make_model(kind)
    x, y = make_batch(kind, peer.rank)
    inner = torch.optim.SGD(model.parameters(), lr=0.01)
    if policy_name == "none":
        opt = inner
    else:
        opt = gossip.DistributedOptimizer(inner, peer=peer,
                                          policy=gossip.policies.make(policy_name, **kwargs))
    peer.barrier()
    seconds = timed_steps(model, opt, x, y, steps, warmup)
    stats = opt.stats() if policy_name != "none" else {}
    peer.barrier()
    if policy_name != "none":
        opt.close()
    return {"seconds": seconds, "bytes_sent": stats.get("bytes_sent", 0),
            "comm_fraction": stats.get("comm_fraction", 0.0)}


def gossip_rounds(peer, nbytes: int, iters: int, warmup: int):
    import torch
    import gossip
    torch.set_num_threads(1)
    x = torch.rand(nbytes // 4)
    policy = gossip.policies.Gossip().attach(peer, [x])
    times = []
    for i in range(warmup + iters):
        peer.barrier()
        start = time.perf_counter()
        policy.after_step()
        if i >= warmup:
            times.append(time.perf_counter() - start)
    policy.close()
    return times


# ---------------------------------------------------------------------------- torch side
def _torch_child(rank: int, target, n: int, port: int, args: tuple):
    os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
    from datetime import timedelta

    import torch
    import torch.distributed as dist
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                            world_size=n, timeout=timedelta(seconds=300))
    try:
        result = target(rank, n, *args)
        dist.barrier()
        return result
    finally:
        dist.destroy_process_group()


def run_torch(target, n: int, args: tuple, timeout: float = 600.0) -> list:
    """target(rank, n, *args) in n supervised processes joined by a Gloo process group."""
    outcomes = supervise(_torch_child, n, args=(target, n, free_port(), args), timeout=timeout,
                         name="torch")
    failed = first_failure(outcomes)
    if failed is not None:
        raise SystemExit(f"torch.distributed rank {failed.rank} failed:\n"
                         f"{failed.error or failed.output}")
    if any(o.status != "ok" for o in outcomes):
        raise SystemExit(f"torch.distributed run did not finish within {timeout:g}s")
    return [o.result for o in outcomes]


def ddp_training(rank: int, n: int, kind: str, steps: int, warmup: int):
    import torch
    import torch.distributed as dist
    model = torch.nn.parallel.DistributedDataParallel(make_model(kind))
    x, y = make_batch(kind, rank)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    dist.barrier()
    return {"seconds": timed_steps(model, opt, x, y, steps, warmup)}


def torch_ring_rounds(rank: int, n: int, nbytes: int, iters: int, warmup: int):
    import torch
    import torch.distributed as dist
    left, right = (rank - 1) % n, (rank + 1) % n
    count = nbytes // 4
    x = torch.rand(count)
    xl, xr = torch.empty(count), torch.empty(count)
    times = []
    for i in range(warmup + iters):
        dist.barrier()
        start = time.perf_counter()
        reqs = [dist.isend(x, left, tag=0), dist.isend(x, right, tag=1),
                dist.irecv(xr, right, tag=0), dist.irecv(xl, left, tag=1)]
        for q in reqs:
            q.wait()
        x = (xl + x + xr) / 3
        if i >= warmup:
            times.append(time.perf_counter() - start)
    return times


# ---------------------------------------------------------------------------- tables
def slowest(results: list, key: str = "seconds") -> float:
    return max(r[key] for r in results)


def median_of_slowest(per_rank: list[list[float]]) -> float:
    return statistics.median(max(ts) for ts in zip(*per_rank))


def format_size(nbytes: float) -> str:
    for unit, scale in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if nbytes >= scale:
            return f"{nbytes / scale:.2f} {unit}"
    return f"{nbytes:.0f} B"


def ms(seconds: float) -> str:
    return f"{seconds * 1e3:.2f} ms"


def table(header: list[str], rows: list[list[str]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    lines += ["| " + " | ".join(r) + " |" for r in rows]
    return "\n".join(lines)


def bench_sync(args, emit) -> str:
    rows = []
    for kind in ("mlp", "cnn"):
        base = spawn(gossip_training, n=args.n, timeout=600,
                     args=(kind, "none", {}, args.steps, args.warmup))
        ours = spawn(gossip_training, n=args.n, timeout=600,
                     args=(kind, "synchronous", {}, args.steps, args.warmup))
        ddp = run_torch(ddp_training, args.n, (kind, args.steps, args.warmup))
        t_base, t_ours, t_ddp = slowest(base), slowest(ours), slowest(ddp)
        params = sum(p.numel() for p in make_model(kind).parameters()) * 4
        emit({"table": "sync", "model": kind, "nprocs": args.n, "param_bytes": params,
              "none_s": t_base, "synchronous_s": t_ours, "ddp_gloo_s": t_ddp,
              "ratio": t_ddp / t_ours})
        rows.append([kind, format_size(params), ms(t_base), ms(t_ours), ms(t_ddp),
                     f"{t_ddp / t_ours:.2f}"])
    return table(["model", "params", "no communication", "Synchronous", "DDP (Gloo)",
                  "ratio DDP/Synchronous"], rows)


OVERLAP_CASES = [("none", {}), ("asynchronous", {}), ("asynchronous", {"max_staleness": None}),
                 ("push-sum", {"overlap": True}), ("push-sum", {}), ("gossip", {}),
                 ("synchronous", {})]


def overlap_training(peer, cases, block: int, warmup: int, repeats: int):
    """``repeats`` rounds in which every case trains ``block`` steps in turn, the order
    rotating from round to round, each case divided by the no-communication block of its own
    round, seconds away at most, so the drift of a shared machine cancels out of the ratio.
    Each block attaches its policy to a fresh model (so no other policy's threads and buffers
    sit in the process while it is timed), runs ``warmup`` untimed steps (first touches of
    the buffers), then the timed ones; after them, untimed, what the policy still has in
    flight is completed (Asynchronous.quiesce(), PushSum.flush()) before it closes, which
    leaves out the exchange of each block's last step (1/block of the traffic)."""
    import torch
    import gossip
    torch.set_num_threads(1)
    x, y = make_batch("cnn", peer.rank)
    rounds = []
    sent = [0] * len(cases)   # the peer's bytes sent during each case's timed blocks
    for r in range(repeats):
        seconds = [0.0] * len(cases)
        for k in range(len(cases)):
            i = (r + k) % len(cases)
            name, kwargs = cases[i]
            model = make_model("cnn")
            opt = torch.optim.SGD(model.parameters(), lr=0.01)
            if name != "none":
                opt = gossip.DistributedOptimizer(opt, peer=peer,
                                                  policy=gossip.policies.make(name, **kwargs))
            if warmup:
                timed_steps(model, opt, x, y, warmup, 0)
            policy = getattr(opt, "policy", None)
            settle(policy)
            peer.barrier()
            before = peer.stats()["bytes_sent"]
            seconds[i] = timed_steps(model, opt, x, y, block, 0)
            settle(policy)
            sent[i] += peer.stats()["bytes_sent"] - before
            if policy is not None:
                opt.close()
        rounds.append(seconds)
    return {"rounds": rounds, "bytes_per_step": [b / (repeats * block) for b in sent]}


def settle(policy) -> None:
    """Complete what a policy has in flight (every peer calls it together)."""
    import gossip
    if isinstance(policy, gossip.policies.Asynchronous):
        policy.quiesce()
        policy.resume()
    elif isinstance(policy, gossip.policies.PushSum):
        policy.flush()


def bench_overlap(args, emit) -> str:
    cases = OVERLAP_CASES
    res = spawn(overlap_training, n=args.n, timeout=300 + 60 * args.repeats,
                args=(cases, args.block, args.warmup, args.repeats))
    rows = []
    for i, (name, kwargs) in enumerate(cases):
        # Per round, the slowest rank's time (a step is as slow as the slowest peer's).
        times = [max(r["rounds"][k][i] for r in res) for k in range(args.repeats)]
        bases = [max(r["rounds"][k][0] for r in res) for k in range(args.repeats)]
        slowdowns = [t / b for t, b in zip(times, bases)]
        t, slow = statistics.median(times), statistics.median(slowdowns)
        low, high = quartiles(slowdowns)
        label = name + ("(" + ", ".join(f"{k}={v}" for k, v in kwargs.items()) + ")"
                        if kwargs else "")
        sent = max(r["bytes_per_step"][i] for r in res)
        emit({"table": "overlap", "policy": label, "nprocs": args.n, "seconds": t,
              "slowdown": slow, "slowdowns": slowdowns, "bytes_per_step": sent,
              "block": args.block})
        rows.append([label, ms(t), f"{slow:.2f}x", f"{low:.2f}-{high:.2f}",
                     format_size(int(sent))])
    return table(["policy (CNN step)", "step time (median)", "vs no communication (median)",
                  f"quartiles over {args.repeats} rounds", "bytes sent per step per peer"],
                 rows)


def quartiles(values: list[float]) -> tuple[float, float]:
    if len(values) < 2:
        return values[0], values[0]
    q = statistics.quantiles(values, n=4, method="inclusive")
    return q[0], q[2]


def bench_gossip(args, emit) -> str:
    import topologies
    nbytes = parse_size(args.gossip_bytes)
    ours = spawn(gossip_rounds, n=args.n, timeout=600, topology=topologies.Ring(args.n),
                 args=(nbytes, args.iters, 2))
    theirs = run_torch(torch_ring_rounds, args.n, (nbytes, args.iters, 2))
    t_ours, t_theirs = median_of_slowest(ours), median_of_slowest(theirs)
    emit({"table": "gossip", "nprocs": args.n, "bytes": nbytes, "gossip_s": t_ours,
          "torch_isend_irecv_s": t_theirs, "ratio": t_theirs / t_ours})
    return table(["round on a ring", "bytes", "Gossip policy", "torch isend/irecv (Gloo)",
                  "ratio torch/Gossip"],
                 [[f"n={args.n}", format_size(nbytes), ms(t_ours), ms(t_theirs),
                   f"{t_theirs / t_ours:.2f}"]])


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("-n", type=int, default=4, help="processes (default 4)")
    ap.add_argument("--steps", type=int, default=30, help="timed training steps")
    ap.add_argument("--warmup", type=int, default=5, help="untimed training steps")
    ap.add_argument("--iters", type=int, default=10, help="timed gossip rounds")
    ap.add_argument("--repeats", type=int, default=15,
                    help="overlap: rounds of every case, interleaved in the same processes "
                         "(medians)")
    ap.add_argument("--block", type=int, default=20,
                    help="overlap: timed steps of a case in each round")
    ap.add_argument("--gossip-bytes", default="64M")
    ap.add_argument("--only", default="sync,overlap,gossip")
    ap.add_argument("--json", default=None, help="also append every row here (JSON lines)")
    args = ap.parse_args(argv)
    if (args.n < 2 or args.steps < 1 or args.iters < 1 or args.warmup < 0 or args.repeats < 1
            or args.block < 1):
        ap.error("-n must be at least 2, --steps, --iters, --repeats and --block at least 1, "
                 "--warmup >= 0")
    parts = [p for p in args.only.split(",") if p]
    unknown = set(parts) - {"sync", "overlap", "gossip"}
    if unknown:
        ap.error(f"unknown --only parts {sorted(unknown)}; choose from sync, overlap, gossip")

    def emit(row: dict) -> None:
        if args.json:
            with open(args.json, "a") as f:
                f.write(json.dumps(row) + "\n")

    print(f"# policies benchmark: {args.n} processes, {os.cpu_count()} CPUs, 1 torch thread "
          f"each, load average {os.getloadavg()[0]:.1f}", flush=True)
    started = time.perf_counter()
    runners = {"sync": bench_sync, "overlap": bench_overlap, "gossip": bench_gossip}
    for part in parts:
        print()
        print(runners[part](args, emit), flush=True)
    print(f"\n(total {time.perf_counter() - started:.0f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
