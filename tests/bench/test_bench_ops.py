"""`gossip bench`'s rooted and split operations (reduce_scatter, reduce, gather, scatter,
alltoall), nccl-tests' size sweep (-b/-e/-f) and the memory check: shapes and formats only,
never timings."""
from __future__ import annotations

import pytest

from gossip.bench import (busbw_factor, check_memory, format_table, layout, row_sizes,
                          run_bench, sweep_sizes)
from gossip.cli import main as gossip_main

NEW_OPS = ("reduce_scatter", "reduce", "gather", "scatter", "alltoall", "alltoallv")
# allgatherv has no Gloo row (Gloo's allgather takes equal sizes).
ROW_OPS = NEW_OPS + ("allgatherv",)
# busbw = algbw * factor, as the help text and gossip/bench/__init__.py document them.
FACTORS = {"reduce_scatter": lambda n: (n - 1) / n, "reduce": lambda n: 1.0,
           "gather": lambda n: (n - 1) / n, "scatter": lambda n: (n - 1) / n,
           "alltoall": lambda n: (n - 1) / n,
           # n(n+1)/2 shares a peer, one of them kept
           "alltoallv": lambda n: 1 - 2 / (n * (n + 1)),
           "allgatherv": lambda n: (n - 1) / n}


# ------------------------------------------------------------------ sizes of each op
def test_split_sizes_are_n_equal_parts_as_nccl_tests():
    # 4 KiB over 3 peers: 341 float32s each, 4092 bytes in all (count = one part).
    for op in ("reduce_scatter", "gather", "scatter", "alltoall"):
        assert layout(op, 3, 4096) == (4092, 341)
        assert layout(op, 4, 4096) == (4096, 256)
    # Whole arrays: the size is the array, the count its elements.
    assert layout("reduce", 3, 4096) == (4096, 1024)
    assert layout("allgather", 3, 4096) == (4096, 1024)   # each peer's input, as before
    with pytest.raises(ValueError, match="at least 12 bytes"):
        layout("gather", 3, 8)
    assert row_sizes("alltoall", 3, "4K,1M") == [4092, 1048572]
    # alltoallv: n(n+1)/2 equal shares, cut unequally (count = one share's elements).
    assert layout("alltoallv", 3, 4096) == (4080, 170)
    assert layout("alltoallv", 4, 4096) == (4080, 102)
    with pytest.raises(ValueError, match="at least 40 bytes"):
        layout("alltoallv", 4, 36)
    assert layout("allgatherv", 4, 4096) == (4080, 102)   # the gathered output, in shares


