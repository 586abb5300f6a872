#!/usr/bin/env python3
"""Five claims of the decentralized-training papers, reproduced in small on this machine, so a
reader can see which of them this runtime bears out, with the paper's figure beside ours.

Usage:
  python benchmarks/claims.py [--quick] [--claims 1,3] [--repeats 3] [--steps 240]
      [-n 4] [--topology-peers 8] [--link 100mbit,5ms] [--slowdown 5] [--json rows.jsonl]

Claims (the papers' own experiments are ResNets on ImageNet/CIFAR on 16-128 GPUs; ours are
a small CNN on scikit-learn's digits, shipped inside scikit-learn, on real peer processes):

1. Lian et al. 2017 (D-PSGD): ``gossip`` on a ring matches ``synchronous`` (allreduce) in
   accuracy and beats it in wall time on a slow network (every link emulated, GOSSIP_LINK).
2. Lian et al. 2018 (AD-PSGD): with one peer ``--slowdown`` times slower, ``asynchronous``
   keeps the other peers' samples/s where ``synchronous`` drops to the straggler's pace.
3. Assran et al. 2019 (SGP): ``push-sum`` within about a point of allreduce accuracy.
4. Zhang et al. 2015 (EASGD): ``elastic`` is stable and sends fewer bytes per peer than
   ``synchronous`` at similar accuracy.
5. Koloskova et al. 2020: the consensus distance grows as the graph is worse connected
   (ring vs exponential vs complete) and as the data are less iid (Dirichlet shards).

Method: every configuration trains the same CNN (gossip.demo.model.make_cnn, the same
initial weights on every peer) with SGD (lr 0.05, momentum 0.9, batch 32) for ``--steps``
steps through gossip.DistributedOptimizer, each peer on its own shard of the training set
(gossip.demo.data.shard: iid, or Dirichlet(alpha) for non-iid). Accuracy is the test-set
accuracy (360 images: one image is 0.28 points) of the peers' averaged model; the wall time
is the slowest peer's training loop; samples/s are each peer's own; bytes are what a peer
sent during training (Policy.stats); the consensus distance is Policy.consensus_distance()
after the last step (what is in flight completed first). Figures are medians over
``--repeats`` runs with seeds 0, 1, ... (the seed picks the shards and the batch order).
Verdicts are computed from the measured figures with the thresholds printed beside them.
4 peer processes on 2 cores contend for the CPUs: the compute per step is slower than on
4 cores, which shrinks communication's share; the header says how many cores there are.
No figure is asserted anywhere (tests/bench/test_claims.py checks the table's shape only).
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import statistics
import sys
import threading
import time
from dataclasses import dataclass, field

import numpy as np

from gossip.testing import spawn

__all__ = ["Run", "Claim", "CLAIMS", "train_runs", "main"]

#: The non-iid concentration of claim 5 (0.1: each peer sees mostly one or two classes).
NON_IID_ALPHA = 0.1
LR, MOMENTUM, BATCH = 0.05, 0.9, 32


@dataclass(frozen=True)
class Run:
    """One training configuration, run by every peer of a spawn."""
    label: str                 # the row it feeds, e.g. "gossip ring"
    policy: str                # gossip.policies name
    seed: int = 0              # shards and batch order
    topology: str | None = None   # topologies.parse spec for graph policies, e.g. "ring"
    alpha: float | None = None    # Dirichlet concentration of the shards; None: iid
    slowdown: float = 1.0      # rank 1 is this many times slower (sleeps after its compute)
    options: dict = field(default_factory=dict)   # the policy's keyword arguments


# ---------------------------------------------------------------------------- peers
def _load(seed: int, rank: int, n: int, alpha: float | None):
    import torch
    from gossip.demo.data import load_digits, shard
    data = load_digits()
    rows = shard(len(data.train_labels), rank, n, seed=seed, labels=data.train_labels,
                 alpha=alpha)
    scale = data.max_value
    mean = float(data.train_images.mean()) / scale
    std = float(data.train_images.std()) / scale

    def tensors(images, labels):
        x = (torch.from_numpy(images.astype(np.float32)) / scale - mean) / std
        return x.unsqueeze(1), torch.from_numpy(labels)

    return (*tensors(data.train_images[rows], data.train_labels[rows]),
            *tensors(data.test_images, data.test_labels))


def _accuracy(model, x, y) -> float:
    import torch
    with torch.no_grad():
        return float((model(x).argmax(1) == y).float().mean())


def _one_run(peer, run: Run, steps: int) -> dict:
    import torch
    import gossip
    import topologies
    from gossip.demo.model import make_cnn
    n, rank = peer.world_size, peer.rank
    xs, ys, xt, yt = _load(run.seed, rank, n, run.alpha)
    torch.manual_seed(1000 + run.seed)   # the same initial weights on every peer
    model = make_cnn((8, 8))
    options = dict(run.options)
    if run.topology:
        options["topology"] = topologies.parse(run.topology, n)
    policy = gossip.policies.make(run.policy, **options)
    opt = gossip.DistributedOptimizer(
        torch.optim.SGD(model.parameters(), lr=LR, momentum=MOMENTUM), peer=peer, policy=policy)
    order = np.random.default_rng([run.seed, rank])
    loss_fn = torch.nn.functional.cross_entropy
    batches = [torch.from_numpy(order.choice(len(ys), BATCH, replace=False))
               for _ in range(steps)]
    peer.barrier()
    start = time.perf_counter()
    for idx in batches:
        t0 = time.perf_counter()
        opt.zero_grad()
        loss = loss_fn(model(xs[idx]), ys[idx])
        loss.backward()
        if run.slowdown > 1 and rank == 1:
            threading.Event().wait((run.slowdown - 1) * (time.perf_counter() - t0))
        opt.step()
    seconds = time.perf_counter() - start
    sent = opt.stats()["bytes_sent"]
    if isinstance(policy, gossip.policies.Asynchronous):
        policy.quiesce()          # what is in flight lands before anything is measured
    elif isinstance(policy, gossip.policies.PushSum):
        policy.flush()
    peer.barrier()
    consensus = policy.consensus_distance()
    own = _accuracy(model, xt, yt)
    with torch.no_grad():
        flat = torch.nn.utils.parameters_to_vector(model.parameters()).double().numpy().copy()
        peer.allreduce(flat, op="mean")
        averaged = make_cnn((8, 8))
        torch.nn.utils.vector_to_parameters(torch.from_numpy(flat).float(),
                                            averaged.parameters())
    result = {"label": run.label, "seed": run.seed, "rank": rank, "seconds": seconds,
              "samples_per_s": steps * BATCH / seconds, "bytes_sent": sent,
              "accuracy": _accuracy(averaged, xt, yt), "own_accuracy": own,
              "consensus": consensus, "final_loss": float(loss),
              "finite": bool(np.isfinite(flat).all())}
    peer.barrier()
    opt.close()
    return result


def train_runs(peer, runs: list[Run], steps: int) -> list[dict]:
    """Every run in turn in this peer process (one spawn, one torch import, for many runs)."""
    import torch
    torch.set_num_threads(1)
    return [_one_run(peer, run, steps) for run in runs]


def execute(runs: list[Run], n: int, steps: int, link: str | None = None) -> dict:
    """Run ``runs`` on ``n`` peers (links emulated at ``link``); per label, one dict per run
    of the figures of the group: accuracy of the averaged model, worst peer, slowest peer's
    seconds, the median samples/s of the peers other than rank 1, bytes per peer..."""
    extra = {"link": link} if link else {}
    per_rank = spawn(train_runs, n=n, timeout=600 + 4 * steps, args=(runs, steps),
                     preload=("torch",), **extra)
    out: dict[str, list[dict]] = {}
    for k, run in enumerate(runs):
        rows = [r[k] for r in per_rank]
        others = [r["samples_per_s"] for r in rows if r["rank"] != 1] or [rows[0]["samples_per_s"]]
        out.setdefault(run.label, []).append({
            "accuracy": rows[0]["accuracy"], "worst_peer": min(r["own_accuracy"] for r in rows),
            "seconds": max(r["seconds"] for r in rows),
            "others_samples_per_s": statistics.median(others),
            "rank1_samples_per_s": rows[1]["samples_per_s"] if len(rows) > 1 else None,
            "bytes_per_peer": statistics.mean(r["bytes_sent"] for r in rows),
            "consensus": rows[0]["consensus"],
            "stable": all(r["finite"] and np.isfinite(r["final_loss"]) for r in rows)})
    return out


def med(results: dict, label: str, key: str) -> float:
    return statistics.median(r[key] for r in results[label])


# ---------------------------------------------------------------------------- claims
@dataclass(frozen=True)
class Claim:
    """A paper's claim: what it says and what the paper reports (quoted or qualitative)."""
    number: int
    claim: str
    paper: str


