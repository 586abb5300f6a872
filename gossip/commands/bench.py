"""`gossip bench OP -n N`: time a collective over N local peers, nccl-tests style, optionally
against torch.distributed's Gloo in the same run."""
from __future__ import annotations

import argparse
import json
import sys

__all__ = ["register", "main"]


def register(subparsers) -> argparse.ArgumentParser:
    """Add the `bench` subcommand to the `gossip` parser."""
    parser = subparsers.add_parser(
        "bench", help="benchmark allreduce / allgather / broadcast / neighbor / p2p on this host",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        description=(
            "Start N peers on this host (loopback) and time OP on float32 arrays of each size.\n"
            "Per iteration: barrier, then the operation; the iteration's time is the slowest\n"
            "rank's and the table shows the median over iterations (nccl-tests columns:\n"
            "algbw = bytes/time; allreduce busbw = algbw*2(n-1)/n; allgather: size is each\n"
            "peer's input, algbw = n*size/time, busbw = algbw*(n-1)/n; broadcast, neighbor\n"
            "and p2p: busbw = algbw).\n\n"
            "ops: allreduce, allgather, broadcast (root 0), neighbor (one neighbor_allreduce\n"
            "round on a ring: self 1/3, each neighbour 1/3), p2p (rank 0 -> rank 1 send/recv,\n"
            "-n 2, always compared with plain pyzmq PAIR in the same run)."),
        epilog=(
            "examples:\n"
            "  gossip bench allreduce -n 4 --sizes 4K,256K,4M,64M --vs gloo\n"
            "  gossip bench neighbor -n 4 --sizes 4M,64M --json\n"
            "  gossip bench p2p -n 2 --sizes 4K,4M,64M --transport tcp"))
    parser.add_argument("op", metavar="OP",
                        help="allreduce | allgather | broadcast | neighbor | p2p")
    parser.add_argument("-n", "--nprocs", dest="n", default="2", metavar="N",
                        help="number of peers (processes) on this host (default 2)")
    parser.add_argument("--sizes", default="4K,256K,4M,64M", metavar="LIST",
                        help="array sizes in bytes, comma separated, K/M/G = powers of 1024 "
                             "(default 4K,256K,4M,64M); rounded down to whole float32s")
    parser.add_argument("--transport", default="auto", metavar="KIND",
                        help="auto | tcp | ipc (| shm where built in); default auto: the "
                             "fastest path between peers on one host")
    parser.add_argument("--vs", action="append", default=[], metavar="IMPL",
                        help="also measure IMPL in the same run: gloo (torch.distributed)")
    parser.add_argument("--json", action="store_true",
                        help="one JSON object per row on stdout instead of the table")
    parser.add_argument("--iters", default=None, metavar="K",
                        help="timed iterations per size (default 50 up to 256K, 20 up to 4M, "
                             "then 10)")
    parser.add_argument("--warmup", default="3", metavar="W",
                        help="untimed iterations per size (default 3)")
    parser.add_argument("--op", dest="reduce_op", default="sum", metavar="OP",
                        help="allreduce reduction: sum | mean | max | min | prod (default sum)")
    parser.add_argument("--key", default=None, metavar="PATH",
                        help="cluster key file (gossip keygen): run with CURVE on")
    parser.add_argument("--algorithm", default="auto", metavar="ALGO",
                        help="allreduce algorithm: auto | ring | recursive-doubling")
    parser.add_argument("--timeout", default=None, metavar="SECONDS",
                        help="wall limit of each run of peers (default: from the sizes)")
    parser.set_defaults(func=main)
    return parser


def _int(name: str, text, minimum: int) -> int:
    try:
        value = int(str(text).strip())
    except ValueError:
        raise ValueError(f"{name} must be an integer, got {text!r}") from None
    if value < minimum:
        raise ValueError(f"{name} must be at least {minimum}, got {value}")
    return value


def main(args: argparse.Namespace) -> int:
    """Run `gossip bench`: the table, or one JSON row per line, on stdout. Bad arguments raise
    ValueError; a failed run is one line and exit code 1."""
    from collectives.errors import GossipError
    from gossip.bench import (BenchError, check_args, format_table, header_line, parse_sizes,
                              run_bench)
    from gossip.bench.sizes import check_memory

    n = _int("-n (the number of peers)", args.n, 1)
    iters = None if args.iters is None else _int("--iters", args.iters, 1)
    warmup = _int("--warmup", args.warmup, 0)
    timeout = None
    if args.timeout is not None:
        try:
            timeout = float(args.timeout)
        except ValueError:
            raise ValueError(f"--timeout must be a number of seconds, got {args.timeout!r}") \
                from None
    sizes = parse_sizes(args.sizes)
    check_memory(n, sizes)
    vs = tuple(v for item in args.vs for v in item.split(",") if v)
    check_args(args.op, n, args.transport, vs, args.reduce_op, args.algorithm, iters, warmup)
    header = header_line(args.op, n, args.transport, vs_gloo="gloo" in vs, key=args.key,
                         algorithm=args.algorithm)

    def progress(msg: str) -> None:
        print(f"# {msg} ...", file=sys.stderr, flush=True)

    if not args.json:
        print(header, flush=True)
    try:
        rows = run_bench(args.op, n, sizes, transport=args.transport, vs_gloo=vs,
                         iters=iters, warmup=warmup, reduce_op=args.reduce_op, key=args.key,
                         algorithm=args.algorithm, timeout=timeout, progress=progress)
    except (BenchError, GossipError) as exc:
        print(f"gossip bench: the run failed: {exc}", file=sys.stderr)
        return 1
    if args.json:
        print(header, file=sys.stderr, flush=True)
        for row in rows:
            print(json.dumps(row), flush=True)
    else:
        print(format_table(rows), flush=True)
    return 0
