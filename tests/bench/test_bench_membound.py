"""The memory bound of `gossip bench allreduce`: the model, the footer line and the column,
from a real run; no timing thresholds."""
from __future__ import annotations

import json
import os
import re
import subprocess
import sys

import pytest

from gossip.bench import allreduce_bound, bound_applies, format_table, membound_line

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
LINE = re.compile(r"^# memory bound: copy ([\d.]+) GB/s, add ([\d.]+) GB/s -> allreduce busbw "
                  r"bound ([\d.]+) GB/s; gossip reached ([\d.]+)%")


def gossip(*args, timeout=120):
    return subprocess.run([sys.executable, "-m", "gossip", *args], capture_output=True,
                          text=True, timeout=timeout, cwd=ROOT)


def test_the_model():
    # issue 18's machine: copy 11.4, add 8.3 GB/s -> about 4.8 GB/s busbw at n = 2
    assert allreduce_bound(2, 11.4, 8.3) == pytest.approx(4.80, abs=0.01)
    assert allreduce_bound(4, 10.0, 10.0) == pytest.approx(2.5)
    with pytest.raises(ValueError):
        allreduce_bound(1, 10.0, 10.0)
    assert bound_applies("allreduce", 2, [4096, 1 << 20])
    assert not bound_applies("allreduce", 2, [4096, (1 << 20) - 4])
    assert not bound_applies("allreduce", 1, [64 << 20])
    assert not bound_applies("broadcast", 4, [64 << 20])


def test_column_and_line_from_rows():
    def row(nbytes, busbw, **extra):
        return {"impl": "gossip", "op": "allreduce", "nprocs": 2, "bytes": nbytes,
                "count": nbytes // 4, "type": "float32", "redop": "sum",
                "seconds_median": 1e-3, "algbw_GBps": busbw, "busbw_GBps": busbw, **extra}
    rows = [row(4096, 0.01),
            row(64 << 20, 2.0, mem_copy_GBps=10.0, mem_add_GBps=10.0,
                membound_busbw_GBps=5.0, membound_fraction=0.4, mpi_seconds_median=2e-3,
                mpi_busbw_GBps=1.0, mpi_ratio=2.0, mpi_membound_fraction=0.2)]
    text = format_table(rows)
    assert "%bound" in text
    cells = [line.split() for line in text.splitlines() if not line.startswith("#")]
    assert cells[0][7] == "-" and cells[1][7] == "40.0"
    assert membound_line(rows) == ("# memory bound: copy 10.00 GB/s, add 10.00 GB/s -> "
                                   "allreduce busbw bound 5.00 GB/s; gossip reached 40.0% "
                                   "(at 64 MiB; mpi 20.0%)")
    assert membound_line(rows[:1]) is None


def test_bench_prints_the_bound_and_the_fraction_reached():
    out = gossip("bench", "allreduce", "-n", "2", "--sizes", "4K,1M", "--iters", "2",
                 "--warmup", "1")
    assert out.returncode == 0, out.stderr
    (line,) = [m for m in map(LINE.match, out.stdout.splitlines()) if m]
    copy, add, bound, percent = (float(v) for v in line.groups())
    assert copy > 0 and add > 0
    assert bound == pytest.approx(allreduce_bound(2, copy, add), rel=0.01, abs=0.01)
    # The bound takes one process's rates as the host's: peers on more cores may pass it, by
    # at most about min(n, CPUs) times; far beyond is a wrong model or a wrong unit.
    assert 0 < percent < 100 * 2 * 2
    assert "(bound = (2/n) / (1/add + 1/copy)" in out.stdout
    small, large = [r for r in out.stdout.splitlines() if r.strip() and not r.startswith("#")]
    assert small.split()[7] == "-" and float(large.split()[7]) == pytest.approx(percent, abs=0.1)
    assert "measuring numpy copy and add rates on 1 MiB" in out.stderr


def test_bench_json_rows_carry_the_bound():
    out = gossip("bench", "allreduce", "-n", "2", "--sizes", "4K,1M", "--iters", "2",
                 "--warmup", "1", "--json")
    assert out.returncode == 0, out.stderr
    small, large = [json.loads(line) for line in out.stdout.splitlines()]
    assert "membound_busbw_GBps" not in small
    assert large["membound_fraction"] == pytest.approx(
        large["busbw_GBps"] / large["membound_busbw_GBps"])
    assert large["membound_busbw_GBps"] == pytest.approx(
        allreduce_bound(2, large["mem_copy_GBps"], large["mem_add_GBps"]))
    assert any(LINE.match(line) for line in out.stderr.splitlines()), out.stderr
