"""`gossip bench` and gossip.bench: shapes and formats only, never timings."""
from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys

import pytest

from gossip.bench import (busbw_factor, default_iters, format_table, parse_size, parse_sizes,
                          run_bench)

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
ROW_FIELDS = ("impl", "op", "nprocs", "bytes", "seconds_median", "seconds_min", "seconds_max",
              "algbw_GBps", "busbw_GBps", "iters")


def gossip(*args, timeout=120):
    return subprocess.run([sys.executable, "-m", "gossip", *args], capture_output=True,
                          text=True, timeout=timeout, cwd=ROOT)


def table_rows(stdout: str) -> list[list[str]]:
    return [line.split() for line in stdout.splitlines() if line.strip()
            and not line.startswith("#")]


# ------------------------------------------------------------------ in-process helpers
@pytest.mark.parametrize("text,nbytes", [("4K", 4096), ("256k", 262144), ("4M", 4 << 20),
                                         ("64MiB", 64 << 20), ("1G", 1 << 30), ("1000", 1000),
                                         ("1001", 1000), ("4", 4), ("1.5K", 1536)])
def test_parse_size(text, nbytes):
    assert parse_size(text) == nbytes


@pytest.mark.parametrize("text", ["4Q", "", "K", "-4K", "2", "0", "4 K B"])
def test_parse_size_rejects(text):
    with pytest.raises(ValueError) as info:
        parse_size(text)
    assert "\n" not in str(info.value)


def test_parse_sizes_and_conventions():
    assert parse_sizes("4K,256K 4M") == [4096, 262144, 4 << 20]
    assert default_iters(4096) == 50 and default_iters(4 << 20) == 20
    assert default_iters(64 << 20) == 10
    assert busbw_factor("allreduce", 4) == 1.5
    assert busbw_factor("allgather", 4) == 0.75
    assert busbw_factor("broadcast", 4) == busbw_factor("neighbor", 4) == 1.0


def test_format_table_columns():
    row = {"impl": "gossip", "op": "allreduce", "nprocs": 2, "bytes": 4096, "count": 1024,
           "type": "float32", "redop": "sum", "seconds_median": 1e-3, "algbw_GBps": 0.004,
           "busbw_GBps": 0.004, "gloo_seconds_median": 2e-3, "gloo_busbw_GBps": 0.002,
           "gloo_ratio": 2.0, "transport_used": "ipc"}
    text = format_table([row])
    assert "gloo time" in text and "ratio" in text
    (cells,) = table_rows(text)
    assert cells[0] == "4096" and cells[1] == "1024" and cells[-1] == "2.00"