CLAIMS = {
    1: Claim(1, "Lian et al. 2017 (D-PSGD): decentralized SGD matches centralized accuracy "
                "and beats it in wall time on a slow network",
             "abstract: 'on network configurations with low bandwidth or high latency, D-PSGD "
             "can be up to one order of magnitude faster than its well-optimized centralized "
             "counterparts', at comparable accuracy per epoch (CNTK/Torch, up to 112 GPUs)"),
    2: Claim(2, "Lian et al. 2018 (AD-PSGD): asynchronous decentralized SGD keeps its "
                "throughput under a straggler; synchronous drops to the straggler's pace",
             "abstract: outperforms AllReduce-SGD 'often by orders of magnitude in a "
             "heterogeneous environment'; ResNet-50/ImageNet epochs 'up to 4-8x faster' on "
             "a shared HPC network (no straggler figure quoted here)"),
    3: Claim(3, "Assran et al. 2019 (SGP): push-sum within about a point of allreduce "
                "accuracy",
             "qualitative: SGP's ResNet-50/ImageNet validation accuracy close to "
             "AllReduce-SGD's (within about a point); exact table figures not quoted here"),
    4: Claim(4, "Zhang et al. 2015 (EASGD): elastic averaging is stable and communicates "
                "less than synchronous at similar accuracy",
             "qualitative: stability condition proved; CIFAR-10/ImageNet CNNs trained "
             "faster than DOWNPOUR, 'very communication efficient' (workers meet the centre "
             "every tau steps); no single number quoted here"),
    5: Claim(5, "Koloskova et al. 2020 (unified decentralized SGD): consensus distance "
                "grows with worse-connected graphs and with data heterogeneity",
             "theory (no figure quoted here): the rate's extra terms grow with the "
             "heterogeneity zeta^2 and shrink with the mixing parameter p (spectral gap)"),
}


