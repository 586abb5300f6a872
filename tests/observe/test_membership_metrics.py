"""The membership's counts in the metrics, from a real death and restart: the survivors count
the view changes, the member that left and the same name back with a higher incarnation."""
from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import numpy as np
from helpers import clean_env
from metrics_helpers import parse, series

from gossip.metrics import collect, render
from gossip.policies import Synchronous
from gossip.testing import spawn


def _scraped(peer, *names: str) -> dict[str, float | None]:
    """This peer's series of ``names``, from what a scrape of its metrics answers."""
    values = series(parse(render(collect(peer))))
    rank = (("rank", str(peer.rank)),)
    return {name: values.get((name, rank)) for name in names}


def _dies_once_and_restarts(peer, total: int):
    x = np.zeros(10)
    policy = Synchronous(elastic=True).attach(peer, [x])
    victim = peer.rank == 2 and os.environ.get("GOSSIP_INCARNATION", "0") == "0"
    while (policy.step < total or peer.world_size < 3) and policy.step < 100_000:
        x += 1.0
        if victim and policy.step == 10:
            os.kill(os.getpid(), signal.SIGKILL)
        policy.after_step()
        np.ones((64, 64)) @ np.ones((64, 64))   # a step's compute
    return _scraped(peer, "gossip_view", "gossip_members", "gossip_view_changes_total",
                    "gossip_members_joined_total", "gossip_members_left_total",
                    "gossip_member_restarts_total", "gossip_member_deaths_total")


def test_a_death_and_its_restart_are_counted_by_the_survivors() -> None:
    results = spawn(_dies_once_and_restarts, n=3, timeout=150, args=(40,), restarts={2: 1},
                    peer_timeout=30.0)
    for r in results[:2]:
        assert r["gossip_members"] == 3
        changes = r["gossip_view_changes_total"]
        assert changes == r["gossip_view"] and changes >= 1
        assert r["gossip_member_restarts_total"] == 1
        assert r["gossip_member_deaths_total"] == 1
        assert r["gossip_members_joined_total"] == 0
        # Left and came back in two views, or replaced in one.
        assert r["gossip_members_left_total"] in (0, 1)


def _leaves_at_once(peer, total: int):
    x = np.zeros(10)
    policy = Synchronous().attach(peer, [x])
    leaver = peer.rank == 1
    while policy.step < total:
        if leaver and policy.step == 10:
            peer.leave()
            return None
        x += 1.0
        policy.after_step()
    return _scraped(peer, "gossip_members", "gossip_members_left_total",
                    "gossip_member_deaths_total", "gossip_member_restarts_total")


def test_a_member_that_leaves_is_counted_as_left_not_dead() -> None:
    # The view leaving it out may reach a survivor before its goodbye does: the commit says
    # it asked to leave (Switch.left), so no survivor counts a death.
    results = spawn(_leaves_at_once, n=3, timeout=150, args=(30,), peer_timeout=30.0)
    assert results[1] is None
    for r in (results[0], results[2]):
        assert r == {"gossip_members": 2, "gossip_members_left_total": 1,
                     "gossip_member_deaths_total": 0, "gossip_member_restarts_total": 0}, r


def test_under_gossip_run_max_restarts_the_metrics_and_the_default_log_say_it_once() -> None:
    """A real SIGKILL and `gossip run --max-restarts 1`: each survivor's metrics count one
    death and one restart and a view that moved; the default log has the launcher's one
    restart line and, per survivor, one line for the loss."""
    job = Path(__file__).parents[1] / "launch" / "workers" / "restarted_job.py"
    run = subprocess.run([sys.executable, "-m", "gossip.run", "-n", "3", "--max-restarts", "1",
                          str(job)], capture_output=True, text=True, timeout=240,
                         env={k: v for k, v in clean_env().items() if k != "GOSSIP_KEY"},
                         check=False)
    assert run.returncode == 0, run.stdout + run.stderr
    metrics = {int(m.group(1)): json.loads(m.group(2)) for m in
               re.finditer(r"^\[rank (\d)\] METRICS (.*)$", run.stdout, re.M)}
    assert sorted(metrics) == [0, 1, 2], run.stdout
    for survivor in (0, 2):
        m = metrics[survivor]
        assert m["gossip_member_deaths_total"] == 1, m
        assert m["gossip_member_restarts_total"] == 1, m
        assert m["gossip_view"] >= 1 and m["gossip_view_changes_total"] == m["gossip_view"], m
        lines = [line for line in run.stderr.splitlines()
                 if line.startswith(f"[rank {survivor}]") and "gossip.events" in line]
        assert sum("lost rank 1:" in line for line in lines) == 1, run.stderr
        assert any("rank1#1" in line for line in lines), run.stderr
    assert run.stderr.count("starting it again (restart 1 of 1)") == 1, run.stderr
