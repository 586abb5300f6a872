"""The figures and the table of a benchmark run: per-iteration times to median, algbw and
busbw (nccl-tests conventions), the header line and the nccl-tests style table.

    print(header_line("allreduce", 4))
    print(format_table(rows))
"""
from __future__ import annotations

import os
import statistics
from typing import Any, Sequence

__all__ = ["busbw_factor", "summarize", "iteration_times", "figures", "header_line",
           "format_table"]


def busbw_factor(op: str, n: int) -> float:
    """busbw = algbw * factor (nccl-tests); allgather's algbw is on the gathered output."""
    if op == "allreduce":
        return 2.0 * (n - 1) / n
    if op == "allgather":
        return (n - 1) / n
    return 1.0


def _algbw_bytes(op: str, n: int, nbytes: int) -> int:
    return n * nbytes if op == "allgather" else nbytes


def summarize(times: Sequence[float]) -> tuple[float, float, float]:
    """(median, min, max): the median is the figure, min and max show the spread."""
    return statistics.median(times), min(times), max(times)


def _slowest(per_rank: Sequence[Sequence[float]]) -> list[float]:
    """Iteration i's time is the slowest rank's."""
    return [max(vals) for vals in zip(*per_rank)]


def iteration_times(op: str, plan, results: Sequence[Any]) -> dict[int, list[float]]:
    """{bytes: per-iteration seconds} from every rank's ``results[rank]["times"]``: the
    slowest rank's, or for p2p the receiver's (rank 1) clock."""
    times = {}
    for nbytes, _, _ in plan:
        if op == "p2p":
            times[nbytes] = results[1]["times"][nbytes]
        else:
            times[nbytes] = _slowest([res["times"][nbytes] for res in results])
    return times


def figures(op: str, n: int, nbytes: int, times: Sequence[float]) -> dict:
    """A row's timing fields for one size: seconds (median, min, max), algbw and busbw."""
    med, lo, hi = summarize(times)
    algbw = _algbw_bytes(op, n, nbytes) / med / 1e9 if med > 0 else float("inf")
    return {"seconds_median": med, "seconds_min": lo, "seconds_max": hi,
            "algbw_GBps": algbw, "busbw_GBps": algbw * busbw_factor(op, n)}


def header_line(op: str, n: int, transport: str = "auto", *, vs_gloo: bool = False,
                key: str | None = None, algorithm: str = "auto") -> str:
    """The line above the table: what ran, and how many CPUs the peers share (peers that
    outnumber the cores contend, which the figures then include)."""
    ncpu = os.cpu_count() or 1
    share = f"the {n} peers share these CPUs"
    if n > ncpu:
        share += f": {n} peers on {ncpu} CPUs contend"
    if vs_gloo:
        share += "; Gloo runs after ours, in its own processes"
    extra = f", algorithm={algorithm}" if op == "allreduce" else ""
    extra += ", CURVE on" if key else ""
    timing = ("the receiver's time from a barrier" if op == "p2p"
              else "the slowest rank's time")
    return (f"# gossip bench {op}: n={n} peers, transport={transport}{extra}, host CPUs: "
            f"{ncpu} ({share}); time = median over iterations of {timing}")


_NOTES = {
    "allreduce": "busbw = algbw * 2(n-1)/n (nccl-tests)",
    "allgather": "size = each peer's input; algbw = n*size/time (the gathered output, as "
                 "nccl-tests); busbw = algbw * (n-1)/n",
    "broadcast": "root 0; busbw = algbw",
    "neighbor": "one neighbor_allreduce ring round (self 1/3, each neighbour 1/3); Gloo: "
                "isend/irecv to both neighbours + average; busbw = algbw",
    "p2p": "rank 0 -> rank 1, one array, timed at the receiver from a barrier; busbw = algbw; "
           "pyzmq: a PAIR socket over tcp when the peers used tcp, else ipc",
}


def _fmt_us(seconds: float) -> str:
    us = seconds * 1e6
    return f"{us:.1f}" if us < 1e4 else f"{us:.0f}"


def format_table(rows: Sequence[dict]) -> str:
    """An nccl-tests style table of run_bench rows (one line per size)."""
    if not rows:
        return "# (no rows)"
    first = rows[0]
    op = first["op"]
    extras = [name for name in ("pyzmq", "gloo") if f"{name}_seconds_median" in first]
    head1 = f"#{'size':>11} {'count':>11} {'type':>7} {'redop':>6} {'time':>10} " \
            f"{'algbw':>7} {'busbw':>7}"
    head2 = f"#{'(B)':>11} {'(elements)':>11} {'':>7} {'':>6} {'(us)':>10} " \
            f"{'(GB/s)':>7} {'(GB/s)':>7}"
    for name in extras:
        head1 += f" | {name + ' time':>11} {name + ' busbw':>12} {'ratio':>6}"
        head2 += f" | {'(us)':>11} {'(GB/s)':>12} {'':>6}"
    lines = [head1, head2]
    for row in rows:
        line = (f" {row['bytes']:>11} {row['count']:>11} {row['type']:>7} "
                f"{row.get('redop') or 'none':>6} {_fmt_us(row['seconds_median']):>10} "
                f"{row['algbw_GBps']:>7.3f} {row['busbw_GBps']:>7.3f}")
        for name in extras:
            line += (f" | {_fmt_us(row[name + '_seconds_median']):>11} "
                     f"{row[name + '_busbw_GBps']:>12.3f} {row[name + '_ratio']:>6.2f}")
        lines.append(line)
    lines.append(f"# {_NOTES[op]}")
    if extras:
        lines.append("# ratio = baseline time / gossip time (> 1: gossip is faster)")
    if first.get("transport_used"):
        lines.append(f"# peers connected over: {first['transport_used']}")
    return "\n".join(lines)
