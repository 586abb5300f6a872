"""`gossip bench OP -n N`: time a collective over N local peers, nccl-tests style (sizes from
--sizes or nccl-tests' -b/-e/-f sweep; rows printed as measured; "# Avg bus bandwidth" at the
end), optionally against torch.distributed's Gloo and OpenMPI (mpi4py) in the same run, and for
allreduce against this host's memory bound."""
from __future__ import annotations

import argparse
import json
import signal
import sys
import threading

__all__ = ["register", "main"]


def register(subparsers) -> argparse.ArgumentParser:
    """Add the `bench` subcommand to the `gossip` parser."""
    parser = subparsers.add_parser(
        "bench", help="benchmark allreduce / allgather / reduce_scatter / broadcast / reduce / "
                      "gather / scatter / alltoall / neighbor / neighbor_allgather / p2p "
                      "on this host",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        description=(
            "Start N peers on this host (loopback) and time OP on float32 arrays of each size.\n"
            "Per iteration: barrier, then the operation; the iteration's time is the slowest\n"
            "rank's and the table shows the median over iterations, one row printed as soon\n"
            "as its size is measured (with --vs gloo,mpi: by all), then nccl-tests' '# Avg bus\n"
            "bandwidth' line. Ctrl-C keeps the rows printed, stops every process, exit 130.\n"
            "--vs mpi: mpi4py under OpenMPI's mpirun -np N on shared memory (btl self,vader).\n"
            "allreduce with a size of 1 MiB or more: numpy's copy and add rates on the largest\n"
            "size, measured first, give a bound on busbw ('%bound' column, '# memory bound'\n"
            "line: (2/n) / (1/add + 1/copy), see gossip/bench/membound.py).\n\n"
            "ops and what a size is (nccl-tests' conventions, but for allgather):\n"
            "  allreduce               each peer's array; busbw = algbw*2(n-1)/n\n"
            "  allgather               each peer's INPUT (nccl-tests: the gathered output);\n"
            "                          algbw = n*size/time; busbw = algbw*(n-1)/n\n"
            "  reduce_scatter          the whole array each peer reduces; busbw = algbw*(n-1)/n\n"
            "  broadcast, reduce       each peer's array, root 0; busbw = algbw\n"
            "  gather                  the root's gathered buffer (each sends size/n), root 0\n"
            "  scatter                 the root's buffer (each gets size/n), root 0\n"
            "  alltoall                each peer's input, n equal blocks\n"
            "                          (gather, scatter, alltoall: busbw = algbw*(n-1)/n)\n"
            "  alltoallv               each peer's input in s = n(n+1)/2 shares: rank r sends\n"
            "                          j (j - r) % n + 1 of them (MPI's Alltoallv); busbw =\n"
            "                          algbw*(s-1)/s\n"
            "  allgatherv              the gathered output in n(n+1)/2 shares: rank j gives\n"
            "                          j + 1 of them (MPI's Allgatherv; no Gloo row); busbw =\n"
            "                          algbw*(n-1)/n\n"
            "  neighbor                one neighbor_allreduce ring round (self 1/3, each\n"
            "                          neighbour 1/3); busbw = algbw\n"
            "  neighbor_allgather      each peer's array to both ring neighbours, theirs\n"
            "                          gathered; algbw = received bytes/time = busbw\n"
            "  p2p                     rank 0 -> rank 1 send/recv, -n 2, always compared with\n"
            "                          plain pyzmq PAIR in the same run; busbw = algbw\n"
            "algbw = size/time. For reduce_scatter, gather, scatter and alltoall the size is\n"
            "rounded down to n equal parts of whole float32s and 'count' is one part's\n"
            "elements, as nccl-tests prints them."),
        epilog=(
            "examples:\n"
            "  gossip bench allreduce -n 4 --sizes 4K,256K,4M,64M --vs gloo\n"
            "  gossip bench allreduce -n 2 --sizes 4K,4M,64M --vs gloo,mpi\n"
            "  gossip bench reduce_scatter -n 4 -b 4K -e 64M -f 4 --vs gloo\n"
            "  gossip bench neighbor -n 4 --sizes 4M,64M --json\n"
            "  gossip bench p2p -n 2 --sizes 4K,4M,64M --transport tcp"))
    parser.add_argument("op", metavar="OP",
                        help="allreduce | allgather | reduce_scatter | broadcast | reduce | "
                             "gather | scatter | alltoall | neighbor | neighbor_allgather | p2p")
    parser.add_argument("-n", "--nprocs", dest="n", default="2", metavar="N",
                        help="number of peers (processes) on this host (default 2)")
    parser.add_argument("--sizes", default=None, metavar="LIST",
                        help="sizes in bytes, comma separated, K/M/G = powers of 1024 "
                             "(default 4K,256K,4M,64M); rounded down to whole float32s")
    parser.add_argument("-b", "--minbytes", default=None, metavar="SIZE",
                        help="nccl-tests' sweep instead of --sizes: from SIZE ...")
    parser.add_argument("-e", "--maxbytes", default=None, metavar="SIZE",
                        help="... up to SIZE (either alone: that one size) ...")
    parser.add_argument("-f", "--stepfactor", default=None, metavar="F",
                        help="... multiplying by the integer F each step (default 2)")
    parser.add_argument("--transport", default="auto", metavar="KIND",
                        help="auto | tcp | ipc (| shm where built in); default auto: the "
                             "fastest path between peers on one host")
    parser.add_argument("--vs", action="append", default=[], metavar="IMPL",
                        help="also measure IMPL in the same run: gloo (torch.distributed), "
                             "mpi (mpi4py under OpenMPI's mpirun); comma separated or "
                             "repeated")
    parser.add_argument("--json", action="store_true",
                        help="one JSON object per row on stdout instead of the table (the "
                             "header and '# Avg bus bandwidth' lines go to stderr)")
    parser.add_argument("--iters", default=None, metavar="K",
                        help="timed iterations per size (default 50 up to 256K, 20 up to 4M, "
                             "then 10)")
    parser.add_argument("--warmup", default="3", metavar="W",
                        help="untimed iterations per size (default 3)")
    parser.add_argument("--op", dest="reduce_op", default="sum", metavar="OP",
                        help="reduction of allreduce, reduce_scatter and reduce: sum | mean | "
                             "max | min | prod (default sum)")
    parser.add_argument("--key", default=None, metavar="PATH",
                        help="cluster key file (gossip keygen): run with CURVE on")
    parser.add_argument("--algorithm", default="auto", metavar="ALGO",
                        help="allreduce algorithm: auto | ring | recursive-doubling")
    parser.add_argument("--timeout", default=None, metavar="SECONDS",
                        help="wall limit of each size's measurement by each implementation "
                             "(default: from the size)")
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


