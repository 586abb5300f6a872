"""Benchmarks of the collectives, reported like nccl-tests, with Gloo, OpenMPI (mpi4py) and
plain pyzmq measured in the same run for comparison, and for allreduce this host's memory
bound. ``gossip bench`` is the command line; everything here is usable
from Python:

    from gossip.bench import run_bench, format_table
    rows = run_bench("allreduce", 4, ["4K", "64M"], vs_gloo=True, on_row=print)
    print(format_table(rows))

Operations: allreduce, allgather, reduce_scatter, broadcast (root 0), reduce (root 0), gather
(root 0), scatter (root 0), alltoall (equal blocks), alltoallv (unequal blocks: ops.py's
alltoallv_counts), allgatherv (unequal parts: ops.py's allgatherv_counts), neighbor, p2p
(n = 2).

What a size is, per operation (nccl-tests' conventions but for allgather; ops.layout):

* allreduce, broadcast, reduce, neighbor, p2p: each peer's array; count = its elements;
* reduce_scatter: the whole array each peer reduces (its part is size/n); gather: the root's
  gathered buffer (each peer sends size/n); scatter: the root's buffer (each peer gets size/n);
  alltoall: each peer's input, n equal blocks of size/n. The size is rounded down to n equal
  parts of whole float32s and the count column is one part's elements, as nccl-tests prints;
* allgather: each peer's *input* (kept from before these conventions were written down, so
  that figures stay comparable; nccl-tests' size is the gathered output, n times larger);
  count = the input's elements;
* alltoallv: each peer's input in n(n+1)/2 shares (rank r sends rank j (j - r) % n + 1 of
  them); allgatherv: the gathered output in n(n+1)/2 shares (rank j gives j + 1 of them);
  count = one share's elements, the size rounded down to whole shares.

Method (as the baseline scripts in shared/bench/, and nccl-tests):

* every peer is a real process on this host (gossip.testing.spawn, loopback);
* each iteration is ``barrier(); t0; op; t1``; the iteration's time is the slowest rank's
  (``p2p``: the receiver's, timed from the barrier); the figure reported is the median of the
  timed iterations (min and max are kept too), after ``warmup`` untimed iterations;
* ``algbw = bytes / time`` (GB = 1e9 bytes), allgather's on the gathered output
  (``n * bytes / time``); ``busbw = algbw * factor``: allreduce ``2(n-1)/n``; allgather,
  reduce_scatter, gather, scatter, alltoall ``(n-1)/n``; broadcast, reduce, neighbor, p2p 1;
  the table ends with nccl-tests' "# Avg bus bandwidth" (the mean busbw over its rows);
* ``neighbor`` is one ``peer.neighbor_allreduce`` round on a ring (self 1/3, each of the two
  ring neighbours 1/3: the D-PSGD step); with n = 2 both neighbours are the same peer, which
  then weighs 2/3 and is sent to once;
* rows stream: our peers and each baseline's processes start (and connect) first, then take
  turns size by size, each idle while another measures, and a row is handed on as soon as its
  size is measured by all of them (groups); Ctrl-C stops them all and keeps what was printed.

The modules: ops (the operations: sizes, factors, notes, memory), sizes (parsing, sweeps,
plans, deadlines), groups (processes that measure one size at a time), measure (what the
gossip peers time), gloo_steps (what Gloo times), baselines (Gloo and plain pyzmq processes),
mpi (the OpenMPI ranks under mpirun) and mpi_rank (what they run and time), membound (the
memory bound of an on-host allreduce), tables (figures, header, rows, footer), runner
(run_bench). torch is imported only by the Gloo
comparison (in its own processes), never by ``gossip``.
"""
from gossip.bench.baselines import BenchError, run_pyzmq_p2p
from gossip.bench.measure import run_p2p
from gossip.bench.membound import allreduce_bound, bound_applies, memory_rates
from gossip.bench.mpi import check_mpi
from gossip.bench.ops import SPLIT, busbw_factor, check_memory, layout
from gossip.bench.session import (ALGORITHMS, OPS, REDUCE_OPS, check_args, row_sizes, run_bench,
                                 supported_transports)
from gossip.bench.sizes import (DEFAULT_SIZES, default_iters, format_size, parse_size,
                                parse_sizes, stream_count, sweep_sizes)
from gossip.bench.tables import (avg_busbw_line, column_header, footer, format_row,
                                 format_table, header_line, membound_line, summarize)

__all__ = ["OPS", "REDUCE_OPS", "ALGORITHMS", "DEFAULT_SIZES", "SPLIT", "BenchError",
           "parse_size", "parse_sizes", "sweep_sizes", "supported_transports", "format_size",
           "default_iters", "busbw_factor", "layout", "check_args", "check_memory",
           "row_sizes", "run_bench", "format_table", "header_line", "column_header",
           "format_row", "footer", "avg_busbw_line", "run_p2p", "run_pyzmq_p2p", "summarize",
           "stream_count", "check_mpi", "memory_rates", "allreduce_bound", "bound_applies",
           "membound_line"]
