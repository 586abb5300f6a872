"""The torch.distributed backend "gossip" (gossip/torch_backend.py) under a real torchrun:
every c10d collective it serves checked against c10d's documented results, DDP training
equal to the same steps done by hand, and a rank that dies named by PeerLost on the others
through torch's own calls (tests/launcher_scripts/c10d_backend.py does the checking)."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from gossip.testing import free_port

pytest.importorskip("torch")

REPO = Path(__file__).resolve().parents[1]
SCRIPT = REPO / "tests" / "launcher_scripts" / "c10d_backend.py"
CHECKS = ["init", "all_reduce", "broadcast", "all_gather", "reduce_scatter", "async",
          "send_recv", "refused", "new_group", "ddp"]


def _torchrun(n: int, **env: str) -> subprocess.CompletedProcess:
    full = dict(os.environ, **env)
    full["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), full.get("PYTHONPATH")]))
    full = {k: v for k, v in full.items() if not k.startswith("GOSSIP_")}
    return subprocess.run([sys.executable, "-m", "torch.distributed.run", "--nproc-per-node",
                           str(n), "--master-port", str(free_port()), str(SCRIPT)],
                          capture_output=True, text=True, timeout=240, env=full)


def _oks(out: str) -> list[str]:
    return [line.split()[1] for line in out.splitlines() if line.startswith("OK ")]


@pytest.mark.timeout(300)
def test_c10d_collectives_ddp_and_a_lost_rank_under_torchrun() -> None:
    # Rank 2 leaves without a word after the checks; the others' next all_reduce raises
    # gossip's PeerLost naming it, through torch's own call, then they shut down cleanly.
    proc = _torchrun(3, C10D_VICTIM="2")
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-6000:]
    oks = _oks(proc.stdout)
    for check in CHECKS:
        assert oks.count(check) == 3, (check, proc.stdout[-3000:])
    lost = [line for line in proc.stdout.splitlines() if line.startswith("OK peer_lost")]
    assert len(lost) == 2, proc.stdout[-3000:]
    assert all("PeerLost" in line and "rank 2" in line for line in lost), lost
    assert oks.count("destroyed") == 2, proc.stdout[-3000:]