def runs_for(number: int, args) -> tuple[list[Run], int, str | None]:
    """(runs, peers, link) of one claim."""
    seeds = range(args.repeats)
    if number == 1:
        return ([Run(label, policy, s, topology) for s in seeds for label, policy, topology in
                 (("synchronous", "synchronous", None), ("gossip ring", "gossip", "ring"))],
                args.n, args.link)
    if number == 2:
        return ([Run(f"{policy} {tag}", policy, s, slowdown=slow) for s in seeds
                 for policy in ("synchronous", "asynchronous")
                 for tag, slow in (("alone", 1.0), ("straggler", args.slowdown))],
                args.n, None)
    if number == 3:
        return ([Run(label, policy, s) for s in seeds for label, policy in
                 (("synchronous", "synchronous"), ("push-sum", "push-sum"))], args.n, None)
    if number == 4:
        return ([Run(label, policy, s) for s in seeds for label, policy in
                 (("synchronous", "synchronous"), ("elastic", "elastic"))], args.n, None)
    topos = ("ring", "exponential", "complete")
    return ([Run(f"{t} {d}", "gossip", s, topology=t, alpha=a) for s in seeds for t in topos
             for d, a in (("iid", None), ("non-iid", NON_IID_ALPHA))],
            args.topology_peers, None)


def run_claims(numbers: list[int], args):
    """Yield (claim, its results by label) for each claim of ``numbers``. Claims that run
    on the same peers and links share one spawn, and a configuration two claims need (the
    synchronous baseline) runs once."""
    groups: dict[tuple, list[int]] = {}
    for number in numbers:
        _, n, link = runs_for(number, args)
        groups.setdefault((n, link), []).append(number)
    for (n, link), members in groups.items():
        runs: list[Run] = []
        for number in members:
            runs += [r for r in runs_for(number, args)[0] if r not in runs]
        t0 = time.perf_counter()
        res = execute(runs, n, args.steps, link)
        print(f"# claims {','.join(map(str, members))}: {len(runs)} runs on {n} peers"
              f"{f', links {link}' if link else ''} in {time.perf_counter() - t0:.0f} s",
              flush=True)
        for number in members:
            labels = {r.label for r in runs_for(number, args)[0]}
            yield number, {k: v for k, v in res.items() if k in labels}


