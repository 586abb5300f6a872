"""`gossip demo --simulate` (issue #38, item 5): the story's scenarios in simulated time, run by
the simulator (the real policy classes as threads of one process on a virtual clock) as a user
runs the command (a subprocess). What it writes is deterministic: two runs give the same JSON,
byte for byte, whatever else the machine is doing."""
from __future__ import annotations

import json
import subprocess
import sys

import pytest

ARGS = ("--simulate", "--peers", "8", "--steps", "20")


def _demo(*args: str, timeout: float = 150) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "gossip", "demo", *args],
                          capture_output=True, text=True, timeout=timeout)


def test_two_simulated_stories_write_the_same_json(tmp_path):
    runs = []
    for name in ("a", "b"):
        proc = _demo(*ARGS, "--out", str(tmp_path / name))
        assert proc.returncode == 0, proc.stderr
        runs.append((tmp_path / name / "story-simulated.json").read_bytes())
    assert runs[0] == runs[1]
    story = json.loads(runs[0])
    assert [s["name"] for s in story["scenarios"]] == ["slow-network", "straggler", "non-iid",
                                                       "death"]
    death = {r["policy"]: r for r in story["scenarios"][-1]["rows"]}
    assert list(death) == ["synchronous", "local-sgd", "gossip", "push-sum", "asynchronous"]
    assert all(r["died"] == [4] and r["spec"]["deaths"] == [[4, 20 * 0.01 / 3]]
               for r in death.values())
    # The lockstep policies re-form the group (elastic) and stay one model.
    assert [death[p]["spec"]["policy_options"] for p in death] == [
        {"elastic": True}, {"elastic": True}, {}, {}, {}]
    assert death["synchronous"]["consensus"] == 0.0 and death["local-sgd"]["consensus"] == 0.0
    for scenario in story["scenarios"]:
        rows = {r["policy"]: r for r in scenario["rows"]}
        assert list(rows) == ["synchronous", "local-sgd", "gossip", "push-sum", "asynchronous"]
        assert scenario["wins"] in rows
        assert all(r["spec"]["peers"] == 8 and r["spec"]["steps"] == 20
                   and r["spec"]["link"] == "100mbit,50ms" for r in rows.values())
        # Synchronous averages every step: one model, in every scenario.
        assert rows["synchronous"]["consensus"] == 0.0
    by_name = {s["name"]: {r["policy"]: r for r in s["rows"]} for s in story["scenarios"]}
    # The straggler's 4x steps cost synchronous time; the WAN alone costs it an allreduce a
    # step, more than gossip's exchange with two neighbours.
    assert (by_name["straggler"]["synchronous"]["simulated_seconds"]
            > by_name["slow-network"]["synchronous"]["simulated_seconds"])
    assert (by_name["slow-network"]["gossip"]["simulated_seconds"]
            < by_name["slow-network"]["synchronous"]["simulated_seconds"])
    # Each peer's end (asynchronous's peers end apart; on this WAN its 106 ms round trip a
    # step hides even the straggler's 40 ms compute: tests/simulation/test_scheduler.py
    # shows the others ending first where compute dominates).
    ends = by_name["straggler"]["asynchronous"]["peer_seconds"]
    assert sorted(ends, key=int) == [str(r) for r in range(8)] and max(ends.values()) > 0
    # Non-iid shards pull a ring's peers apart; iid ones much less.
    assert (by_name["non-iid"]["gossip"]["consensus"]
            > by_name["slow-network"]["gossip"]["consensus"])


@pytest.mark.parametrize("extra, names", [
    (("--kill", "3@0.33"), "--kill"),
    (("--policy", "easgd"), "easgd not simulated"),
    (("--epochs", "3"), "--epochs"),
    (("--batch-size", "8", "--no-baseline", "--timeout", "60"),
     "drop --batch-size and --no-baseline and --timeout"),
])
def test_simulate_refuses_what_the_simulator_does_not_run(tmp_path, extra, names):
    proc = _demo("--simulate", "--peers", "4", *extra, "--out", str(tmp_path / "x"))
    assert proc.returncode == 2, proc
    assert names in proc.stderr and proc.stderr.count("\n") == 1, proc.stderr


def test_steps_without_simulate_is_refused(tmp_path):
    proc = _demo("--steps", "10", "--out", str(tmp_path / "x"))
    assert proc.returncode == 2 and "--steps is --simulate's" in proc.stderr, proc.stderr
