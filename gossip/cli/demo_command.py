"""`gossip demo`: train a small CNN on handwritten digits with each averaging policy on peers
of this machine, then print a comparison table and write a PNG and a JSON of the figures."""
from __future__ import annotations

import argparse
import os
import sys
from typing import Any, NoReturn

__all__ = ["register", "main", "demo_options", "parse_policies", "compression_options"]

_BATCH = 16         # samples per peer per step (the simulator's TrainingSpec.batch too)
_TIMEOUT = 1800.0   # a real run's deadline

# The names `gossip.policies.names()` returns; repeated here so that building the parser does
# not import the policies (every `gossip` invocation builds it). main() checks them.
_POLICY_HELP = "synchronous, local-sgd, gossip, asynchronous, push-sum, elastic, choco"


def register(subparsers: argparse._SubParsersAction) -> argparse.ArgumentParser:
    """Add the `demo` subcommand to the `gossip` parser."""
    parser = subparsers.add_parser(
        "demo",
        help="train a small CNN on handwritten digits with every averaging policy and compare",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        description=(
            "Start peers on this machine (loopback, nothing to configure) and train a small\n"
            "LeNet-style CNN on the handwritten digits that ship inside scikit-learn (8x8,\n"
            "never downloaded), sharded across the peers, once per averaging policy. Prints\n"
            "a table (test accuracy, wall time, time to 95%, samples/s, bytes sent per peer,\n"
            "consensus distance) and writes OUT/demo.png and OUT/demo.json.\n\n"
            "With no --policy, --kill, --link, --non-iid or --straggler it tells the story:\n"
            "four scenarios where the policies differ (slow-network, straggler, death,\n"
            "non-iid; about 3 minutes on 2 cores), on a harder task by default (the digits\n"
            "at random places on a 12x12 canvas), each into OUT/<scenario>/, then a summary\n"
            "table, OUT/story.png (a panel per scenario) and OUT/story.json. --scenario NAMES\n"
            "runs some of them.\n\n"
            "--simulate tells the same story in simulated time instead: 64 peers (--peers) on\n"
            "a WAN, each a thread of this process running the real policy classes on a virtual\n"
            "clock (gossip simulate train's simulator and task), for the policies it simulates\n"
            "(synchronous, local-sgd, gossip, push-sum, asynchronous); the same options give\n"
            "the same OUT/story-simulated.json on any machine, under any load (about 8\n"
            "minutes)."
        ),
        epilog=(
            "examples:\n"
            "  gossip demo                                  # the four scenarios (~3 min)\n"
            "  gossip demo --scenario straggler             # one of them\n"
            "  gossip demo --policy all                     # every policy, 4 peers (~1 min)\n"
            "  gossip demo --policy synchronous,gossip --epochs 5 --out /tmp/demo\n"
            "  gossip demo --peers 8 --topology exponential --policy gossip,push-sum\n"
            "  gossip demo --dataset mnist --data-dir ~/data/mnist --epochs 1\n"
            "  gossip demo --kill 2@0.33                    # peer 2 SIGKILLed at a third, restarted\n"
            "  gossip demo --compression int8               # what travels, int8-encoded\n"
            "  gossip demo --link 1gbit,2ms                 # an emulated 1 Gbit/s, 2 ms network\n"
            "  gossip demo --simulate                       # the story at 64 simulated peers"
        ),
    )
    parser.add_argument("-n", "--peers", type=int, default=None, metavar="N",
                        help="peer processes to start on this machine (default 4; under "
                        "--simulate, simulated peers: default 64)")
    parser.add_argument("--simulate", action="store_true",
                        help="the story's scenarios in simulated time (deterministic), at "
                        "--peers simulated peers on a WAN, instead of peer processes")
    parser.add_argument("--steps", type=int, default=None, metavar="N",
                        help="under --simulate: steps per simulated peer (default 200)")
    parser.add_argument("--policy", default=None, metavar="NAMES",
                        help=f"all, or one or more of {_POLICY_HELP}, comma-separated: one "
                        "run of these policies instead of the scenarios")
    parser.add_argument("--scenario", default=None, metavar="NAMES",
                        help="all (the default when no --policy, --kill, --link, --non-iid "
                        "or --straggler is given), or one or more of slow-network, "
                        "straggler, death, non-iid, comma-separated")
    parser.add_argument("--topology", default="ring", metavar="SPEC",
                        help="the peers' graph, as for `gossip topology` (default ring); used "
                        "by gossip, push-sum and asynchronous")
    parser.add_argument("--epochs", type=int, default=None, metavar="N",
                        help="epochs per policy (default: 20 on digits, 5 on shifted-digits, "
                        "2 on mnist; with --kill 100 and 25; in the scenarios 4, 8 under the "
                        "death, on shifted-digits)")
    parser.add_argument("--dataset", default=None, metavar="NAME",
                        help="digits (inside scikit-learn; the default for one run), "
                        "shifted-digits (the digits at random places on 12x12: harder; the "
                        "scenarios' default) or mnist (needs --data-dir)")
    parser.add_argument("--data-dir", metavar="PATH",
                        help="directory with MNIST's IDX files: train-images-idx3-ubyte, "
                        "train-labels-idx1-ubyte, t10k-images-idx3-ubyte, "
                        "t10k-labels-idx1-ubyte (each may be .gz)")
    parser.add_argument("--out", default="gossip-demo", metavar="DIR",
                        help="where to write demo.png and demo.json (default ./gossip-demo)")
    parser.add_argument("--batch-size", type=int, default=_BATCH, metavar="B",
                        help=f"samples per peer per step (default {_BATCH})")
    parser.add_argument("--lr", type=float, default=0.05, help="SGD learning rate (default 0.05)")
    parser.add_argument("--seed", type=int, default=0, help="seed of weights, shards, batches")
    parser.add_argument("--no-baseline", action="store_true",
                        help="skip the single-process SGD baseline row")
    parser.add_argument("--kill", metavar="RANK@FRACTION",
                        help="peer RANK SIGKILLs itself after FRACTION of its training steps "
                        "and is started again, rejoining the running job (each policy then "
                        "trains in a group of its own; synchronous, local-sgd and elastic "
                        "with elastic=True); the table says when it came back, or why it "
                        "could not. E.g. 2@0.33")
    parser.add_argument("--compression", metavar="CODEC",
                        help="fp16, bf16, int8 or topk:RATIO: every policy that takes the codec "
                        "sends through it (push-sum and asynchronous take none, gossip no "
                        "top-k: they run uncompressed, and a line says so); sent/peer then "
                        "counts the encodings")
    parser.add_argument("--link", metavar="RATE,LATENCY",
                        help="emulate a slow network: every link between the peers carries "
                        "RATE (e.g. 1gbit, 100mbit, 500MB/s) with a one-way LATENCY (e.g. 2ms, "
                        "500us, 0), as GOSSIP_LINK does; wall times then show what each "
                        "policy's communication would cost on such a cluster")
    parser.add_argument("--non-iid", type=float, default=None, metavar="ALPHA",
                        help="non-iid data: each peer's mix of classes drawn from a Dirichlet "
                        "distribution of concentration ALPHA (0.1: mostly one or two classes "
                        "per peer; 100: nearly iid); shards stay disjoint and equal. Default: "
                        "iid shards")
    parser.add_argument("--straggler", metavar="RANK@FACTOR",
                        help="peer RANK takes FACTOR times as long per step (it sleeps after "
                        "each), as a slower node would; synchronous policies wait for it, "
                        "asynchronous ones do not. E.g. 3@4")
    parser.add_argument("--timeout", type=float, default=_TIMEOUT, metavar="S",
                        help=f"deadline of the whole run in seconds (default {_TIMEOUT:g})")
    parser.set_defaults(func=main)

    def one_line_error(message: str) -> NoReturn:
        # A bad value is one line on stderr, like the errors main() reports, not usage text.
        print(f"gossip demo: error: {message}", file=sys.stderr)
        sys.exit(2)

    parser.error = one_line_error
    return parser


