"""`gossip simulate mixing SPEC -n N`: the mixing dynamics of N peers in this process, vectorised
(gossip.simulation.simulate_mixing): the consensus distance round by round beside the
topology's SLEM, to 65,536 peers and beyond in seconds."""
from __future__ import annotations

import argparse
import json
import math
import statistics
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # pragma: no cover - annotations only
    from gossip.simulation import MixingTrace

__all__ = ["register", "main", "shown_rounds"]


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add the `simulate` subcommand (and its `mixing` mode) to the `gossip` parser."""
    parser = subparsers.add_parser(
        "simulate", help="simulate many peers in this process (the mixing dynamics)",
        description="Simulate peers in this process. `mixing`: the gossip or push-sum rounds "
                    "of N peers alone, vectorised over the topology's sparse mixing matrices "
                    "(no model, no network): how fast the peers' disagreement shrinks.")
    modes = parser.add_subparsers(dest="mode", metavar="MODE")
    mixing = modes.add_parser(
        "mixing", help="the gossip or push-sum rounds of N peers, vectorised",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        description=(
            "Give each of N peers random values and run ROUNDS rounds of mixing over the\n"
            "topology: gossip (x <- W_t x, D-PSGD's round) or push-sum (SGP's, with the push\n"
            "weights and x / w). Prints the consensus distance (the mean over peers of\n"
            "||x_i - mean x||) at rounds 0, 1, 2, 5, 10, ... beside d0 x SLEM^t, and the rate\n"
            "per round measured once the slowest mode dominates."),
        epilog=(
            "examples:\n"
            "  gossip simulate mixing ring -n 65536 --rounds 1000\n"
            "  gossip simulate mixing exponential -n 4096 --rule push-sum --json out.json\n"
            "  gossip simulate mixing torus:32x32 --rounds 2000 --plot decay.png"))
    mixing.add_argument("spec", help="topology spec, as for `gossip topology`")
    mixing.add_argument("-n", "--size", type=int, metavar="N", help="number of peers")
    mixing.add_argument("--rounds", type=int, default=100, metavar="R",
                        help="rounds to run (default 100)")
    mixing.add_argument("--rule", choices=("gossip", "push-sum"), default=None,
                        help="gossip (default for undirected graphs) or push-sum (default for "
                             "directed and time-varying ones)")
    mixing.add_argument("--dim", type=int, default=1, metavar="D",
                        help="values per peer (default 1)")
    mixing.add_argument("--seed", type=int, default=0, help="seed of the random start")
    mixing.add_argument("--json", metavar="FILE", help="write the trace as JSON")
    mixing.add_argument("--plot", metavar="FILE.png",
                        help="plot the distance against the round (needs matplotlib)")
    train = modes.add_parser(
        "train", help="train N peers of the real policies in this process, on a virtual clock",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        description=(
            "Run the project's own policy classes for N peers as threads of this process, each\n"
            "on a simulated host with a virtual clock: the digits MLP, each peer its shard,\n"
            "each step's compute (--step-seconds, a --straggler) and each message's latency and\n"
            "bytes (--link; --regions and --wan, or --links FILE, for links that differ)\n"
            "charged to the clocks. The numbers are a real run's (the same\n"
            "parameters as real peer processes); the times are the models'. One row per\n"
            "policy: accuracy, consensus distance, simulated time, bytes per peer."),
        epilog=(
            "examples:\n"
            "  gossip simulate train --policy synchronous,gossip -n 64 --link 100mbit,20ms\n"
            "  gossip simulate train --policy gossip,push-sum -n 256 --topology exponential\n"
            "  gossip simulate train --policy local-sgd -n 16 --straggler 3@4 --json out.json\n"
            "  gossip simulate train -n 64 --regions 4 --link 10gbit,0.5ms --wan 100mbit,40ms\n"
            "  gossip simulate train -n 6 --links links.json   (see gossip/simulation/links.py)"))
    train.add_argument("--policy", default="synchronous,gossip", metavar="NAMES",
                       help="comma-separated: synchronous, local-sgd, gossip, push-sum, "
                            "asynchronous (default synchronous,gossip)")
    train.add_argument("-n", "--peers", type=int, default=4, metavar="N",
                       help="peers (default 4)")
    train.add_argument("--topology", default="ring", help="the gossip graph (default ring)")
    train.add_argument("--steps", type=int, default=200, help="steps per peer (default 200)")
    train.add_argument("--link", metavar="RATE,LATENCY",
                       help="every link, as GOSSIP_LINK: 1gbit,20ms (default: free)")
    train.add_argument("--regions", type=int, metavar="K",
                       help="K blocks of consecutive ranks (sites): --link within a block, "
                            "--wan between blocks")
    train.add_argument("--wan", metavar="RATE,LATENCY",
                       help="the links between --regions, e.g. 100mbit,40ms")
    train.add_argument("--links", metavar="FILE",
                       help="JSON: each peer's region and the link between every two regions "
                            "(instead of --link, --regions, --wan)")
    train.add_argument("--deaths", metavar="RANK@SECONDS,...",
                       help="peers that die at those simulated seconds, e.g. 3@0.5,7@2 "
                            "(synchronous and local-sgd with --elastic); a rank listed again "
                            "dies again after its restart")
    train.add_argument("--churn", metavar="FILE",
                       help='a trace, JSON: {"deaths": [[RANK, SECONDS], ...], "restarts": '
                            '[[RANK, SECONDS], ...], "leaves": [[RANK, SECONDS], ...], "joins": '
                            "[SECONDS, ...]} (each optional; as the options of those names)")
    train.add_argument("--mtbf", type=float, metavar="SECONDS",
                       help="deaths drawn from the seed: one per SECONDS of simulated time "
                            "across the fleet on average (with --restart-after, restarted "
                            "peers die again: the rate holds for the whole run)")
    train.add_argument("--restarts", metavar="RANK@SECONDS,...",
                       help="a dead peer's new process asks to join at that simulated second "
                            "(it takes a member's state at the next step boundary)")
    train.add_argument("--restart-after", type=float, metavar="SECONDS",
                       help="every dead peer restarts SECONDS after each death")
    train.add_argument("--leaves", metavar="RANK@SECONDS,...",
                       help="leaves, as peer.leave() under each policy: at once (the peer "
                            "goes at its next step boundary at or after that simulated second, "
                            "the others re-form the group without it), or under push-sum at a "
                            "boundary the group meets at, handing its mass over")
    train.add_argument("--joins", metavar="SECONDS,...",
                       help="new peers ask to join at these simulated seconds (each takes a "
                            "member's state at the next step boundary)")
    train.add_argument("--elastic", action="store_true",
                       help="synchronous and local-sgd re-form the group after a death "
                            "(elastic=True; without it a death fails their job)")
    train.add_argument("--overlap", action="store_true",
                       help="push-sum overlaps each step's exchange with the next step's "
                            "compute (overlap=True; the row reads push-sum+overlap)")
    train.add_argument("--compression", default="none", metavar="CODEC,...",
                       help="each policy that takes a codec (synchronous, local-sgd, gossip) "
                            "runs once per codec listed: none, fp16, bf16, int8, topk:RATIO "
                            "(e.g. none,int8: the row without and the row with; rows read "
                            "gossip+int8); the messages are charged their encodings' bytes")
    train.add_argument("--trace-points", type=int, default=10, metavar="N",
                       help="points of the run at which each peer's model is evaluated and "
                            "the consensus measured (the JSON's trace, the plot's accuracy "
                            "and consensus; default 10, 0: none)")
    train.add_argument("--detect", type=float, default=2.0, metavar="SECONDS",
                       help="the others count a dead peer lost this long after (the heartbeat "
                            "timeout; default 2)")
    train.add_argument("--step-seconds", default="0.01", metavar="S",
                       help="compute per step, seconds, or 'measured': this machine's step "
                            "of the model, timed once (default 0.01)")
    train.add_argument("--step-jitter", type=float, default=0.0, metavar="SIGMA",
                       help="each step's compute times a lognormal factor of mean 1 and this "
                            "sigma, drawn from the seed (default 0: constant)")
    train.add_argument("--straggler", metavar="RANK@FACTOR",
                       help="that peer's steps take FACTOR times as long, e.g. 3@4")
    train.add_argument("--non-iid", type=float, default=None, metavar="ALPHA",
                       help="each peer's classes drawn from Dirichlet(ALPHA), as the demo's "
                       "--non-iid (default: iid shards)")
    train.add_argument("--hidden", type=int, default=128,
                       help="the MLP's hidden width (default 128: 9,738 parameters)")
    train.add_argument("--lr", type=float, default=0.05, help="SGD learning rate")
    train.add_argument("--seed", type=int, default=0, help="weights, shards and batches")
    train.add_argument("--json", metavar="FILE", help="write every run as JSON")
    train.add_argument("--plot", metavar="PNG",
                       help="the loss against simulated time, one line per policy (needs "
                            "matplotlib: the demo extra)")
    parser.set_defaults(func=main, parser=parser)


def shown_rounds(rounds: int) -> list[int]:
    """0, 1, 2, 5, 10, 20, 50, ... up to ``rounds``, and ``rounds`` itself."""
    out, base = [0], 1
    while base <= rounds:
        out += [r for r in (base, 2 * base, 5 * base) if r <= rounds]
        base *= 10
    return sorted(set(out + [rounds]))


def describe(trace: MixingTrace) -> str:
    """The text `gossip simulate mixing` prints."""
    d0 = float(trace.distance[0])
    rate = trace.spectral_rate()
    lines = [f"{trace.topology}: {trace.size} peers, {trace.rule} rounds, SLEM "
             f"{trace.slem:.9g} (per round {rate:.9g})", "",
             f"{'round':>8}  {'distance':>12}  {'d0 x SLEM^t':>12}"]
    for t in shown_rounds(trace.rounds):
        lines.append(f"{t:>8}  {float(trace.distance[t]):>12.6g}  {d0 * rate ** t:>12.6g}")
    window = trace.rate_window()
    lines.append("")
    if window is None:
        lines.append("measured rate: the distance fell below 1e-9 of its start at once")
    else:
        lines.append(f"measured rate per round over rounds {window[0]}-{window[1]}: "
                     f"{trace.measured_rate(*window):.9g} (SLEM per round {rate:.9g})")
    lines.append(f"{trace.rounds} rounds of {trace.size} peers in {trace.seconds:.2f} s")
    return "\n".join(lines)


def plot(trace: MixingTrace, path: str) -> None:
    """The distance against the round, log scale, with d0 x SLEM^t."""
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(6, 4))
    rounds = range(trace.rounds + 1)
    ax.semilogy(rounds, trace.distance, label="consensus distance")
    d0, rate = float(trace.distance[0]), trace.spectral_rate()
    ax.semilogy(rounds, [max(d0 * rate ** t, 1e-300) for t in rounds], "--",
                label="d0 x SLEM^t")
    ax.set_xlabel("round")
    ax.set_ylabel("mean distance to the average")
    ax.set_title(f"{trace.topology}, {trace.rule}")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def main(args: argparse.Namespace) -> int:
    """Run `gossip simulate`; bad input raises ValueError (TopologyError is one), shown by the
    CLI in one line."""
    if args.mode is None:
        args.parser.print_help()
        return 2
    if args.mode == "train":
        return _train(args)
    from gossip.simulation import simulate_mixing
    from topologies import parse

    topology = parse(args.spec, args.size)
    rule = args.rule or ("push-sum" if topology.is_directed or topology.is_time_varying
                         else "gossip")
    trace = simulate_mixing(topology, args.rounds, rule=rule, dim=args.dim, seed=args.seed)
    print(describe(trace), flush=True)
    if args.json:
        window = trace.rate_window()
        record = trace.to_dict()
        record.update(rate_window=window, measured_rate=(
            trace.measured_rate(*window) if window else None),
            spectral_rate=trace.spectral_rate())
        with open(args.json, "w") as f:
            json.dump(record, f, allow_nan=False, default=_finite)
        print(f"wrote {args.json}")
    if args.plot:
        plot(trace, args.plot)
        print(f"wrote {args.plot}")
    return 0


def _finite(value: object) -> object:
    if isinstance(value, float) and not math.isfinite(value):
        return None
    raise TypeError(f"not JSON: {value!r}")


def _straggler(text: str | None) -> tuple[int, float] | None:
    if text is None:
        return None
    rank, _, factor = text.partition("@")
    try:
        return int(rank), float(factor)
    except ValueError:
        raise ValueError(f"--straggler {text!r}: expected RANK@FACTOR, e.g. 3@4") from None


def _deaths(text: str | None, option: str = "--deaths") -> tuple[tuple[int, float], ...]:
    """--deaths 3@0.5,7@2 -> ((3, 0.5), (7, 2.0)) (--restarts alike)."""
    if not text:
        return ()
    out = []
    for item in text.split(","):
        rank, _, when = item.strip().partition("@")
        try:
            out.append((int(rank), float(when)))
        except ValueError:
            raise ValueError(f"{option} {text!r}: expected RANK@SECONDS,..., e.g. 3@0.5,7@2"
                             ) from None
    return tuple(out)


Pairs = tuple[tuple[int, float], ...]


def _seconds(text: str | None) -> tuple[float, ...]:
    """--joins 2,5.5 -> (2.0, 5.5)."""
    if not text:
        return ()
    try:
        return tuple(float(t) for t in text.split(","))
    except ValueError:
        raise ValueError(f"--joins {text!r}: expected SECONDS,..., e.g. 2,5.5") from None


def _churn(path: str | None) -> tuple[Pairs, Pairs, Pairs, tuple[float, ...]]:
    """--churn FILE: the (deaths, restarts, leaves, joins) of a trace, {"deaths": [[rank,
    seconds], ...], "restarts": [[rank, seconds], ...], "leaves": [[rank, seconds], ...],
    "joins": [seconds, ...]} (every key optional)."""
    if path is None:
        return (), (), (), ()
    try:
        with open(path) as f:
            data = json.load(f)
    except (OSError, ValueError) as exc:
        raise ValueError(f"--churn {path}: cannot read it: {exc}") from None

    def pairs(key: str) -> tuple[tuple[int, float], ...] | None:
        items = data.get(key, []) if isinstance(data, dict) else None
        if not isinstance(items, list) or not all(
                isinstance(d, list) and len(d) == 2 and type(d[0]) is int
                and isinstance(d[1], (int, float)) and not isinstance(d[1], bool)
                for d in items):
            return None
        return tuple((int(r), float(t)) for r, t in items)
    deaths, restarts, leaves = pairs("deaths"), pairs("restarts"), pairs("leaves")
    joins = data.get("joins", []) if isinstance(data, dict) else None
    if deaths is None or restarts is None or leaves is None or not isinstance(joins, list) \
            or not all(isinstance(t, (int, float)) and not isinstance(t, bool) for t in joins) \
            or not any(k in data for k in ("deaths", "leaves", "joins")):
        raise ValueError(f'--churn {path}: expected {{"deaths": [[RANK, SECONDS], ...], '
                         f'"restarts": [[RANK, SECONDS], ...], "leaves": [[RANK, SECONDS], '
                         f'...], "joins": [SECONDS, ...]}} (each optional)')
    return deaths, restarts, leaves, tuple(float(t) for t in joins)


def _step_seconds(text: str, hidden: int) -> float:
    """--step-seconds: a number, or 'measured' (timed here, and said)."""
    if text.strip().lower() == "measured":
        from gossip.simulation import measure_step_seconds

        seconds = measure_step_seconds(hidden)
        print(f"measured: a step of the model takes {seconds * 1e3:.3f} ms here", flush=True)
        return seconds
    try:
        return float(text)
    except ValueError:
        raise ValueError(f"--step-seconds {text!r}: expected seconds (0.01) or 'measured'"
                         ) from None


#: The policies --elastic makes elastic (gossip and push-sum go on around a death anyway).
ELASTIC_POLICIES = ("synchronous", "local-sgd")


#: The simulated policies that take a codec (compression=).
CODEC_POLICIES = ("synchronous", "local-sgd", "gossip")


def _policy_options(name: str, args: argparse.Namespace) -> dict:
    """What --elastic and --overlap give policy ``name``."""
    if args.elastic and name in ELASTIC_POLICIES:
        return {"elastic": True}
    if args.overlap and name == "push-sum":
        return {"overlap": True}
    return {}


def _runs(policies: str, compression: str) -> list[tuple[str, str | None]]:
    """(policy, codec) of every run --policy and --compression ask for: each policy that
    takes a codec once per codec, the others once without (said on stdout)."""
    from collectives.codecs.catalog import parse

    names = [n.strip() for n in policies.split(",") if n.strip()]
    codecs: list[str | None] = []
    for text in (c.strip() for c in compression.split(",")):
        if not text:
            continue
        try:
            codec = parse(text)
        except ValueError as exc:
            raise ValueError(f"--compression {text!r}: {exc}") from None
        codecs.append(None if codec is None else text)
    codecs = codecs or [None]
    if any(codecs) and not any(n in CODEC_POLICIES for n in names):
        raise ValueError(f"--compression {compression}: none of the policies {names} takes a "
                         f"codec (those that do: {', '.join(CODEC_POLICIES)})")
    runs: list[tuple[str, str | None]] = []
    for name in names:
        if name in CODEC_POLICIES:
            runs.extend((name, codec) for codec in codecs)
            continue
        if any(codecs):
            print(f"{name} takes no codec: it runs without compression", flush=True)
        runs.append((name, None))
    return runs


def _label(spec: Any) -> str:
    """A run's name in the table, the plot and the link summary."""
    options = spec.policy_options
    return (spec.policy + ("+overlap" if options.get("overlap") else "")
            + (f"+{options['compression']}" if options.get("compression") else ""))