def test_allgatherv_parts_fill_the_gathered_output():
    from gossip.bench.ops import allgatherv_counts
    assert allgatherv_counts(4, 1021) == [102, 204, 306, 408]   # 10 shares of 102, 1 left
    assert sum(allgatherv_counts(3, 4080 // 4)) == 1020


def test_alltoallv_blocks_pair_and_keep_every_peer_whole():
    from gossip.bench.ops import alltoallv_counts
    for n in (2, 3, 5):
        total = 7 * n * (n + 1) // 2 + 1   # 7 elements a share, and one left over
        table = [alltoallv_counts(n, r, total) for r in range(n)]
        for r, (sends, recvs) in enumerate(table):
            assert recvs == [table[j][0][r] for j in range(n)]      # what j sends r
            assert sum(sends) == sum(recvs) == 7 * n * (n + 1) // 2
            assert sorted(sends) == [7 * k for k in range(1, n + 1)] and sends[r] == 7


def test_busbw_factors():
    for n in (2, 3, 4):
        for op, factor in FACTORS.items():
            assert busbw_factor(op, n) == pytest.approx(factor(n)), (op, n)
    assert busbw_factor("allreduce", 4) == 1.5 and busbw_factor("allgather", 4) == 0.75


def test_sweep_sizes_as_nccl_tests():
    assert sweep_sizes("4K", "64K", "4") == [4096, 16384, 65536]
    assert sweep_sizes("4K", "64K") == [4096, 8192, 16384, 32768, 65536]   # -f 2
    assert sweep_sizes("1K", "5K", 2) == [1024, 2048, 4096]                # not past -e
    assert sweep_sizes("4M", None) == [4 << 20] == sweep_sizes(None, "4M")
    for args, match in [(("64K", "4K"), "larger than"), (("4K", "8K", "1"), "at least 2"),
                        (("4K", "8K", "1.5"), "integer"), ((None, None, "2"), "needs"),
                        (("4Q", "8K"), "bad size")]:
        with pytest.raises(ValueError, match=match):
            sweep_sizes(*args)


def test_memory_check_counts_what_each_op_holds():
    check_memory("allreduce", 4, [64 << 20], available=1 << 30)   # 768 MiB of 1 GiB: fits
    # gather at the root holds the whole gathered buffer: more than allreduce of that size.
    with pytest.raises(ValueError, match=r"gather of 256 MiB with 4 peers needs about 2.5 GiB"):
        check_memory("gather", 4, [256 << 20], available=2 << 30)
    check_memory("allreduce", 2, [256 << 20], available=2 << 30)
    # allgather: each peer holds the n inputs it gathered.
    with pytest.raises(ValueError, match="allgather of 64 MiB with 4 peers needs about 1.8"):
        check_memory("allgather", 4, [64 << 20], available=1 << 30)


@pytest.mark.parametrize("args,words", [
    (["gather", "-n", "4", "--sizes", "100G"], "needs about"),
    (["alltoall", "-n", "4", "-e", "100G"], "needs about"),
    (["scatter", "-n", "4", "--sizes", "4"], "too small"),
    (["allreduce", "-n", "2", "--sizes", "4K", "-b", "4K"], "not both"),
    (["allreduce", "-n", "2", "-b", "64K", "-e", "4K"], "larger than"),
    (["allreduce", "-n", "2", "-b", "4K", "-e", "8K", "-f", "0"], "at least 2"),
    (["allreduce", "-n", "2", "-f", "4"], "needs"),
    (["reduce", "-n", "2", "-b", "4Q"], "bad size"),
])
def test_bench_bad_sweep_and_sizes_are_one_line(args, words, capsys):
    assert gossip_main(["bench", *args]) == 2
    out, err = capsys.readouterr()
    lines = err.strip().splitlines()
    assert out == "" and len(lines) == 1 and "error" in lines[0] and words in lines[0], err


def test_bench_sweep_flags_make_the_rows(capsys):
    assert gossip_main(["bench", "alltoall", "-n", "2", "-b", "4K", "-e", "64K", "-f", "4",
                        "--iters", "1", "--warmup", "0"]) == 0
    out, err = capsys.readouterr()
    rows = [line.split() for line in out.splitlines() if line.strip()
            and not line.startswith("#")]
    assert [r[0] for r in rows] == ["4096", "16384", "65536"]
    assert [r[1] for r in rows] == ["512", "2048", "8192"]   # one block: size / n / 4


# ------------------------------------------------------------------ every new op runs
@pytest.mark.parametrize("n", [2, 3])
@pytest.mark.parametrize("op", ROW_OPS)
def test_new_ops_give_sane_rows(op, n):
    rows = run_bench(op, n, ["4K", "64K"], iters=2, warmup=1)
    assert [r["bytes"] for r in rows] == [layout(op, n, s)[0] for s in (4096, 65536)]
    for row in rows:
        assert row["op"] == op and row["nprocs"] == n and row["iters"] == 2
        assert row["count"] == layout(op, n, row["bytes"])[1]
        assert 0 < row["seconds_min"] <= row["seconds_median"] <= row["seconds_max"]
        assert row["algbw_GBps"] == pytest.approx(row["bytes"] / row["seconds_median"] / 1e9)
        assert row["busbw_GBps"] == pytest.approx(row["algbw_GBps"] * FACTORS[op](n))
        assert row["redop"] == ("sum" if op in ("reduce_scatter", "reduce") else None)
    assert "Avg bus bandwidth" in format_table(rows)


@pytest.mark.slow   # ~40 s on 2 loaded CPUs: five Gloo runs, torch imported in 3 processes each
@pytest.mark.parametrize("op", NEW_OPS)
def test_new_ops_against_gloo(op):
    pytest.importorskip("torch")
    rows = run_bench(op, 3, ["4K", "1M"], iters=2, warmup=1, vs_gloo=True)
    for row in rows:
        assert "gloo_note" not in row, row["gloo_note"]
        assert row["gloo_seconds_median"] > 0 and row["ratio"] > 0
        assert row["gloo_busbw_GBps"] == pytest.approx(
            row["bytes"] / row["gloo_seconds_median"] / 1e9 * FACTORS[op](3))
    table = format_table(rows)
    assert "gloo time" in table and "; gloo " in table.splitlines()[-1]


def test_allgatherv_against_gloo_says_it_is_not_measured(capsys):
    assert gossip_main(["bench", "allgatherv", "-n", "2", "--sizes", "4K", "--vs", "gloo",
                        "--iters", "1", "--warmup", "0"]) == 0
    out = capsys.readouterr().out
    assert "# gloo: not measured" in out and "Gloo's allgather takes equal sizes only" in out


def test_format_table_marks_a_baseline_it_could_not_measure():
    row = {"impl": "gossip", "op": "reduce_scatter", "nprocs": 2, "bytes": 4096, "count": 512,
           "type": "float32", "redop": "sum", "seconds_median": 1e-3, "algbw_GBps": 0.004,
           "busbw_GBps": 0.002, "transport_used": "shm",
           "gloo_note": "not measured, torch 1.0 refused it (reduce_scatter: unsupported)"}
    lines = format_table([row]).splitlines()
    (cells,) = [line.split() for line in lines if not line.startswith("#")]
    assert cells[:2] == ["4096", "512"] and cells[-2:] == ["n/a", "n/a"]
    assert "# gloo: not measured, torch 1.0 refused it (reduce_scatter: unsupported)" in lines
    assert lines[-1] == "# Avg bus bandwidth    : 0.002 GB/s (gossip, over 1 size)"


@pytest.mark.parametrize("n", [2, 3])
def test_neighbor_allgather_rows_count_what_each_peer_receives(n):
    rows = run_bench("neighbor_allgather", n, ["4K"], iters=2, warmup=1)
    for row in rows:
        received = min(n - 1, 2) * row["bytes"]   # ring neighbours' arrays (n = 2: one)
        assert row["algbw_GBps"] == pytest.approx(received / row["seconds_median"] / 1e9)
        assert row["busbw_GBps"] == pytest.approx(row["algbw_GBps"])
