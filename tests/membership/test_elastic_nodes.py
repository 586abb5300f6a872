"""`gossip run --nnodes MIN:MAX`: nodes beyond MIN join the running job, up to MAX.

Two launchers on this machine stand for two nodes (their own processes, the same rendezvous
address): real processes, real sockets, the launcher's own environment for its peers.
"""
from __future__ import annotations

import os
import subprocess
import sys

import pytest

from gossip.launch.supervisor import free_port
from gossip.testing import wait_until

# Processes the tests start beside their groups (joiners, restarted members, launchers) must
# hold the group's key: every test here gets one (tests/conftest.py's group_key).
pytestmark = pytest.mark.usefixtures("group_key")

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
WORKERS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "workers")
TRAIN = os.path.join(WORKERS, "nnodes_train.py")
BOUNDED = os.path.join(WORKERS, "nnodes_bounded.py")


def _env() -> dict:
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("GOSSIP_", "RANK", "WORLD_SIZE", "MASTER_", "SLURM_", "OMPI_"))
           or k == "GOSSIP_KEY"}   # the group's key (group_key): these processes join it
    env["PYTHONPATH"] = REPO + os.pathsep + env.get("PYTHONPATH", "")
    return env


def _node(script, node_rank, port, nnodes, nprocs, *args):
    return subprocess.Popen(
        [sys.executable, "-m", "gossip", "run", "--nnodes", nnodes, "--node-rank",
         str(node_rank), "--master-addr", "127.0.0.1", "--master-port", str(port), "-n",
         str(nprocs), "--timeout", "30", script, *args],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=_env())


def _done(out):
    return sorted(line.split("DONE", 1)[1].split() for line in out.splitlines()
                  if "DONE" in line)


def test_a_node_beyond_min_joins_the_running_job_and_one_beyond_max_is_refused(tmp_path):
    script, started = TRAIN, str(tmp_path / "started")
    port = free_port()
    # A node rank past MAX is a bad argument, before anything starts.
    bad = subprocess.run([sys.executable, "-m", "gossip", "run", "--nnodes", "1:2",
                          "--node-rank", "2", "--master-addr", "127.0.0.1", script],
                         capture_output=True, text=True, env=_env(), timeout=60)
    assert bad.returncode == 2 and "--node-rank 2 is outside 0..1 (--nnodes 1:2)" in bad.stderr

    first = _node(script, 0, port, "1:2", 2, "4", started)
    try:
        wait_until(lambda: os.path.exists(started) or first.poll() is not None, 90,
                   what="the first node's peers training")
        assert first.poll() is None, first.communicate()[0]
        second = _node(script, 1, port, "1:2", 2, "4", started)
        out2, _ = second.communicate(timeout=150)
        out1, _ = first.communicate(timeout=150)
    finally:
        for p in (first,):
            if p.poll() is None:
                p.kill()
    assert first.returncode == 0 and second.returncode == 0, out1 + out2
    rows = _done(out1) + _done(out2)
    assert sorted(r[0] for r in rows) == ["0", "1", "2", "3"], out1 + out2   # every slot ran
    assert sorted(r[1] for r in rows) == ["0", "1", "2", "3"]   # dense ranks of the view
    assert {r[2] for r in rows} == {"4"}                        # 2 nodes x 2 peers
    assert len({(r[3], r[4]) for r in rows}) == 1               # one step, one x: replicas
    assert {r[5] for r in rows} == {"0.0"}


def test_a_joiner_past_the_jobs_bound_is_refused_naming_it(tmp_path):
    script, full, stop = BOUNDED, str(tmp_path / "full"), str(tmp_path / "stop")
    port = free_port()
    nodes = [_node(script, 0, port, "1:2", 1, full, stop)]
    try:
        nodes.append(_node(script, 1, port, "1:2", 1, full, stop))   # joins: 2 = MAX peers
        wait_until(lambda: os.path.exists(full) or any(p.poll() is not None for p in nodes),
                   120, what="the second node joined")
        assert all(p.poll() is None for p in nodes)
        env = dict(_env(), GOSSIP_JOIN="1", GOSSIP_RENDEZVOUS=f"127.0.0.1:{port}",
                   GOSSIP_MEMBER_NAME="extra", GOSSIP_JOB_ID=f"run-127.0.0.1-{port}")
        extra = subprocess.run([sys.executable, "-c", "import gossip; gossip.init(timeout=10)"],
                               capture_output=True, text=True, env=env, timeout=60)
    finally:
        open(stop, "w").close()
        outs = [p.communicate(timeout=120)[0] for p in nodes]
    assert extra.returncode != 0
    assert "the job has its most members already (2" in extra.stderr, extra.stderr[-2000:]
    assert [p.returncode for p in nodes] == [0, 0], outs
    rows = _done(outs[0]) + _done(outs[1])
    assert [r[2] for r in rows] == ["2", "2"], outs   # the group went on as it was