def judge(number: int, res: dict, args) -> tuple[str, str]:
    """(our figure, verdict) of one claim, from its measured results."""
    def pct(label: str) -> float:
        return 100 * med(res, label, "accuracy")

    if number == 1:
        sync, dec = pct("synchronous"), pct("gossip ring")
        speedup = med(res, "synchronous", "seconds") / med(res, "gossip ring", "seconds")
        ours = (f"accuracy {dec:.1f}% gossip vs {sync:.1f}% synchronous; wall time "
                f"{med(res, 'gossip ring', 'seconds'):.1f} s vs "
                f"{med(res, 'synchronous', 'seconds'):.1f} s: gossip {speedup:.2f}x faster")
        return ours, _verdict([abs(dec - sync) <= 1.0, speedup > 1.1],
                              "accuracy within 1 point; faster by more than 10%")
    if number == 2:
        def rate(label: str, key: str = "others_samples_per_s") -> float:
            return med(res, label, key)

        ratio = {p: rate(f"{p} straggler") / rate(f"{p} alone")
                 for p in ("synchronous", "asynchronous")}
        # The straggler's own pace in the synchronous run: what its neighbours are held to.
        pace = rate("synchronous straggler", "rank1_samples_per_s")
        ours = "; ".join(
            f"{p} {rate(f'{p} alone'):.0f} -> {rate(f'{p} straggler'):.0f} samples/s "
            f"({ratio[p]:.2f}x)" for p in ("asynchronous", "synchronous"))
        ours += (f" (the other peers' median; the straggler itself "
                 f"{rate('asynchronous straggler', 'rank1_samples_per_s'):.0f} / {pace:.0f})")
        return ours, _verdict([ratio["asynchronous"] >= 0.7,
                               rate("synchronous straggler") <= 1.2 * pace,
                               ratio["asynchronous"] > 1.5 * ratio["synchronous"]],
                              "asynchronous keeps >= 0.7x; synchronous's others within 1.2x "
                              "of the straggler's pace; asynchronous's ratio > 1.5x "
                              "synchronous's")
    if number == 3:
        sync, ps = pct("synchronous"), pct("push-sum")
        ours = f"accuracy {ps:.1f}% push-sum vs {sync:.1f}% synchronous ({ps - sync:+.1f})"
        return ours, _verdict([abs(ps - sync) <= 1.0, abs(ps - sync) <= 2.0],
                              "within 1 point (partly: within 2)", all_or_first=True)
    if number == 4:
        sync, ea = pct("synchronous"), pct("elastic")
        less = med(res, "synchronous", "bytes_per_peer") / med(res, "elastic", "bytes_per_peer")
        stable = all(r["stable"] for r in res["elastic"])
        ours = (f"accuracy {ea:.1f}% elastic vs {sync:.1f}% synchronous; "
                f"{med(res, 'elastic', 'bytes_per_peer') / 1e6:.1f} MB vs "
                f"{med(res, 'synchronous', 'bytes_per_peer') / 1e6:.1f} MB sent per peer "
                f"({less:.1f}x less); {'stable' if stable else 'NOT stable'}")
        return ours, _verdict([stable, less > 1.0, abs(ea - sync) <= 1.0],
                              "finite and converged; fewer bytes; accuracy within 1 point")
    import topologies
    n = args.topology_peers
    topos = ("ring", "exponential", "complete")
    cd = {(t, d): med(res, f"{t} {d}", "consensus") for t in topos
          for d in ("iid", "non-iid")}
    gaps = {t: topologies.parse(t, n).spectral_gap() for t in topos}
    ours = "consensus distance iid / non-iid: " + "; ".join(
        f"{t} (gap {gaps[t]:.2f}) {cd[(t, 'iid')]:.3f} / {cd[(t, 'non-iid')]:.3f}"
        for t in topos)
    # Every pair of graphs whose spectral gaps differ: the worse-connected one apart more
    # (Exponential(4) is Ring(4)'s gap, so that pair is not compared).
    pairs = [(a, b) for a in topos for b in topos if gaps[a] < gaps[b] - 1e-9]
    checks = [cd[(a, d)] > cd[(b, d)] for a, b in pairs for d in ("iid", "non-iid")]
    checks += [cd[(t, "non-iid")] > cd[(t, "iid")] for t in topos if gaps[t] < 1 - 1e-9]
    return ours, _verdict(checks, "a smaller spectral gap, a larger distance, iid and non-iid; "
                                  "non-iid > iid on every graph short of complete")


