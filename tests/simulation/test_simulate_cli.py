"""`gossip simulate mixing`, run as a real subprocess like a user would."""
from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import pytest

from gossip.cli.simulate_command import shown_rounds


def _gossip(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "gossip", *args], capture_output=True,
                          text=True, timeout=120)


def test_a_ring_prints_its_distance_beside_the_slem(tmp_path: Path) -> None:
    out = tmp_path / "trace.json"
    proc = _gossip("simulate", "mixing", "ring", "-n", "64", "--rounds", "2000",
                   "--json", str(out))
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert lines[0].startswith("Ring(64): 64 peers, gossip rounds, SLEM 0.99678")
    rows = {int(line.split()[0]): float(line.split()[1]) for line in lines
            if len(line.split()) == 3 and line.split()[0].isdigit()}
    assert sorted(rows) == shown_rounds(2000)
    assert rows[2000] < rows[100] < rows[1] < rows[0]
    record = json.loads(out.read_text())
    assert record["rounds"] == 2000 and len(record["distance"]) == 2001
    assert record["distance"][0] == pytest.approx(rows[0], rel=1e-5)
    # Past the transient, the ring of 64 decays at its SLEM (the measured rate is printed).
    assert math.log(record["measured_rate"]) / math.log(record["spectral_rate"]) == \
        pytest.approx(1.0, abs=0.05)
    assert "measured rate per round over rounds 1000-2000" in proc.stdout


def test_directed_graphs_take_push_sum_and_a_plot_is_written(tmp_path: Path) -> None:
    pytest.importorskip("matplotlib")
    png = tmp_path / "decay.png"
    proc = _gossip("simulate", "mixing", "one-peer-exponential", "-n", "16", "--rounds", "8",
                   "--plot", str(png))
    assert proc.returncode == 0, proc.stderr
    assert "push-sum rounds" in proc.stdout
    assert "fell below 1e-9 of its start at once" in proc.stdout   # exact after 4 rounds
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_bad_input_is_one_line_and_exit_2() -> None:
    proc = _gossip("simulate", "mixing", "random:p=0.3,weights=uniform", "-n", "12",
                   "--rule", "push-sum")
    assert proc.returncode == 2
    assert proc.stderr.startswith("gossip simulate: error: simulate_mixing(rule='push-sum')")
    assert "not column-stochastic" in proc.stderr and "Traceback" not in proc.stderr
    proc = _gossip("simulate", "mixing", "ring", "-n", "8", "--rounds", "-3")
    assert proc.returncode == 2 and "rounds must be an int >= 0" in proc.stderr
    proc = _gossip("simulate")
    assert proc.returncode == 2 and "mixing" in proc.stdout


def test_shown_rounds() -> None:
    assert shown_rounds(0) == [0]
    assert shown_rounds(7) == [0, 1, 2, 5, 7]
    assert shown_rounds(1000) == [0, 1, 2, 5, 10, 20, 50, 100, 200, 500, 1000]


def test_train_measures_the_step_jitters_it_and_plots_the_loss(tmp_path: Path) -> None:
    pytest.importorskip("torch")
    pytest.importorskip("matplotlib")
    png, out = tmp_path / "loss.png", tmp_path / "runs.json"
    proc = _gossip("simulate", "train", "--policy", "synchronous,gossip,push-sum", "-n", "4",
                   "--steps", "6", "--link", "1gbit,5ms", "--step-seconds", "measured",
                   "--step-jitter", "0.5", "--overlap", "--plot", str(png), "--json", str(out))
    assert proc.returncode == 0, proc.stderr
    measured = float(proc.stdout.split("a step of the model takes ")[1].split(" ms")[0])
    assert 0 < measured < 1000
    assert "(jitter 0.5)" in proc.stdout
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    runs = json.loads(out.read_text())["runs"]
    assert [r["spec"]["policy"] for r in runs] == ["synchronous", "gossip", "push-sum"]
    # --overlap is push-sum's alone, and names its row.
    assert [r["spec"]["policy_options"] for r in runs] == [{}, {}, {"overlap": True}]
    assert [r["label"] for r in runs] == ["synchronous", "gossip", "push-sum+overlap"]
    assert "\npush-sum+overlap " in proc.stdout
    assert runs[0]["spec"]["step_jitter"] == 0.5
    proc = _gossip("simulate", "train", "--step-seconds", "fast")
    assert proc.returncode == 2 and "--step-seconds 'fast'" in proc.stderr