def parse_policies(text: str) -> tuple[str, ...]:
    """"all" or a comma-separated list of policy names (case and _/- do not matter) ->
    canonical names, in the order given; ValueError for unknown names."""
    from gossip.policies import names

    known = names()
    items = [t.strip().lower().replace("_", "-") for t in text.split(",")]
    if items == ["all"]:
        return tuple(known)
    if not all(items):
        raise ValueError(f"--policy {text!r}: empty name in the list; known policies: "
                         f"{', '.join(known)}, or all")
    for item in items:
        if item not in known:
            raise ValueError(f"unknown policy {item!r}; known policies: {', '.join(known)}, "
                             "or all")
    return tuple(items)


def compression_options(policies: tuple[str, ...], spec: str) -> tuple[dict, list[str]]:
    """The demo's policy options for ``--compression spec`` (ValueError for an unknown
    codec): {name: {"compression": spec}} for the policies that take it, and the names of
    those that refuse it (constructed once here to ask them: no peer is involved)."""
    import warnings

    from collectives.codecs import parse
    from gossip.policies import policy_class

    codec = parse(spec)
    options, plain = {}, []
    for name in policies:
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                policy_class(name)(compression=codec)
        except ValueError:
            plain.append(name)
            continue
        options[name] = {"compression": codec.name if codec is not None else None}
    return options, plain


