"""`gossip status` on a running `gossip run` job: who waits on whom and where the rank they
wait on is in its own code, stacks on request, JSON, the straggler; refusals of another job
and another key; and the flight recorder a peer writes on SIGUSR1 and on a timeout.
tests/launch/workers/stalled_job.py is the job: its last rank stalls in its own function
(``stall_in_user_code``) at step 5 until the test lets it go."""
from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from gossip.status import job_status
from gossip.status.waits import straggler, waits_for
from launched import WAIT_S, Launcher, launcher_env

JOB = Path(__file__).parent / "workers" / "stalled_job.py"


def _see_it(err: str) -> dict[str, str]:
    """The banner's `gossip status` command's address, job and key."""
    line = re.search(r"see it: gossip status (\S+) --job (\S+) --key (\S+)", err)
    assert line, err
    return {"address": line.group(1), "job": line.group(2), "key": line.group(3)}


def _stalled(run: Launcher, n: int) -> dict[str, str]:
    """Wait until every member runs and the first ones wait in step 5's allreduce."""
    run.wait_for(lambda: run.out.count("RUNNING") >= n, f"{n} peers running")
    where = run.wait_for(lambda: _see_it(run.err) if "see it:" in run.err else None,
                         "the banner")

    def all_waiting():
        job = job_status(where["address"], job_id=where["job"], key=where["key"])
        waiting = {w.rank for w in job.waits.edges}
        return job if waiting == set(range(n - 1)) else None
    return {**where, "job_status": run.wait_for(all_waiting, "the others waiting")}


def _go(folder: Path) -> None:
    (folder / "go").write_text("")


@pytest.mark.timeout(180)
def test_status_names_the_rank_the_others_wait_on_and_its_function(
        tmp_path: Path, launcher: list[Launcher]) -> None:
    run = Launcher(tmp_path, "-n", "3", str(JOB), str(tmp_path))
    launcher.append(run)
    seen = _stalled(run, 3)
    job = seen["job_status"]
    # Every member answered, each with its identity; the two first wait on rank 2, which has
    # not begun the call, and the root is rank 2 in the job's own function.
    assert sorted(job.members) == [0, 1, 2] and not job.errors
    pids = {m["pid"] for m in job.members.values()}
    assert len(pids) == 3
    assert all(m["name"] == f"rank{r}" for r, m in job.members.items())
    assert {(w.rank, w.on, w.reason) for w in job.waits.edges} == \
        {(0, 2, "not begun"), (1, 2, "not begun")}
    assert list(job.waits.roots) == [2]
    assert "stall_in_user_code" in job.waits.roots[2] and "stalled_job.py" in job.waits.roots[2]
    assert all(w.op.startswith("allreduce") for w in job.waits.edges)
    assert job.members[2]["running"] == []
    assert job.members[0]["steps"] == 5 and job.members[2]["steps"] == 5
    # The straggler sums every wait so far: a peer slow to its first steps (a loaded machine)
    # leads until the others have waited on the stalled rank 2 longer than on it.
    def rank_2_leads():
        now = job_status(seen["address"], job_id=seen["job"], key=seen["key"])
        return now if now.straggler is not None and now.straggler["rank"] == 2 else None
    later = run.wait_for(rank_2_leads, "rank 2 to be the straggler")
    assert later.straggler["share"] > 0.5, later.straggler

    # The command line: the table and its lines, --stacks with the function in rank 2's
    # stacks, --json that parses; exit 0 (every member answered).
    cmd = [sys.executable, "-m", "gossip", "status", seen["address"], "--job", seen["job"],
           "--key", seen["key"]]
    text = subprocess.run(cmd + ["--stacks"], capture_output=True, text=True,
                          timeout=WAIT_S, env=launcher_env(), check=False)
    assert text.returncode == 0, text.stderr
    assert "root: rank 2 holds the others up: in its own code:" in text.stdout
    assert "rank 0 waiting on rank 2 (not begun) in allreduce" in text.stdout
    assert "straggler: rank 2" in text.stdout
    stacks = text.stdout.split("--- rank 2 stacks ---", 1)[1].split("--- rank", 1)[0]
    assert "stall_in_user_code" in stacks
    as_json = subprocess.run(cmd + ["--json"], capture_output=True, text=True,
                             timeout=WAIT_S, env=launcher_env(), check=False)
    assert as_json.returncode == 0, as_json.stderr
    parsed = json.loads(as_json.stdout)
    assert parsed["waits"]["roots"].keys() == {"2"} and parsed["straggler"]["rank"] == 2
    assert parsed["members"]["1"]["calls"][-1]["state"] == "running"

    # Another job id is refused, naming the job; another key is not answered at all.
    refused = subprocess.run(cmd[:5] + ["--job", "another", "--key", seen["key"]],
                             capture_output=True, text=True, timeout=WAIT_S,
                             env=launcher_env(), check=False)
    assert refused.returncode == 3 and seen["job"] in refused.stderr, refused.stderr
    other_key = tmp_path / "other.key"
    subprocess.run([sys.executable, "-m", "gossip", "keygen", str(other_key)], check=True,
                   env=launcher_env(), timeout=WAIT_S, capture_output=True)
    unkeyed = subprocess.run(cmd[:5] + ["--job", seen["job"], "--key", str(other_key),
                                        "--timeout", "1"],
                             capture_output=True, text=True, timeout=WAIT_S,
                             env=launcher_env(), check=False)
    assert unkeyed.returncode == 3 and "no answer" in unkeyed.stderr, unkeyed.stderr

    _go(tmp_path)
    assert run.finish() == 0, run.err
    assert run.out.count("DONE") == 3