def _train(args: argparse.Namespace) -> int:
    from gossip.simulation import TrainingSpec, simulate_training

    step_seconds = _step_seconds(args.step_seconds, args.hidden)
    churn = _churn(args.churn)
    specs = [TrainingSpec(policy=name, peers=args.peers, topology=args.topology,
                          steps=args.steps, link=args.link, step_seconds=step_seconds,
                          step_jitter=args.step_jitter,
                          straggler=_straggler(args.straggler), lr=args.lr,
                          hidden=args.hidden, seed=args.seed, non_iid=args.non_iid,
                          regions=args.regions, wan=args.wan, links=args.links,
                          deaths=_deaths(args.deaths) + churn[0], mtbf=args.mtbf,
                          detect_seconds=args.detect,
                          restarts=_deaths(args.restarts, "--restarts") + churn[1],
                          restart_after=args.restart_after,
                          leaves=_deaths(args.leaves, "--leaves") + churn[2],
                          joins=_seconds(args.joins) + churn[3],
                          trace_points=args.trace_points,
                          policy_options={**_policy_options(name, args),
                                          **({"compression": codec} if codec else {})})
             for name, codec in _runs(args.policy, args.compression)]
    if not specs:
        raise ValueError("--policy: give at least one policy")
    heads = ("policy", "accuracy", "worst", "averaged", "consensus", "simulated s",
             "MB/peer", "real s", "died", "restarted", "left", "joined")
    print(f"{args.peers} simulated peers, {args.steps} steps, topology {args.topology}, links "
          f"{specs[0].network().text}, {step_seconds:g} s a step"
          + (f" (jitter {args.step_jitter:g})" if args.step_jitter else "")
          + (f", peer {args.straggler} slower" if args.straggler else "")
          + (f", non-iid {args.non_iid:g}" if args.non_iid is not None else ""), flush=True)
    print("  ".join(f"{h:>11}" if k else f"{h:<12}" for k, h in enumerate(heads)), flush=True)
    runs = []
    for spec in specs:
        result = simulate_training(spec)
        record = result.to_dict()
        runs.append(record)
        record["label"] = _label(spec)
        row = (record["label"], f"{record['accuracy']:.2%}", f"{record['worst_accuracy']:.2%}",
               f"{record['averaged_accuracy']:.2%}", f"{record['consensus']:.4f}",
               f"{record['simulated_seconds']:.3f}", f"{record['bytes_per_peer'] / 1e6:.2f}",
               f"{record['seconds']:.1f}", str(len(record["died"])),
               str(len(record["restarted"])), str(len(record["left"])),
               str(len(record["joined"])))
        print("  ".join(f"{v:>11}" if k else f"{v:<12}" for k, v in enumerate(row)),
              flush=True)
    for record in runs:
        print(_link_summary(record), flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"runs": runs}, f, allow_nan=False, default=_finite)
        print(f"wrote {args.json}")
    if args.plot:
        plot_training(runs, args.plot, title=f"{args.peers} simulated peers, "
                                             f"{specs[0].network().text}")
        print(f"wrote {args.plot}")
    return 0


