"""Benchmarks of the collectives, reported like nccl-tests, with Gloo and plain pyzmq measured
in the same run for comparison. ``gossip bench`` is the command line; everything here is usable
from Python:

    from gossip.bench import run_bench, format_table
    rows = run_bench("allreduce", 4, ["4K", "64M"], vs_gloo=True)
    print(format_table(rows))

Method (as the baseline scripts in shared/bench/, and nccl-tests):

* every peer is a real process on this host (gossip.testing.spawn, loopback);
* each iteration is ``barrier(); t0; op; t1``; the iteration's time is the slowest rank's
  (``p2p``: the receiver's, timed from the barrier); the figure reported is the median of the
  timed iterations (min and max are kept too), after ``warmup`` untimed iterations;
* ``algbw = bytes / time`` (GB = 1e9 bytes), and ``busbw`` by the nccl-tests conventions:
  allreduce ``algbw * 2(n-1)/n``; allgather: ``bytes`` is each peer's *input*, algbw is
  computed on the gathered output (``n * bytes / time``, nccl-tests' size) and
  ``busbw = algbw * (n-1)/n``, i.e. what each peer receives per second; broadcast, neighbor
  and p2p ``busbw = algbw``;
* ``neighbor`` is one ``peer.neighbor_allreduce`` round on a ring (self 1/3, each of the two
  ring neighbours 1/3: the D-PSGD step); with n = 2 both neighbours are the same peer, which
  then weighs 2/3 and is sent to once.

The modules: sizes (parsing, plans, deadlines), measure (what the gossip peers time),
baselines (Gloo, plain pyzmq), tables (figures, header line, table), runner (run_bench). torch
is imported only by the Gloo comparison (in its own processes), never by ``gossip``.
"""
from gossip.bench.baselines import BenchError, run_pyzmq_p2p
from gossip.bench.measure import run_p2p
from gossip.bench.runner import (ALGORITHMS, OPS, REDUCE_OPS, check_args, run_bench,
                                 supported_transports)
from gossip.bench.sizes import (DEFAULT_SIZES, default_iters, format_size, parse_size,
                                parse_sizes, stream_count)
from gossip.bench.tables import busbw_factor, format_table, header_line, summarize

__all__ = ["OPS", "REDUCE_OPS", "ALGORITHMS", "DEFAULT_SIZES", "BenchError",
           "parse_size", "parse_sizes", "supported_transports", "format_size", "default_iters",
           "busbw_factor", "check_args", "run_bench", "format_table", "header_line", "run_p2p",
           "run_pyzmq_p2p", "summarize", "stream_count"]
