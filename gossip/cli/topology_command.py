"""`gossip topology`: show a topology's neighbours, weights, mixing matrix and spectral gap."""

from __future__ import annotations

import argparse
import math
import os
import sys
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # pragma: no cover - annotations only; topologies is imported in main()
    from topologies import Topology

__all__ = ["register", "main", "COMPARE_SPECS"]

# The rows of `--compare`: the families people choose between, at the size given by -n.
COMPARE_SPECS = (
    "ring",
    "torus",
    "exponential",
    "one-peer-exponential",
    "complete",
    "random:degree=3,seed=0",
)
MATRIX_MAX_N = 16  # print W only while it fits on a terminal
PEERS_MAX_N = 64  # beyond this, list only the first PEERS_SHOWN peers
PEERS_SHOWN = 16
ARROWS_MAX_EDGES = 1500  # drawing arrows one by one gets slow past this
ARC_RAD = 0.12  # bend of directed edges, so that i -> j and j -> i are two visible arrows

_SCHEME_NOTES = {
    "metropolis": "Metropolis-Hastings weights (symmetric, doubly stochastic)",
    "uniform": "uniform weights (row-stochastic)",
    "push": "push weights (column-stochastic, for push-sum)",
    "custom": "user-supplied weights",
}


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add the `topology` subcommand to the `gossip` parser."""
    parser = subparsers.add_parser(
        "topology",
        help="show a topology's neighbours, mixing weights and spectral gap",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        description=(
            "Describe a peer graph: each peer's in-neighbours with their mixing weights and\n"
            "its out-neighbours, the mixing matrix W (W[i, j] = weight receiver i gives\n"
            "sender j; one gossip round is x <- W x), its second-largest eigenvalue modulus,\n"
            "spectral gap and the rounds needed to cut disagreement 1000x."
        ),
        epilog=(
            "examples:\n"
            "  gossip topology ring -n 8\n"
            "  gossip topology torus:8x8\n"
            "  gossip topology one-peer-exponential -n 16 --step 2\n"
            "  gossip topology random:p=0.3,seed=1 -n 16 --plot graph.png\n"
            "  gossip topology --compare -n 16"
        ),
    )
    parser.add_argument(
        "spec",
        nargs="?",
        help="topology spec: ring, torus[:RxC], random:p=P|degree=D[,seed=S], exponential, "
        "one-peer-exponential, complete; optional ,weights=metropolis|uniform|push",
    )
    parser.add_argument("-n", "--size", type=int, metavar="N", help="number of peers")
    parser.add_argument(
        "--step",
        type=int,
        default=0,
        metavar="T",
        help="step to show for time-varying topologies (default 0)",
    )
    parser.add_argument(
        "--plot", metavar="FILE.png", help="draw the graph to a PNG file (needs matplotlib)"
    )
    parser.add_argument(
        "--plot-weights", action="store_true", help="label the plotted edges with their weights"
    )
    parser.add_argument(
        "--compare",
        action="store_true",
        help="compare the common topologies at size N instead of describing one",
    )
    parser.set_defaults(func=main)


def main(args: argparse.Namespace) -> int:
    """Run `gossip topology`; bad input raises TopologyError (a ValueError), shown in one line."""
    try:
        return _run(args)
    except BrokenPipeError:
        # `gossip topology torus:32x32 | head` closed our stdout: stop quietly, like other
        # Unix tools, instead of reporting an OSError. Point stdout at /dev/null so the
        # interpreter's final flush does not raise again.
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return 141  # 128 + SIGPIPE, what a shell reports for a killed writer


def _run(args: argparse.Namespace) -> int:
    from topologies import TopologyError, parse

    if args.compare:
        if args.size is None:
            raise TopologyError("--compare needs the number of peers: add -n N, e.g. -n 16")
        if args.plot:
            raise TopologyError("--plot draws one topology; drop --compare to use it")
        print(compare_table(args.size, extra=args.spec), flush=True)
        return 0
    if args.spec is None:
        raise TopologyError(
            "give a topology spec, e.g. `gossip topology ring -n 8` or "
            "`gossip topology torus:4x4`, or use --compare -n N"
        )
    topology = parse(args.spec, args.size)
    step = args.step
    topology.in_neighbors(0, step)  # validates the step before anything is printed
    print(describe(topology, step), flush=True)
    if args.plot:
        code = plot(topology, step, args.plot, show_weights=args.plot_weights)
        if code:
            return code
        print(f"plot written to {args.plot}", flush=True)
    return 0


# ---------------------------------------------------------------------- one topology


def _kind(t: Topology) -> str:
    direction = "directed" if t.is_directed else "undirected"
    if t.is_time_varying:
        return f"{direction}, time-varying (period {t.period} steps)"
    return f"{direction}, static"


def _rounds_text(t: Topology) -> str:
    rounds = t.rounds_to_reduce(1000.0)
    if rounds == math.inf:
        return "never (SLEM is 1: the graph does not mix)"
    if t.is_time_varying:
        periods = rounds // t.period
        return f"{rounds} steps ({periods} period{'s' if periods != 1 else ''} of {t.period})"
    return str(rounds)


def describe(t: Topology, step: int = 0) -> str:
    """The text `gossip topology SPEC` prints."""
    n = t.size
    lines = [
        f"{t!r}: {n} peer{'s' if n != 1 else ''}, {_kind(t)}, "
        f"{_SCHEME_NOTES.get(t.weight_scheme, t.weight_scheme + ' weights')}",
    ]
    if t.spec is not None:
        lines.append(f"spec: {t.spec}")
    if t.is_time_varying:
        lines.append(f"showing step {step} (phase {step % t.period} of {t.period})")
    lines.append("")

    shown = range(n) if n <= PEERS_MAX_N else range(PEERS_SHOWN)
    rows = []
    for r in shown:
        self_w, inn = t.weights(r, step)
        incoming = "  ".join(f"{j}:{w:.4f}" for j, w in inn.items()) or "-"
        outgoing = " ".join(map(str, t.out_neighbors(r, step))) or "-"
        rows.append((str(r), f"{self_w:.4f}", incoming, outgoing))
    heads = ("peer", "self", "in-neighbour:weight", "out-neighbours")
    width = [max(len(h), *(len(row[k]) for row in rows)) for k, h in enumerate(heads)]
    fmt = f"{{:>{width[0]}}}  {{:>{width[1]}}}  {{:<{width[2]}}}  {{}}"
    lines.append(fmt.format(*heads).rstrip())
    lines.extend(fmt.format(*row).rstrip() for row in rows)
    if n > PEERS_MAX_N:
        lines.append(f"... {n - PEERS_SHOWN} more peers elided (showing {PEERS_SHOWN} of {n})")

    if n <= MATRIX_MAX_N:
        w = t.mixing_matrix(step)
        lines += [
            "",
            f"mixing matrix W at step {step} (row i = receiver, column j = sender; x <- W x):",
        ]
        label = len(str(n - 1))
        lines.append(" " * (label + 1) + "".join(f"{j:>7}" for j in range(n)))
        for i in range(n):
            lines.append(f"{i:>{label}} " + "".join(f"{v:7.4f}" for v in w[i]))

    lines.append("")
    if t.is_time_varying:
        lines.append(f"per period of {t.period} steps (the product W_{t.period - 1} ... W_0):")
    lines += [
        f"second-largest eigenvalue modulus (SLEM): {t.second_eigenvalue():.6f}",
        f"spectral gap: {t.spectral_gap():.6f}",
        f"rounds to cut disagreement 1000x: {_rounds_text(t)}",
    ]
    return "\n".join(lines)


# ---------------------------------------------------------------------- comparison


def _out_degree(t: Topology) -> tuple[int, int]:
    """(min, max) out-degree over all peers and all steps of one period."""
    degs = [t.out_degrees(s) for s in range(t.period)]
    return min(int(d.min()) for d in degs), max(int(d.max()) for d in degs)


def compare_table(n: int, *, extra: str | None = None) -> str:
    """The table `gossip topology --compare -n N` prints."""
    from topologies import TopologyError, Torus, parse

    specs = list(COMPARE_SPECS)
    if extra is not None and extra not in specs:
        specs.append(extra)
    rows, notes = [], []
    for spec in specs:
        try:
            t = parse(spec, n)
        except TopologyError as exc:
            if spec == extra:
                raise
            notes.append(f"skipped {spec}: {exc}")
            continue
        if isinstance(t, Torus) and spec == "torus" and t.rows == 1 and n > 1:
            notes.append(f"skipped torus: {n} peers only make a 1x{n} grid, which is a ring")
            continue
        low, high = _out_degree(t)
        rounds = t.rounds_to_reduce(1000.0)
        rows.append(
            (
                repr(t),
                "yes" if t.is_directed else "no",
                f"yes (P={t.period})" if t.is_time_varying else "no",
                str(low) if low == high else f"{low}-{high}",
                f"{t.second_eigenvalue():.4f}",
                f"{t.spectral_gap():.4f}",
                "inf" if rounds == math.inf else str(rounds),
                f"{high}x",
            )
        )
    heads = (
        "topology",
        "directed",
        "time-varying",
        "degree",
        "SLEM",
        "spectral gap",
        "rounds (1000x)",
        "sent/peer/round",
    )
    width = [max(len(h), *(len(row[k]) for row in rows)) for k, h in enumerate(heads)]
    fmt = "  ".join(f"{{:<{w}}}" if k == 0 else f"{{:>{w}}}" for k, w in enumerate(width))
    rule = fmt.format(*("-" * w for w in width))
    lines = [f"topologies for n = {n} peers", "", fmt.format(*heads), rule]
    lines.extend(fmt.format(*row) for row in rows)
    lines += [
        "",
        "degree: out-degree (messages a peer sends per round); sent/peer/round: bytes the",
        "busiest peer sends per round, in multiples of the model size.",
        "time-varying rows: SLEM and spectral gap are per period of P steps; rounds are steps.",
    ]
    lines += notes
    return "\n".join(lines)


# ---------------------------------------------------------------------- plotting


def _edge_point(
    x0: float, y0: float, x1: float, y1: float, *, bend: float, at: float
) -> tuple[float, float]:
    """The point a fraction `at` along matplotlib's "arc3,rad=bend" edge (a quadratic Bezier
    whose control point sits `bend` times the edge length off its midpoint)."""
    cx = (x0 + x1) / 2 + bend * (y1 - y0)
    cy = (y0 + y1) / 2 - bend * (x1 - x0)
    u = 1 - at
    return u * u * x0 + 2 * u * at * cx + at * at * x1, u * u * y0 + 2 * u * at * cy + at * at * y1


def plot(t: Topology, step: int, path: str, *, show_weights: bool = False) -> int:
    """Draw the graph at `step` on a circle into a PNG; returns an exit code."""
    try:
        import matplotlib

        matplotlib.use("Agg")  # files only; never needs a display
        import matplotlib.pyplot as plt
        from matplotlib.collections import LineCollection
        from matplotlib.patches import FancyArrowPatch
    except ImportError:
        print(
            "gossip topology: error: --plot needs matplotlib, which is not installed; "
            "pip install matplotlib (or '.[demo]' in gossip's checkout)",
            file=sys.stderr,
        )
        return 2

    n = t.size
    angles = [math.pi / 2 - 2 * math.pi * i / n for i in range(n)]
    pos = [(math.cos(a), math.sin(a)) for a in angles]
    w = t.mixing_matrix(step)
    edges = t.edges(step)
    node_size = max(30.0, min(400.0, 6000.0 / max(n, 1)))

    fig, ax = plt.subplots(figsize=(7, 7))
    try:
        ax.set_aspect("equal")
        ax.axis("off")
        arrows = t.is_directed and len(edges) <= ARROWS_MAX_EDGES
        if arrows:
            shrink = math.sqrt(node_size) / 2 + 2  # points: stop arrows at the node's rim
            for sender, receiver in edges:
                ax.add_patch(
                    FancyArrowPatch(
                        pos[sender],
                        pos[receiver],
                        arrowstyle="-|>",
                        mutation_scale=12,
                        shrinkA=shrink,
                        shrinkB=shrink,
                        color="tab:gray",
                        lw=0.8,
                        connectionstyle=f"arc3,rad={ARC_RAD}",
                    )
                )
        else:
            segments = [(pos[a], pos[b]) for a, b in edges]
            ax.add_collection(LineCollection(segments, colors="tab:gray", linewidths=0.8))
        if show_weights:
            for sender, receiver in edges:
                (x0, y0), (x1, y1) = pos[sender], pos[receiver]
                # On the drawn edge, closer to the receiver, whose row of W the weight is in.
                fx, fy = _edge_point(x0, y0, x1, y1, bend=ARC_RAD if arrows else 0.0, at=0.6)
                ax.text(
                    fx,
                    fy,
                    f"{w[receiver, sender]:.2f}",
                    fontsize=7,
                    ha="center",
                    va="center",
                    color="tab:blue",
                )
        xs, ys = zip(*pos, strict=True)
        ax.scatter(xs, ys, s=node_size, c="white", edgecolors="black", zorder=3)
        if n <= 64:
            for i, (x, y) in enumerate(pos):
                ax.text(x, y, str(i), fontsize=8, ha="center", va="center", zorder=4)
        ax.set_xlim(-1.15, 1.15)
        ax.set_ylim(-1.15, 1.15)
        when = f", step {step}" if t.is_time_varying else ""
        ax.set_title(f"{t!r}{when}: spectral gap {t.spectral_gap():.4f}")
        fig.savefig(path, dpi=100)
    finally:
        plt.close(fig)
    return 0