def test_train_takes_deaths_from_a_churn_trace(tmp_path: Path) -> None:
    pytest.importorskip("torch")
    trace, out = tmp_path / "churn.json", tmp_path / "runs.json"
    trace.write_text(json.dumps({"deaths": [[2, 0.1], [5, 0.2]]}))
    proc = _gossip("simulate", "train", "--policy", "gossip", "-n", "8", "--steps", "30",
                   "--link", "1gbit,5ms", "--churn", str(trace), "--detect", "0.2",
                   "--json", str(out))
    assert proc.returncode == 0, proc.stderr
    (run,) = json.loads(out.read_text())["runs"]
    assert run["died"] == [2, 5] and run["spec"]["deaths"] == [[2, 0.1], [5, 0.2]]
    assert run["restarted"] == []
    # Restarts in the trace: rank 5's new process asks in at 0.4 s.
    trace.write_text(json.dumps({"deaths": [[2, 0.1], [5, 0.2]], "restarts": [[5, 0.4]]}))
    proc = _gossip("simulate", "train", "--policy", "gossip", "-n", "8", "--steps", "60",
                   "--link", "1gbit,5ms", "--churn", str(trace), "--detect", "0.2",
                   "--json", str(out))
    assert proc.returncode == 0, proc.stderr
    (run,) = json.loads(out.read_text())["runs"]
    assert run["died"] == [2, 5] and run["restarted"] == [5]
    assert run["spec"]["restarts"] == [[5, 0.4]]
    assert sorted(int(r) for r in run["bytes_sent"]) == [0, 1, 3, 4, 5, 6, 7]
    # Leaves and joins in the trace too.
    trace.write_text(json.dumps({"leaves": [[1, 0.1]], "joins": [0.2]}))
    proc = _gossip("simulate", "train", "--policy", "push-sum", "-n", "4", "--steps", "40",
                   "--link", "1gbit,5ms", "--churn", str(trace), "--json", str(out))
    assert proc.returncode == 0, proc.stderr
    (run,) = json.loads(out.read_text())["runs"]
    assert run["left"] == [1] and run["joined"] == [4] and run["died"] == []
    assert sorted(int(r) for r in run["bytes_sent"]) == [0, 2, 3, 4]
    trace.write_text(json.dumps({"deaths": [[2, "soon"]]}))
    proc = _gossip("simulate", "train", "--churn", str(trace))
    assert proc.returncode == 2 and f"--churn {trace}: expected" in proc.stderr
    proc = _gossip("simulate", "train", "--deaths", "1@0.5", "--restarts", "1@soon")
    assert proc.returncode == 2 and "--restarts '1@soon': expected" in proc.stderr


def test_train_elastic_lets_the_lockstep_policies_survive_a_death(tmp_path: Path) -> None:
    pytest.importorskip("torch")
    out = tmp_path / "runs.json"
    args = ("simulate", "train", "--policy", "synchronous,local-sgd,gossip", "-n", "6",
            "--steps", "20", "--link", "1gbit,5ms", "--deaths", "4@0.05", "--detect", "0.1")
    proc = _gossip(*args)
    assert proc.returncode == 2 and "synchronous needs elastic=True" in proc.stderr \
        and "--elastic" in proc.stderr, proc.stderr
    proc = _gossip(*args, "--elastic", "--json", str(out))
    assert proc.returncode == 0, proc.stderr
    runs = {r["spec"]["policy"]: r for r in json.loads(out.read_text())["runs"]}
    assert [runs[p]["spec"]["policy_options"] for p in runs] == [
        {"elastic": True}, {"elastic": True}, {}]
    assert all(r["died"] == [4] for r in runs.values())
    assert runs["synchronous"]["consensus"] == 0.0 and runs["local-sgd"]["consensus"] == 0.0


def test_train_runs_each_policy_that_takes_a_codec_once_per_codec(tmp_path: Path) -> None:
    out = tmp_path / "runs.json"
    proc = _gossip("simulate", "train", "--policy", "gossip,push-sum", "--compression",
                   "none,int8", "-n", "4", "--steps", "5", "--link", "100mbit,20ms",
                   "--json", str(out))
    assert proc.returncode == 0, proc.stderr
    assert "push-sum takes no codec: it runs without compression" in proc.stdout
    runs = {r["label"]: r for r in json.loads(out.read_text())["runs"]}
    assert sorted(runs) == ["gossip", "gossip+int8", "push-sum"]
    assert runs["gossip+int8"]["spec"]["policy_options"] == {"compression": "int8"}
    # int8 sends a byte an element and a scale a block: about a quarter of float32's bytes.
    ratio = runs["gossip+int8"]["bytes_per_peer"] / runs["gossip"]["bytes_per_peer"]
    assert 0.25 < ratio < 0.3
    proc = _gossip("simulate", "train", "--policy", "gossip", "--compression", "zip")
    assert proc.returncode == 2 and "--compression 'zip'" in proc.stderr
    proc = _gossip("simulate", "train", "--policy", "gossip", "--compression", "topk:0.1")
    assert proc.returncode == 2 and "Gossip sends the parameters themselves" in proc.stderr
    assert "accuracy" not in proc.stdout   # (refused before any run)
    proc = _gossip("simulate", "train", "--policy", "push-sum", "--compression", "int8")
    assert proc.returncode == 2 and "none of the policies ['push-sum'] takes a codec" in \
        proc.stderr