def _link_summary(record: dict) -> str:
    """One run's bytes per link: how many links carried any, the busiest and the median (MB),
    and with regions the MB from each region to each other."""
    links = record["bytes_per_link"]
    line = f"{record.get('label', record['spec']['policy'])}: {len(links)} links carried bytes"
    if links:
        src, dst, busiest = links[0]
        median = statistics.median(n for _, _, n in links)
        line += (f", the busiest {src}->{dst} {busiest / 1e6:.2f} MB, the median "
                 f"{median / 1e6:.2f} MB")
    regions = record["bytes_between_regions"]
    if len(regions) > 1:
        rows = "; ".join(" ".join(f"{n / 1e6:.1f}" for n in row) for row in regions)
        line += f"; MB from region to region (row: from): {rows}"
    return line


def plot_training(runs: list[dict], path: str, title: str) -> None:
    """Against simulated time, one line per run: the peers' mean loss (every step), their own
    models' mean test accuracy and their consensus distance (the trace's points)."""
    plt = _pyplot()
    fig, (loss_ax, acc_ax, cons_ax) = plt.subplots(1, 3, figsize=(15, 4))
    for run in runs:
        label = f"{run.get('label', run['spec']['policy'])} ({run['accuracy']:.1%})"
        line, = loss_ax.plot(run["time"], run["loss"], label=label)
        points = run.get("trace", [])
        acc_ax.plot([p["time"] for p in points], [100 * p["accuracy"] for p in points],
                    marker=".", color=line.get_color())
        cons_ax.plot([p["time"] for p in points if p["consensus_rms"] is not None],
                     [p["consensus_rms"] for p in points if p["consensus_rms"] is not None],
                     marker=".", color=line.get_color())
    loss_ax.set_ylabel("mean training loss of the peers")
    acc_ax.set_ylabel("peers' own test accuracy, mean (%)")
    cons_ax.set_ylabel("consensus distance (RMS to the average)")
    for ax in (loss_ax, acc_ax, cons_ax):
        ax.set_xlabel("simulated seconds")
    fig.suptitle(title, fontsize=9)
    loss_ax.legend(title="policy (final accuracy)")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def _pyplot():
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError as exc:
        raise ValueError("--plot needs matplotlib: pip install 'gossip[demo]'") from exc
    return plt

