"""The figures and the table of a benchmark run: per-iteration times to median, algbw and
busbw (nccl-tests conventions, gossip.bench.ops), the header line, and the nccl-tests style
table in pieces, so that rows print as they are measured:

    print(header_line("allreduce", 4))
    print(column_header(["gloo"]))
    for row in rows:
        print(format_row(row, ["gloo"]))
    print(footer(rows))                  # the notes and "# Avg bus bandwidth"
    print(format_table(rows))            # all of the above but the header line, at once
"""
from __future__ import annotations

import os
import statistics
from typing import Any, Sequence

from gossip.bench.ops import NOTES, algbw_bytes, busbw_factor

__all__ = ["busbw_factor", "summarize", "iteration_times", "figures", "header_line",
           "column_header", "format_row", "footer", "avg_busbw_line", "format_table",
           "BASELINE_COLUMNS"]

#: The comparisons that get columns, in their order.
BASELINE_COLUMNS = ("pyzmq", "gloo")


def summarize(times: Sequence[float]) -> tuple[float, float, float]:
    """(median, min, max): the median is the figure, min and max show the spread."""
    return statistics.median(times), min(times), max(times)


def iteration_times(op: str, per_rank: Sequence[Any]) -> list[float]:
    """One size's per-iteration seconds from every rank's ``{"times": [...]}``: iteration i
    takes the slowest rank's time, or for p2p the receiver's (rank 1) clock."""
    if op == "p2p":
        return list(per_rank[1]["times"])
    return [max(vals) for vals in zip(*(res["times"] for res in per_rank))]


def figures(op: str, n: int, nbytes: int, times: Sequence[float]) -> dict:
    """A row's timing fields for one size: seconds (median, min, max), algbw and busbw."""
    med, lo, hi = summarize(times)
    algbw = algbw_bytes(op, n, nbytes) / med / 1e9 if med > 0 else float("inf")
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
        share += "; Gloo measures each size right after ours, in its own processes"
    extra = f", algorithm={algorithm}" if op == "allreduce" else ""
    extra += ", CURVE on" if key else ""
    timing = ("the receiver's time from a barrier" if op == "p2p"
              else "the slowest rank's time")
    return (f"# gossip bench {op}: n={n} peers, transport={transport}{extra}, host CPUs: "
            f"{ncpu} ({share}); time = median over iterations of {timing}")


def _fmt_us(seconds: float) -> str:
    us = seconds * 1e6
    return f"{us:.1f}" if us < 1e4 else f"{us:.0f}"


def column_header(extras: Sequence[str] = ()) -> str:
    """The two header lines of the table, with a group of columns per comparison."""
    head1 = f"#{'size':>11} {'count':>11} {'type':>7} {'redop':>6} {'time':>10} " \
            f"{'algbw':>7} {'busbw':>7}"
    head2 = f"#{'(B)':>11} {'(elements)':>11} {'':>7} {'':>6} {'(us)':>10} " \
            f"{'(GB/s)':>7} {'(GB/s)':>7}"
    for name in extras:
        head1 += f" | {name + ' time':>11} {name + ' busbw':>12} {'ratio':>6}"
        head2 += f" | {'(us)':>11} {'(GB/s)':>12} {'':>6}"
    return head1 + "\n" + head2


def format_row(row: dict, extras: Sequence[str] = ()) -> str:
    """One size's line; a comparison without figures for it (an operation its library does
    not support) shows n/a."""
    line = (f" {row['bytes']:>11} {row['count']:>11} {row['type']:>7} "
            f"{row.get('redop') or 'none':>6} {_fmt_us(row['seconds_median']):>10} "
            f"{row['algbw_GBps']:>7.3f} {row['busbw_GBps']:>7.3f}")
    for name in extras:
        if f"{name}_seconds_median" in row:
            line += (f" | {_fmt_us(row[name + '_seconds_median']):>11} "
                     f"{row[name + '_busbw_GBps']:>12.3f} {row[name + '_ratio']:>6.2f}")
        else:
            line += f" | {'n/a':>11} {'n/a':>12} {'':>6}"
    return line


def avg_busbw_line(rows: Sequence[dict]) -> str:
    """nccl-tests' closing line: the mean busbw over the rows (and each comparison's, over
    the rows that have it)."""
    if not rows:
        return "# Avg bus bandwidth    : n/a (no sizes measured)"
    mean = statistics.fmean(r["busbw_GBps"] for r in rows)
    sizes = f"{len(rows)} size" + ("s" if len(rows) != 1 else "")
    line = f"# Avg bus bandwidth    : {mean:.3f} GB/s (gossip, over {sizes})"
    for name in BASELINE_COLUMNS:
        theirs = [r[f"{name}_busbw_GBps"] for r in rows if f"{name}_busbw_GBps" in r]
        if theirs:
            line += f"; {name} {statistics.fmean(theirs):.3f} GB/s"
    return line


def _extras(rows: Sequence[dict]) -> list[str]:
    return [name for name in BASELINE_COLUMNS
            if any(f"{name}_seconds_median" in r or f"{name}_note" in r for r in rows)]


def footer(rows: Sequence[dict], *, avg: bool = True) -> str:
    """The lines under the table: what the figures mean for this operation, the ratio, what
    a comparison could not measure, the transport, and (``avg``) the average busbw."""
    if not rows:
        return avg_busbw_line(rows) if avg else ""
    first = rows[0]
    lines = [f"# {NOTES[first['op']]}"]
    if _extras(rows):
        lines.append("# ratio = baseline time / gossip time (> 1: gossip is faster)")
    for name in BASELINE_COLUMNS:
        notes = {r[f"{name}_note"] for r in rows if f"{name}_note" in r}
        lines.extend(f"# {name}: {note}" for note in sorted(notes))
    if first.get("transport_used"):
        lines.append(f"# peers connected over: {first['transport_used']}")
    if avg:
        lines.append(avg_busbw_line(rows))
    return "\n".join(lines)


def format_table(rows: Sequence[dict]) -> str:
    """An nccl-tests style table of run_bench rows (one line per size), its notes and the
    average busbw: what ``gossip bench`` prints under its header line."""
    if not rows:
        return "# (no rows)"
    extras = _extras(rows)
    return "\n".join([column_header(extras), *(format_row(r, extras) for r in rows),
                      footer(rows)])
