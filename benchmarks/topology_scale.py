"""Topology math at scale (issue #38, item 3): spectral gap, SLEM and rounds of every
built-in topology at n = 4,096 (and the structured ones at 65,536), each in a fresh process:
the time of what a peer computes at start (its SLEM, gap and rounds, its own neighbours and
weights), the end-to-end time of `gossip topology SPEC -n N`, and the process's peak memory.
With --dense, the same numbers from the dense eigensolver the topologies used before (the
n x n matrix and numpy.linalg), for the ratio. Then the vectorised mixing simulation
(gossip.simulation.simulate_mixing) of 65,536 peers: 1,000 rounds of each structured graph.

    python benchmarks/topology_scale.py [--repeats 3] [--dense] [--json OUT.json]
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.realpath(__file__))
REPO = os.path.dirname(HERE)

CASES = [
    ("ring", 4096), ("torus", 4096), ("exponential", 4096), ("one-peer-exponential", 4096),
    ("complete", 4096), ("random:degree=3,seed=0", 4096), ("random:p=0.004,seed=0", 4096),
    ("ring", 65536), ("torus", 65536), ("exponential", 65536),
    ("one-peer-exponential", 65536), ("complete", 65536),
]

MIXING = [("ring", "gossip"), ("torus", "gossip"), ("exponential", "push-sum"),
          ("one-peer-exponential", "push-sum")]

_MIXING_PROBE = r"""
import json, sys
import topologies
from gossip.simulation import simulate_mixing
spec, n, rule, rounds, dim = sys.argv[1], int(sys.argv[2]), sys.argv[3], int(sys.argv[4]), int(sys.argv[5])
trace = simulate_mixing(topologies.parse(spec, n), rounds, rule=rule, dim=dim)
window = trace.rate_window()   # (the rounds above float64's floor)
rate = trace.measured_rate(*window) if window else float("nan")
print(json.dumps({"seconds": trace.seconds, "rate": rate, "window": window or [0, 0],
                  "spectral_rate": trace.spectral_rate()}))
"""

_PROBE = r"""
import json, resource, sys, time
import topologies
spec, n, dense = sys.argv[1], int(sys.argv[2]), sys.argv[3] == "1"
start = time.perf_counter()
t = topologies.parse(spec, n)
built = time.perf_counter()
if dense:
    slem = topologies.slem(t.period_matrix())
    rounds = topologies.consensus_rounds(slem, period=t.period, size=t.size)
else:
    slem, rounds = t.second_eigenvalue(), t.rounds_to_reduce()
    t.weights(0), t.push_weights(0), t.in_neighbors(0), t.out_neighbors(0)
done = time.perf_counter()
print(json.dumps({"build_s": built - start, "spectral_s": done - built, "slem": slem,
                  "rounds": rounds if rounds != float("inf") else "inf",
                  "peak_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}))
"""


def _env() -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [REPO, env.get("PYTHONPATH")]))
    return env


def probe(spec: str, n: int, dense: bool) -> dict:
    out = subprocess.run([sys.executable, "-c", _PROBE, spec, str(n), "1" if dense else "0"],
                         capture_output=True, text=True, env=_env(), check=True, timeout=900)
    return json.loads(out.stdout)


def mixing_probe(spec: str, n: int, rule: str, rounds: int, dim: int, repeats: int) -> dict:
    runs = []
    for _ in range(repeats):
        out = subprocess.run([sys.executable, "-c", _MIXING_PROBE, spec, str(n), rule,
                              str(rounds), str(dim)], capture_output=True, text=True,
                             env=_env(), check=True, timeout=900)
        runs.append(json.loads(out.stdout))
    return {"spec": spec, "n": n, "rule": rule, "dim": dim, "rounds": rounds,
            "seconds": statistics.median(r["seconds"] for r in runs),
            "rate": runs[0]["rate"], "window": runs[0]["window"],
            "spectral_rate": runs[0]["spectral_rate"]}


def cli_seconds(spec: str, n: int) -> float:
    start = time.perf_counter()
    subprocess.run([sys.executable, "-m", "gossip", "topology", spec, "-n", str(n)],
                   stdout=subprocess.DEVNULL, env=_env(), check=True, timeout=900)
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--dense", action="store_true",
                        help="also time the dense eigensolver at n <= 4096 (tens of seconds)")
    parser.add_argument("--only", choices=("topologies", "mixing"),
                        help="run one of the two tables")
    parser.add_argument("--json", metavar="OUT")
    args = parser.parse_args()
    rows = []
    head = (f"{'topology':<24} {'n':>6} {'SLEM':>10} {'rounds':>9} {'peer s':>8} "
            f"{'build s':>8} {'CLI s':>7} {'peak MB':>8}")
    if args.dense:
        head += f" {'dense s':>8} {'dense MB':>9}"
    print(head, flush=True)
    for spec, n in CASES if args.only != "mixing" else []:
        runs = [probe(spec, n, False) for _ in range(args.repeats)]
        row = {"spec": spec, "n": n, "slem": runs[0]["slem"], "rounds": runs[0]["rounds"],
               "spectral_s": statistics.median(r["spectral_s"] for r in runs),
               "build_s": statistics.median(r["build_s"] for r in runs),
               "peak_mb": statistics.median(r["peak_mb"] for r in runs),
               "cli_s": statistics.median(cli_seconds(spec, n) for _ in range(args.repeats))}
        line = (f"{spec:<24} {n:>6} {row['slem']:>10.6f} {row['rounds']!s:>9} "
                f"{row['spectral_s']:>8.3f} {row['build_s']:>8.3f} {row['cli_s']:>7.2f} "
                f"{row['peak_mb']:>8.0f}")
        if args.dense and n <= 4096:
            d = probe(spec, n, True)
            row.update(dense_s=d["spectral_s"], dense_mb=d["peak_mb"], dense_slem=d["slem"])
            line += f" {d['spectral_s']:>8.2f} {d['peak_mb']:>9.0f}"
        rows.append(row)
        print(line, flush=True)
    print("peer s: SLEM + gap + rounds + rank 0's neighbours and weights, after the graph is "
          "built (build s);\nCLI s: `gossip topology SPEC -n N` end to end (medians of "
          f"{args.repeats} fresh processes)")
    mixing = []
    print(f"\n{'simulate_mixing':<24} {'n':>6} {'rule':>9} {'dim':>4} {'rounds':>7} "
          f"{'seconds':>8} {'rate':>10} {'SLEM rate':>10} {'over rounds':>12}", flush=True)
    for spec, rule in MIXING if args.only != "topologies" else []:
        for dim in (1, 16):
            m = mixing_probe(spec, 65536, rule, 1000, dim, args.repeats)
            mixing.append(m)
            print(f"{spec:<24} {65536:>6} {rule:>9} {dim:>4} {1000:>7} {m['seconds']:>8.2f} "
                  f"{m['rate']:>10.6f} {m['spectral_rate']:>10.6f} {str(m['window']):>12}", flush=True)
    print("seconds: the rounds alone (median of fresh processes); rate: the measured factor "
          "per round over the second half of the rounds before the distance fell to 1e-9 of "
          "its start")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"topologies": rows, "mixing": mixing}, f, indent=1)


if __name__ == "__main__":
    main()