@pytest.mark.timeout(180)
def test_sigusr1_writes_the_flight_recorder_and_the_job_goes_on(
        tmp_path: Path, launcher: list[Launcher]) -> None:
    run = Launcher(tmp_path, "-n", "2", str(JOB), str(tmp_path))
    launcher.append(run)
    seen = _stalled(run, 2)
    waiting = seen["job_status"].members[0]["pid"]
    os.kill(waiting, signal.SIGUSR1)
    run.wait_for(lambda: "flight recorder: the last" in run.err, "rank 0's flight recorder")
    recorder = run.err.split("flight recorder: the last", 1)[1]
    assert re.search(r"allreduce\(\S+\) channel \d+ seq \d+ peers \[1\] 1024 B running for",
                     recorder), run.err
    assert re.search(r"done in [\d.]+ ms", recorder), run.err
    _go(tmp_path)
    assert run.finish() == 0, run.err
    assert run.out.count("DONE") == 2


@pytest.mark.timeout(120)
def test_a_timeout_writes_the_flight_recorder(tmp_path: Path) -> None:
    script = tmp_path / "late.py"
    script.write_text(
        "import os, numpy as np, gossip\n"
        "from gossip.testing import wait_until\n"
        "peer = gossip.init(timeout=3)\n"
        "x = np.ones(16, np.float32)\n"
        "peer.allreduce(x)\n"
        "if peer.rank == 1:\n"
        f"    wait_until(lambda: os.path.exists({str(tmp_path / 'go')!r}), 60, what='go')\n"
        "try:\n"
        "    peer.allreduce(x)\n"
        "except Exception as exc:\n"
        "    print('RAISED', type(exc).__name__, flush=True)\n"
        f"    open({str(tmp_path / 'go')!r}, 'w').close()\n"
        "peer.close()\n")
    proc = subprocess.run([sys.executable, "-m", "gossip.run", "-n", "2", str(script)],
                          capture_output=True, text=True, timeout=WAIT_S * 2,
                          env=launcher_env(), check=False)
    assert "[rank 0] RAISED OperationTimeout" in proc.stdout, proc.stdout + proc.stderr
    rank0 = "\n".join(line for line in proc.stderr.splitlines() if line.startswith("[rank 0]"))
    assert "rank 0: flight recorder: the last 2 calls (1 running)" in rank0, proc.stderr
    assert re.search(r"#2 allreduce\(\S+\) channel 0 seq 1 peers \[1\] 64 B running for", rank0)


def test_waits_for_follows_the_waits_to_their_root_and_the_straggler_sums_them() -> None:
    # Rank 0 waits on 1, which is in the call and waits on 2, which has not begun: the root is
    # 2. Rank 3 did not answer; rank 1's waits on it are "no answer".
    call = {"op": "allreduce(sum,ring)", "channel": 0, "seq": 7, "waited": 2.0}
    members = {
        0: {"running": [dict(call, peers=[1])], "begun": {"0": 7}, "waited": {"1": 0.5}},
        1: {"running": [dict(call, peers=[2, 3])], "begun": {"0": 7}, "waited": {"2": 4.0}},
        2: {"running": [], "begun": {"0": 6}, "waited": {}, "where": "train.py:9 in load"},
        3: None,
    }
    graph = waits_for(members)
    assert {(w.rank, w.on, w.reason) for w in graph.edges} == \
        {(1, 2, "not begun"), (1, 3, "no answer")}
    assert graph.roots[2] == "in its own code: train.py:9 in load"
    assert graph.roots[3].startswith("no answer")
    slow = straggler(members, graph)
    assert slow is not None and slow["rank"] == 2 and slow["seconds"] == pytest.approx(6.0)
    assert slow["share"] == pytest.approx(6.0 / 8.5)
    assert straggler({0: {"waited": {}}, 1: None}) is None