def test_import_does_not_import_torch():
    code = ("import sys, gossip, gossip.bench, gossip.cli.bench_command; "
            "print('torch' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=60, cwd=ROOT)
    assert out.stdout.strip() == "False", out.stderr


# ------------------------------------------------------------------ the command
def test_bench_table():
    out = gossip("bench", "allreduce", "-n", "2", "--sizes", "4K,64K", "--iters", "3",
                 "--warmup", "1")
    assert out.returncode == 0, out.stderr
    assert "n=2" in out.stdout and "CPUs" in out.stdout  # the header line
    rows = table_rows(out.stdout)
    assert [r[0] for r in rows] == ["4096", "65536"]
    assert [r[1] for r in rows] == ["1024", "16384"]
    for r in rows:
        time_us, algbw, busbw = float(r[4]), float(r[5]), float(r[6])
        assert time_us > 0 and algbw > 0 and busbw > 0
    last = out.stdout.splitlines()[-1]   # nccl-tests' closing line, over the rows
    assert last.startswith("# Avg bus bandwidth    : ") and "over 2 sizes" in last, last
    mean = statistics.fmean(float(r[6]) for r in rows)
    assert float(last.split(":")[1].split()[0]) == pytest.approx(mean, abs=2e-3)


def test_bench_takes_every_allreduce_algorithm_of_the_collectives():
    out = gossip("bench", "allreduce", "-n", "2", "--sizes", "64K", "--iters", "3",
                 "--warmup", "1", "--algorithm", "shm")
    assert out.returncode == 0, out.stderr
    assert "algorithm=shm" in out.stdout and len(table_rows(out.stdout)) == 1


def test_bench_json():
    out = gossip("bench", "allreduce", "-n", "2", "--sizes", "4K,64K", "--iters", "3",
                 "--warmup", "1", "--json")
    assert out.returncode == 0, out.stderr
    rows = [json.loads(line) for line in out.stdout.splitlines()]
    assert [r["bytes"] for r in rows] == [4096, 65536]
    for r in rows:
        for field in ROW_FIELDS:
            assert field in r, field
        assert r["impl"] == "gossip" and r["op"] == "allreduce" and r["nprocs"] == 2
        assert r["iters"] == 3 and r["busbw_GBps"] > 0
        assert r["seconds_min"] <= r["seconds_median"] <= r["seconds_max"]
        assert "ratio" not in r
    # The average goes to stderr with the header: stdout stays one JSON object per line.
    (avg,) = [line for line in out.stderr.splitlines() if "Avg bus bandwidth" in line]
    mean = statistics.fmean(r["busbw_GBps"] for r in rows)
    assert float(avg.split(":")[1].split()[0]) == pytest.approx(mean, abs=2e-3)


def test_bench_vs_gloo():
    pytest.importorskip("torch")
    out = gossip("bench", "allreduce", "-n", "2", "--sizes", "4K", "--iters", "2",
                 "--warmup", "1", "--vs", "gloo", timeout=180)
    assert out.returncode == 0, out.stderr
    header = [line for line in out.stdout.splitlines() if line.startswith("#")]
    assert any("gloo time" in line and "ratio" in line for line in header)
    (row,) = table_rows(out.stdout)
    assert row[0] == "4096" and float(row[-1]) > 0  # the ratio column


@pytest.mark.parametrize("args", [
    ["frobnicate", "-n", "2"],
    ["allreduce", "-n", "0"],
    ["allreduce", "-n", "two"],
    ["allreduce", "-n", "2", "--sizes", "4Q"],
    ["p2p", "-n", "3"],
    ["allreduce", "-n", "2", "--transport", "udp"],
    ["allreduce", "-n", "2", "--vs", "nccl"],
    ["allreduce", "-n", "2", "--algorithm", "shared"],
    # before: 75 lines of thread dumps, the cause at line 47 (no memory check up front)
    ["allreduce", "-n", "4", "--sizes", "4K,100G"],
])
def test_bench_bad_arguments(args):
    out = gossip("bench", *args, timeout=60)
    assert out.returncode == 2, (out.stdout, out.stderr)
    assert "Traceback" not in out.stderr
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and "error" in lines[0], out.stderr
    assert out.stdout == ""


def test_run_bench_neighbor():
    rows = run_bench("neighbor", 3, [4096], iters=2, warmup=1)
    (row,) = rows
    for field in ROW_FIELDS:
        assert field in row, field
    assert row["op"] == "neighbor" and row["nprocs"] == 3 and row["bytes"] == 4096
    assert row["iters"] == 2 and row["busbw_GBps"] == row["algbw_GBps"] > 0
    assert "neighbor_allreduce" in format_table(rows)


def test_run_bench_rejects_p2p_with_three():
    with pytest.raises(ValueError, match="2 peers"):
        run_bench("p2p", 3, [4096])


def test_threshold_help():
    out = subprocess.run([sys.executable, os.path.join(ROOT, "benchmarks",
                                                       "allreduce_threshold.py"), "--help"],
                         capture_output=True, text=True, timeout=60, cwd=ROOT)
    assert out.returncode == 0, out.stderr
    assert "crossover" in out.stdout and "--nprocs" in out.stdout


@pytest.mark.slow   # 26 s: a smoke run of the benchmark script, not of the library
def test_policies_benchmark_runs_every_table_small(tmp_path):
    """benchmarks/policies.py end to end at toy sizes: the three tables and the JSON rows."""
    rows = tmp_path / "rows.jsonl"
    out = subprocess.run([sys.executable, os.path.join(ROOT, "benchmarks", "policies.py"),
                          "-n", "2", "--steps", "1", "--warmup", "0", "--repeats", "2",
                          "--block", "1", "--iters", "1", "--gossip-bytes", "64K",
                          "--json", str(rows)],
                         capture_output=True, text=True, timeout=280, cwd=ROOT)
    assert out.returncode == 0, out.stdout + out.stderr
    for head in ("ratio DDP/Synchronous", "vs no communication (median)",
                 "ratio torch/Gossip"):
        assert head in out.stdout, out.stdout
    lines = [json.loads(line) for line in rows.read_text().splitlines()]
    overlap = [r for r in lines if r["table"] == "overlap"]
    assert [r["policy"] for r in overlap] == ["none", "asynchronous", "push-sum(overlap=True)",
                                             "push-sum", "gossip", "synchronous"]
    assert all(len(r["slowdowns"]) == 2 and r["seconds"] > 0 for r in overlap)
    assert overlap[0]["slowdowns"] == [1.0, 1.0]   # the baseline against itself
    assert all(r["bytes_per_step"] > 0 for r in overlap[1:])
    assert {r["table"] for r in lines} == {"sync", "overlap", "gossip"}


@pytest.mark.slow   # 16-22 s: the 10-minute budget of the default run
def test_invariants_script_measures_every_promise(tmp_path):
    """benchmarks/invariants.py end to end: a row per promise, each within its bound."""
    rows = tmp_path / "rows.jsonl"
    out = subprocess.run([sys.executable, os.path.join(ROOT, "benchmarks", "invariants.py"),
                          "--json", str(rows)],
                         capture_output=True, text=True, timeout=280, cwd=ROOT)
    assert out.returncode == 0, out.stdout + out.stderr
    got = [json.loads(line) for line in rows.read_text().splitlines()]
    assert len(got) == 9 and len(out.stdout.splitlines()) == 9, out.stdout
    (ring, one_peer, push, push_overlap, killed, killed_overlap, asynchronous, replicated,
     sharded) = got
    assert abs(ring["rate"] - ring["predicted"]) < 0.01 * ring["predicted"]
    assert one_peer["gap"] < 1e-9 * one_peer["start"]
    for r in (push, push_overlap):
        assert r["sum_x"] < 1e-12 and r["sum_w"] < 1e-12 and r["debiased"] < 1e-9
        assert r["numerator_alone"] > 0.1
    for r in (killed, killed_overlap):   # exact accounting when a peer dies
        assert r["sum_x"] < 1e-12 and r["sum_w"] < 1e-12, r
    assert abs(asynchronous["weights_minus_n"]) < 1e-9 and asynchronous["absorbed"] > 0
    assert replicated["drift"] < 1e-13 and sharded["drift"] < 1e-13


def test_compression_benchmark_runs_both_tables_small(tmp_path):
    """benchmarks/compression.py end to end at toy sizes: shapes of both tables (no figure
    is judged; the wire bytes are counts, so their order is: a codec sends less)."""
    rows = tmp_path / "rows.jsonl"
    out = subprocess.run([sys.executable, os.path.join(ROOT, "benchmarks", "compression.py"),
                          "--elements", "64K", "--repeats", "1", "-n", "2", "--steps", "4",
                          "--model-elements", "16K", "--json", str(rows)],
                         capture_output=True, text=True, timeout=280, cwd=ROOT)
    assert out.returncode == 0, out.stdout + out.stderr
    lines = [json.loads(line) for line in rows.read_text().splitlines()]
    throughput = [r for r in lines if r["table"] == "throughput"]
    assert [r["codec"] for r in throughput] == ["memcpy", "fp16", "bf16", "int8", "topk:0.01"]
    wire = {(r["policy"], r["codec"]): r["bytes_per_step"] for r in lines
            if r["table"] == "wire"}
    for policy in ("synchronous", "local-sgd", "gossip", "elastic"):
        assert wire[(policy, "int8")] < wire[(policy, "none")], (policy, wire)


def test_slow_network_benchmark_configurations_make_policies():
    """benchmarks/slow_network.py: every configuration it runs is a policy the registry
    makes (the demo builds them the same way), and a configuration that never reached the
    target has no median time to it."""
    sys.path.insert(0, os.path.join(ROOT, "benchmarks"))
    try:
        import slow_network
    finally:
        sys.path.remove(os.path.join(ROOT, "benchmarks"))
    from gossip.policies import make
    configs = slow_network.configurations(4, 16)
    assert len({label for label, _, _ in configs}) == 6
    for label, name, options in configs:
        policy = make(name, **options)
        assert getattr(policy, "period", 1) == options.get("period", 1), label
    rows = [{"config": "a", "time_to_target": t, "train_seconds": 1.0, "accuracy": 0.9,
             "sent_per_peer": 10} for t in (1.0, None, 3.0)]
    assert slow_network._median(rows, "a")["time_to_target"] is None
    assert slow_network._median(rows[::2], "a")["time_to_target"] == 2.0


def test_memory_check_names_the_need_and_what_is_available():
    from gossip.bench import check_memory
    check_memory("allreduce", 4, [64 << 20], available=1 << 30)   # 768 MiB of 1 GiB: fits
    with pytest.raises(ValueError, match=r"allreduce of 100 GiB with 4 peers needs about "
                                         r"1200.0 GiB .* 8.0 GiB available"):
        check_memory("allreduce", 4, [4096, 100 << 30], available=8 << 30)


def test_what_if_script_runs_every_policy_on_every_network_small(tmp_path):
    """benchmarks/what_if.py end to end at toy sizes: a table per (peers, network), the five
    policies in each, synchronous the unit of the ratio, and the JSON rows."""
    rows = tmp_path / "what_if.json"
    out = subprocess.run([sys.executable, os.path.join(ROOT, "benchmarks", "what_if.py"),
                          "--peers", "4", "--steps", "3", "--json", str(rows)],
                         capture_output=True, text=True, timeout=280, cwd=ROOT)
    assert out.returncode == 0, out.stdout + out.stderr
    runs = json.loads(rows.read_text())["runs"]
    assert [(r["link"], r["label"]) for r in runs] == [
        (link, label) for link in ("100mbit,20ms", "10gbit,1ms")
        for label in ("synchronous", "gossip", "push-sum", "diloco (H=10)", "asynchronous")]
    assert all(r["peers"] == 4 and r["simulated_seconds"] > 0 for r in runs)
    assert [r["ratio_to_sync"] for r in runs if r["label"] == "synchronous"] == [1.0, 1.0]
    # The allreduce pays more latency per step than one exchange with the neighbours.
    slow = {r["label"]: r for r in runs if r["link"] == "100mbit,20ms"}
    assert slow["gossip"]["simulated_seconds"] < slow["synchronous"]["simulated_seconds"]