def _verdict(checks: list[bool], rule: str, all_or_first: bool = False) -> str:
    """'holds' if every check passes, 'does not hold' if none does, else 'partly'; with
    ``all_or_first`` the checks are nested (the first is the strict one)."""
    if all_or_first:
        word = "holds" if checks[0] else "partly" if any(checks) else "does not hold"
        return f"{word} ({rule})"
    word = "holds" if all(checks) else "partly" if any(checks) else "does not hold"
    return f"{word} ({sum(checks)}/{len(checks)} checks: {rule})"


def scale(number: int, args) -> str:
    n = args.topology_peers if number == 5 else args.n
    what = {1: f"every link {args.link} (emulated)",
            2: f"rank 1 {args.slowdown:g}x slower in compute (sleeps after it; the sleep "
               f"frees a core for the others, so their samples/s can rise)",
            3: "push-sum on the time-varying one-peer exponential graph",
            4: "elastic alpha 0.9/n, period 4 (defaults)",
            5: f"gossip; non-iid = Dirichlet({NON_IID_ALPHA}) shards"}[number]
    return (f"{n} peers on {os.cpu_count()} cores, digits {1437 // n} train images each, "
            f"CNN 14k params, {args.steps} steps of {BATCH}, median of {args.repeats}; {what}")


def table(rows: list[list[str]]) -> str:
    head = ["#", "claim", "paper's figure", "ours (measured)", "scale", "verdict"]
    lines = ["| " + " | ".join(head) + " |", "|" + "|".join("---" for _ in head) + "|"]
    return "\n".join(lines + ["| " + " | ".join(r) + " |" for r in rows])


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true",
                    help="one repetition of fewer steps (about 30 s for all claims)")
    ap.add_argument("--claims", default="1,2,3,4,5")
    ap.add_argument("--repeats", type=int, default=None, help="default 3 (--quick: 1)")
    ap.add_argument("--steps", type=int, default=None, help="default 240 (--quick: 80)")
    ap.add_argument("-n", type=int, default=4, help="peers of claims 1-4")
    ap.add_argument("--topology-peers", type=int, default=None,
                    help="peers of claim 5 (default 8; --quick: 4)")
    ap.add_argument("--link", default="100mbit,5ms", help="claim 1's emulated links")
    ap.add_argument("--slowdown", type=float, default=5.0, help="claim 2's straggler")
    ap.add_argument("--json", default=None, help="append every run's figures (JSON lines)")
    args = ap.parse_args(argv)
    args.repeats = args.repeats or (1 if args.quick else 3)
    args.steps = args.steps or (80 if args.quick else 240)
    args.topology_peers = args.topology_peers or (4 if args.quick else 8)
    try:
        numbers = sorted({int(c) for c in args.claims.split(",") if c.strip()})
    except ValueError:
        ap.error(f"--claims takes numbers 1-5 separated by commas, got {args.claims!r}")
    if not numbers or any(c not in CLAIMS for c in numbers):
        ap.error(f"--claims takes numbers 1-5, got {args.claims!r}")
    if args.n < 2 or args.topology_peers < 3 or args.repeats < 1 or args.steps < 1:
        ap.error("-n >= 2, --topology-peers >= 3, --repeats and --steps >= 1")
    print(f"# paper claims in small: {datetime.date.today()}, {os.cpu_count()} cores, "
          f"load average {os.getloadavg()[0]:.1f}; peers are processes contending for the "
          f"cores (4 peers on 2 cores run slower than on 4), so wall times and samples/s "
          f"are this machine's, compare within a row", flush=True)
    rows = []
    started = time.perf_counter()
    for number, res in run_claims(numbers, args):
        ours, verdict = judge(number, res, args)
        c = CLAIMS[number]
        rows.append([str(number), c.claim, c.paper, ours, scale(number, args), verdict])
        print(f"claim {number}: {ours} -> {verdict}", flush=True)
        if args.json:
            with open(args.json, "a") as f:
                for label, results in res.items():
                    for r in results:
                        f.write(json.dumps({"claim": number, "label": label, **r}) + "\n")
    print()
    print(table(rows))
    print(f"\n(total {time.perf_counter() - started:.0f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