def demo_options(args: argparse.Namespace) -> tuple[Any, tuple | None]:
    """(DemoOptions, the scenarios to run or None for one run) from the parsed arguments;
    ValueError (one line) for settings that do not go together."""
    from gossip.demo.kill import Kill
    from gossip.demo.options import DemoOptions
    from gossip.demo.straggler import Straggler

    single_run = [flag for flag, value in (("--policy", args.policy), ("--kill", args.kill),
                                           ("--link", args.link), ("--non-iid", args.non_iid),
                                           ("--straggler", args.straggler)) if value is not None]
    if args.scenario is not None and single_run:
        raise ValueError(f"--scenario sets the policies and conditions itself; drop "
                         f"{' and '.join(single_run)} (or --scenario, for one run of your own)")
    scenarios = None
    if not single_run:
        from gossip.demo.scenarios import parse_scenarios
        scenarios = parse_scenarios(args.scenario or "all")
    policies = parse_policies(args.policy or "all")
    if args.dataset is not None:
        dataset = args.dataset.strip().lower()
    else:
        from gossip.demo.scenarios import STORY_DATASET
        dataset = "digits" if scenarios is None else STORY_DATASET
    policy_options: dict = {}
    if args.compression is not None:
        policy_options, plain = compression_options(policies, args.compression)
        if plain:
            print(f"--compression {args.compression}: uncompressed (they refuse the codec): "
                  f"{', '.join(plain)}", file=sys.stderr, flush=True)
    options = DemoOptions(
        policies=policies, policy_options=policy_options,
        peers=4 if args.peers is None else args.peers,
        topology=args.topology,
        epochs=args.epochs, dataset=dataset, data_dir=args.data_dir,
        out=args.out, batch_size=args.batch_size, lr=args.lr, seed=args.seed,
        baseline=not args.no_baseline, timeout=args.timeout,
        kill=None if args.kill is None else Kill.parse(args.kill), link=args.link,
        non_iid=args.non_iid,
        straggler=None if args.straggler is None else Straggler.parse(args.straggler))
    return options, scenarios


def _run_simulated(args: argparse.Namespace) -> int:
    """`gossip demo --simulate`: the options that make sense for the simulator, the story."""
    from gossip.demo.scenarios import parse_scenarios
    from gossip.demo.simulated import SIMULATED_PEERS, SIMULATED_STEPS, run_simulated_story
    from gossip.simulation import SIMULATED_POLICIES

    refused = [flag for flag, value in (
        ("--kill", args.kill), ("--link", args.link), ("--non-iid", args.non_iid),
        ("--straggler", args.straggler), ("--compression", args.compression),
        ("--dataset", args.dataset), ("--data-dir", args.data_dir), ("--epochs", args.epochs))
        if value is not None]
    # (The simulator's batch is the demo's default; it has no baseline row and no deadline.)
    refused += [flag for flag, given in (("--batch-size", args.batch_size != _BATCH),
                                         ("--no-baseline", args.no_baseline),
                                         ("--timeout", args.timeout != _TIMEOUT)) if given]
    if refused:
        raise ValueError(f"--simulate runs the story's scenarios on the simulator's task and a "
                         f"WAN: drop {' and '.join(refused)} (gossip simulate train runs one "
                         "setting of your own)")
    policies = parse_policies(args.policy) if args.policy else SIMULATED_POLICIES
    unsimulated = [p for p in policies if p not in SIMULATED_POLICIES]
    if unsimulated:
        raise ValueError(f"--simulate: {', '.join(unsimulated)} not simulated; the simulator "
                         f"runs {', '.join(SIMULATED_POLICIES)}")
    scenarios = None
    if args.scenario is not None:
        scenarios = tuple(s.name for s in parse_scenarios(args.scenario))
    for flag, value in (("--peers", args.peers), ("--steps", args.steps)):
        if value is not None and value < 1:
            raise ValueError(f"{flag} must be at least 1, got {value}")
    return run_simulated_story(
        policies=tuple(policies), peers=args.peers or SIMULATED_PEERS,
        steps=args.steps or SIMULATED_STEPS, topology=args.topology, lr=args.lr,
        seed=args.seed, out=args.out, scenarios=scenarios)


def main(args: argparse.Namespace) -> int:
    """Run `gossip demo`. Bad settings are ValueErrors, shown by the CLI in one line; a failed
    peer is one line here, with the details in OUT/failure.log."""
    from gossip.demo.runner import DemoFailed, run_demo

    if args.simulate:
        return _run_simulated(args)
    if args.steps is not None:
        raise ValueError("--steps is --simulate's (a run of peer processes counts --epochs)")
    options, scenarios = demo_options(args)
    existed = os.path.isdir(options.out)
    try:
        if scenarios is not None:
            from gossip.demo.story import run_story
            return run_story(options, scenarios, stdout=sys.stdout, stderr=sys.stderr)
        return run_demo(options)
    except DemoFailed as exc:
        print(f"gossip demo: error: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        # Ctrl-C before any result: the output folder this run made would be left empty.
        if not existed:
            try:
                os.rmdir(options.out)
            except OSError:
                pass   # it holds something (a failure log): kept
        raise