def _sizes(args: argparse.Namespace) -> list:
    """--sizes, or nccl-tests' -b/-e/-f sweep; never both."""
    from gossip.bench.sizes import DEFAULT_SIZES, parse_sizes, sweep_sizes

    sweep = (args.minbytes, args.maxbytes, args.stepfactor)
    if any(v is not None for v in sweep):
        if args.sizes is not None:
            raise ValueError("give either --sizes or the -b/-e/-f sweep, not both")
        return sweep_sizes(*sweep)
    return parse_sizes(args.sizes if args.sizes is not None else DEFAULT_SIZES)


def _first_interrupt(signum, frame) -> None:
    # A second Ctrl-C must not cut short the stopping of the peers the first one started.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    raise KeyboardInterrupt


def main(args: argparse.Namespace) -> int:
    """Run `gossip bench`: the header, then each row as it is measured (table lines, or one
    JSON object per line), then the notes and the average busbw. Bad arguments raise
    ValueError; a failed run is one line and exit code 1; Ctrl-C stops the peers, keeps the
    rows printed, says so in one line and gives exit code 130."""
    from collectives.errors import GossipError
    from gossip.bench import (BenchError, bound_applies, check_args, check_memory,
                              column_header, format_row, header_line, row_sizes, run_bench)

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
    vs = tuple(v for item in args.vs for v in item.split(",") if v)
    check_args(args.op, n, transport=args.transport, vs=vs, reduce_op=args.reduce_op,
               algorithm=args.algorithm, iters=iters, warmup=warmup)
    sizes = row_sizes(args.op, n, _sizes(args))
    check_memory(args.op, n, sizes)
    header = header_line(args.op, n, args.transport, vs=vs, key=args.key,
                         algorithm=args.algorithm)
    extras = (["pyzmq"] if args.op == "p2p" else []) + [v for v in ("gloo", "mpi") if v in vs]
    bound = bound_applies(args.op, n, sizes)
    table = sys.stderr if args.json else sys.stdout   # where the comment lines go
    rows: list[dict] = []

    def progress(msg: str) -> None:
        print(f"# {msg} ...", file=sys.stderr, flush=True)

    def on_row(row: dict) -> None:
        rows.append(row)
        print(json.dumps(row) if args.json else format_row(row, extras, bound), flush=True)

    print(header, file=table, flush=True)
    if not args.json:
        print(column_header(extras, bound), flush=True)
    previous = None
    if threading.current_thread() is threading.main_thread():
        previous = signal.signal(signal.SIGINT, _first_interrupt)
    try:
        run_bench(args.op, n, sizes, transport=args.transport, vs_gloo=vs, iters=iters,
                  warmup=warmup, reduce_op=args.reduce_op, key=args.key,
                  algorithm=args.algorithm, timeout=timeout, progress=progress, on_row=on_row)
    except KeyboardInterrupt:
        _close(rows, args.json, table)
        print(f"gossip bench: interrupted after {len(rows)} of {len(sizes)} sizes; every peer "
              "was stopped", file=sys.stderr, flush=True)
        return 130
    except (BenchError, GossipError) as exc:
        print(f"gossip bench: the run failed: {exc}", file=sys.stderr)
        return 1
    finally:
        if previous is not None:
            signal.signal(signal.SIGINT, previous)
    _close(rows, args.json, table)
    return 0


def _close(rows: list, as_json: bool, table) -> None:
    """The lines under the rows: the notes and the average busbw (JSON: only the average, on
    stderr with the header)."""
    from gossip.bench import avg_busbw_line, footer, membound_line

    if as_json:
        bound = membound_line(rows)
        if bound:
            print(bound, file=table, flush=True)
        print(avg_busbw_line(rows), file=table, flush=True)
    elif rows:
        print(footer(rows), flush=True)
    else:
        print(avg_busbw_line(rows), flush=True)
