"""Ray (issue #40, item 1), on a real Ray cluster of two nodes started by the test
(tests/integrations/workers/ray_job.py): Ray Train's TorchTrainer runs DDP code on the
"gossip" process group with a GossipAverager, and ``gossip.ray.run`` runs four gossip peers as
Ray actors over both nodes, one of them SIGKILLed by the test mid-training: Ray starts it
again, it rejoins the running job, and every peer finishes; with ``num_workers=(2, 4)`` two
peers form a job and two more join it when a node with room is added to the cluster."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from helpers import sigkill_when_written

pytest.importorskip("ray")

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "tests" / "integrations" / "workers" / "ray_job.py"
WAIT_S = 480


@pytest.mark.timeout(600)
def test_ray_train_backend_and_a_killed_actor_that_rejoins(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("GOSSIP_", "RAY_")) and k != "TORCH_DEVICE_BACKEND_AUTOLOAD"}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")]))
    victim = tmp_path / "victim.pid"
    job = subprocess.Popen([sys.executable, str(SCRIPT), str(tmp_path)], stdout=subprocess.PIPE,
                           stderr=subprocess.STDOUT, text=True, env=env, cwd=tmp_path,
                           start_new_session=True)
    out = sigkill_when_written(job, victim, WAIT_S, "rank 1 at its kill step")
    assert job.returncode == 0, out[-8000:]
    trainer = json.loads(out.split("TRAINER ", 1)[1].splitlines()[0])
    print(f"\nTorchTrainer: {trainer}")
    assert trainer["backend"] == "gossip" and trainer["world"] == 4, trainer
    assert trainer["topology"].startswith("Ring(4"), trainer
    assert 0 < trainer["consensus"] < 0.5, trainer        # parameters gossiped, not diverged
    assert max(trainer["losses"]) < 1.0, trainer          # it learnt y = sum(x)
    results = json.loads(out.split("RAYRUN ", 1)[1].splitlines()[0])
    print(f"gossip.ray.run: {results}")
    assert [r["slot"] for r in results] == [0, 1, 2, 3], results
    assert len({r["node"] for r in results}) == 2, results          # both nodes
    assert results[1]["incarnation"] > 0, results                    # Ray restarted rank 1 ...
    assert all(r["incarnation"] == 0 for r in results if r["slot"] != 1), results   # alone
    assert all(r["saw_restart"] for r in results), results          # ... and it rejoined
    assert all(r["loss"] < 1.0 for r in results), results
    # Elastic worker counts: 2 peers formed the job, 2 joined it once a node had room.
    grown = json.loads(out.split("ELASTIC ", 1)[1].splitlines()[0])
    print(f"gossip.ray.run, num_workers=(2, 4): {grown}")
    assert [r and r["slot"] for r in grown] == [0, 1, 2, 3], grown      # every joiner ran
    assert [r["joined"] for r in grown] == [False, False, True, True], grown
    assert all(r["largest_view"] == 4 for r in grown), grown           # the group grew to 4
    assert grown[2]["node"] == grown[3]["node"] != grown[0]["node"], grown   # the new node
    assert all(r["loss"] < 1.0 for r in grown), grown
