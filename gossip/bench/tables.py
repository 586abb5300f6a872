"""The figures and the table of a benchmark run: per-iteration times to median, algbw and
busbw (nccl-tests conventions, gossip.bench.ops), the header line, and the nccl-tests style
table in pieces, so that rows print as they are measured:

    print(header_line("allreduce", 4, vs=["gloo", "mpi"]))
    print(column_header(["gloo", "mpi"], bound=True))   # bound: a '%bound' column
    for row in rows:
        print(format_row(row, ["gloo", "mpi"], bound=True))
    print(footer(rows))                  # the notes and "# Avg bus bandwidth"
    print(format_table(rows))            # all of the above but the header line, at once
"""
from __future__ import annotations

import os
import statistics
from typing import Any, Sequence

from gossip.bench.membound import MIN_BOUND_BYTES, MODEL
from gossip.bench.ops import NOTES, algbw_bytes, busbw_factor
from gossip.bench.sizes import format_size

__all__ = ["busbw_factor", "summarize", "iteration_times", "figures", "header_line",
           "column_header", "format_row", "footer", "avg_busbw_line", "format_table",
           "BASELINE_COLUMNS", "membound_line"]

#: The comparisons that get columns, in their order.
BASELINE_COLUMNS = ("pyzmq", "gloo", "mpi")


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
                key: str | None = None, algorithm: str = "auto", vs: Sequence[str] = ()) -> str:
    """The line above the table: what ran, and how many CPUs the peers share (peers that
    outnumber the cores contend, which the figures then include). ``vs``: the comparisons
    (``vs_gloo``: the same as ``vs=["gloo"]``)."""
    ncpu = os.cpu_count() or 1
    share = f"the {n} peers share these CPUs"
    if n > ncpu:
        share += f": {n} peers on {ncpu} CPUs contend"
    names = {"gloo": "Gloo", "mpi": "OpenMPI"}
    others = [names[v] for v in names if v in vs or (v == "gloo" and vs_gloo)]
    if others:
        share += (f"; {' and '.join(others)} measure{'s' if len(others) == 1 else ''} each "
                  "size right after ours, in their own processes")
    extra = f", algorithm={algorithm}" if op == "allreduce" else ""
    extra += ", CURVE on" if key else ""
    timing = ("the receiver's time from a barrier" if op == "p2p"
              else "the slowest rank's time")
    return (f"# gossip bench {op}: n={n} peers, transport={transport}{extra}, host CPUs: "
            f"{ncpu} ({share}); time = median over iterations of {timing}")


def _fmt_us(seconds: float) -> str:
    us = seconds * 1e6
    return f"{us:.1f}" if us < 1e4 else f"{us:.0f}"


def _fmt_ratio(ratio: float) -> str:
    return f"{ratio:.2f}" if ratio >= 0.1 else f"{ratio:.3f}"


def column_header(extras: Sequence[str] = (), bound: bool = False) -> str:
    """The two header lines of the table, with a group of columns per comparison; ``bound``:
    a column for the share of the memory bound gossip's busbw reached."""
    head1 = f"#{'size':>11} {'count':>11} {'type':>7} {'redop':>6} {'time':>10} " \
            f"{'algbw':>7} {'busbw':>7}"
    head2 = f"#{'(B)':>11} {'(elements)':>11} {'':>7} {'':>6} {'(us)':>10} " \
            f"{'(GB/s)':>7} {'(GB/s)':>7}"
    if bound:
        head1 += f" {'%bound':>7}"
        head2 += f" {'(%)':>7}"
    for name in extras:
        head1 += f" | {name + ' time':>11} {name + ' busbw':>12} {'ratio':>6}"
        head2 += f" | {'(us)':>11} {'(GB/s)':>12} {'':>6}"
    return head1 + "\n" + head2


def format_row(row: dict, extras: Sequence[str] = (), bound: bool = False) -> str:
    """One size's line; a comparison without figures for it (an operation its library does
    not support) shows n/a; ``bound``: the share of the memory bound reached, '-' for a size
    below MIN_BOUND_BYTES."""
    line = (f" {row['bytes']:>11} {row['count']:>11} {row['type']:>7} "
            f"{row.get('redop') or 'none':>6} {_fmt_us(row['seconds_median']):>10} "
            f"{row['algbw_GBps']:>7.3f} {row['busbw_GBps']:>7.3f}")
    if bound:
        fraction = row.get("membound_fraction")
        line += f" {'-' if fraction is None else f'{100 * fraction:.1f}':>7}"
    for name in extras:
        if f"{name}_seconds_median" in row:
            line += (f" | {_fmt_us(row[name + '_seconds_median']):>11} "
                     f"{row[name + '_busbw_GBps']:>12.3f} {_fmt_ratio(row[name + '_ratio']):>6}")
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
    library = next((r["mpi_library"] for r in rows if "mpi_library" in r), None)
    if library:
        lines.append(f"# mpi: {library}; mpirun -np {first['nprocs']} on shared memory (pml "
                     "ob1, btl self,vader); out-of-place where MPI has it")
    bound = membound_line(rows)
    if bound:
        lines.extend([bound, f"# ({MODEL}; %bound = busbw / bound, sizes from "
                             f"{MIN_BOUND_BYTES >> 20} MiB)"])
    if avg:
        lines.append(avg_busbw_line(rows))
    return "\n".join(lines)


def membound_line(rows: Sequence[dict]) -> str | None:
    """'# memory bound: copy X GB/s, add Y GB/s -> allreduce busbw bound Z GB/s; gossip
    reached F%' at the largest size with a bound (the size the rates were measured on), with
    each comparison's share; None when no row has one."""
    with_bound = [r for r in rows if "membound_busbw_GBps" in r]
    if not with_bound:
        return None
    r = max(with_bound, key=lambda row: row["bytes"])
    line = (f"# memory bound: copy {r['mem_copy_GBps']:.2f} GB/s, add {r['mem_add_GBps']:.2f} "
            f"GB/s -> allreduce busbw bound {r['membound_busbw_GBps']:.2f} GB/s; gossip reached "
            f"{100 * r['membound_fraction']:.1f}%")
    theirs = [f"{name} {100 * r[name + '_membound_fraction']:.1f}%"
              for name in BASELINE_COLUMNS if f"{name}_membound_fraction" in r]
    return line + f" (at {format_size(r['bytes'])}" + "".join(f"; {t}" for t in theirs) + ")"


def format_table(rows: Sequence[dict]) -> str:
    """An nccl-tests style table of run_bench rows (one line per size), its notes and the
    average busbw: what ``gossip bench`` prints under its header line."""
    if not rows:
        return "# (no rows)"
    extras = _extras(rows)
    bound = any("membound_fraction" in r for r in rows)
    return "\n".join([column_header(extras, bound),
                      *(format_row(r, extras, bound) for r in rows), footer(rows)])
