"""Lightning (issue #40, item 2): a real ``Trainer.fit`` with 4 CPU processes that Lightning
starts itself, on the digits (tests/integrations/workers/lightning_fit.py):
``DDPStrategy(process_group_backend="gossip")`` trains exactly as over Gloo, and
``GossipStrategy`` trains with the gossip, local-SGD, DiLoCo and asynchronous policies."""
from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("lightning")

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "tests" / "integrations" / "workers" / "lightning_fit.py"


def _fit(strategy: str, cwd: Path) -> dict[str, Any]:
    env = {k: v for k, v in os.environ.items()
           if not k.startswith("GOSSIP_") and k != "TORCH_DEVICE_BACKEND_AUTOLOAD"}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), str(REPO / "tests"),
                                                     env.get("PYTHONPATH")]))
    proc = subprocess.run([sys.executable, str(SCRIPT), strategy], capture_output=True,
                          text=True, timeout=300, env=env, cwd=cwd)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-6000:]
    found = re.search(rf"RESULT {re.escape(strategy)} mean=([\d.]+) worst=([\d.]+) "
                      r"consensus=([\d.]+) backend=(\S+) loss=([\d.]+)", proc.stdout)
    assert found, proc.stdout[-3000:] + proc.stderr[-3000:]
    mean, worst, consensus = (float(v) for v in found.groups()[:3])
    return {"mean": mean, "worst": worst, "consensus": consensus, "backend": found.group(4),
            "loss": float(found.group(5))}


@pytest.mark.timeout(900)
def test_lightning_ddp_over_gossip_and_the_gossip_strategy_fit(tmp_path) -> None:
    gloo = _fit("ddp-gloo", tmp_path)
    ddp = _fit("ddp-gossip", tmp_path)
    print(f"\nDDPStrategy gloo {gloo}\nDDPStrategy gossip {ddp}")
    assert gloo["backend"] == "gloo" and ddp["backend"] == "gossip", (gloo, ddp)
    # DDP over gossip is DDP: one replica, the same training as over Gloo (the sums of 4
    # float32 gradients may round differently, so the losses to 1e-3, accuracy to 0.5 pt).
    assert ddp["consensus"] < 1e-6, ddp
    assert abs(ddp["loss"] - gloo["loss"]) < 1e-3, (ddp, gloo)
    assert abs(ddp["mean"] - gloo["mean"]) <= 0.005, (ddp, gloo)
    for strategy in ("gossip", "gossip:local-sgd", "gossip:diloco", "gossip:asynchronous"):
        got = _fit(strategy, tmp_path)
        print(f"GossipStrategy {strategy} {got}")
        assert got["backend"] == "gossip", got
        # Decentralized: the replicas differ (no DDP wrapper) but are averaged enough to train.
        assert got["consensus"] > 0, got
        assert got["mean"] > 0.85 and got["worst"] > 0.75, got
        if strategy in ("gossip", "gossip:asynchronous", "gossip:local-sgd"):
            assert got["mean"] >= gloo["mean"] - 0.02, (got, gloo)
