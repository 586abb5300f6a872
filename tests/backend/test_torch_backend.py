"""The torch.distributed backend "gossip" (gossip/torch_backend/process_group.py) and the DDP hooks
(gossip/torch_backend/ddp_hooks.py) under a real torchrun:
every c10d collective it serves checked against c10d's documented results, DDP training
equal to the same steps done by hand, and a rank that dies named by PeerLost on the others
through torch's own calls (tests/launch/workers/c10d_backend.py does the checking)."""
from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from gossip.testing import free_port

pytest.importorskip("torch")

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "tests" / "backend" / "workers" / "c10d_backend.py"
HOOKS = REPO / "tests" / "backend" / "workers" / "ddp_hooks.py"
CHECKS = ["init", "all_reduce", "broadcast", "all_gather", "reduce_scatter",
          "reduce_gather_scatter", "all_to_all", "reduce_scatter_v", "async",
          "send_recv", "tags", "refused", "new_group", "then_collective", "ddp"]


def _torchrun(n: int, script: Path = SCRIPT, **env: str) -> subprocess.CompletedProcess:
    full = dict(os.environ, **env)
    full["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), full.get("PYTHONPATH")]))
    full = {k: v for k, v in full.items() if not k.startswith("GOSSIP_")}
    return subprocess.run([sys.executable, "-m", "torch.distributed.run", "--nproc-per-node",
                           str(n), "--master-port", str(free_port()), str(script)],
                          capture_output=True, text=True, timeout=240, env=full)


def _oks(out: str) -> list[str]:
    # (The ranks share torchrun's stdout: their lines may run into each other.)
    return re.findall(r"OK ([A-Za-z_]+?)(?=OK |\s|$)", out)


@pytest.mark.timeout(300)
def test_c10d_collectives_ddp_and_a_lost_rank_under_torchrun() -> None:
    # Rank 2 leaves without a word after the checks; the others' next all_reduce raises
    # gossip's PeerLost naming it, through torch's own call, then they shut down cleanly.
    proc = _torchrun(3, C10D_VICTIM="2")
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-6000:]
    oks = _oks(proc.stdout)
    for check in CHECKS:
        assert oks.count(check) == 3, (check, proc.stdout[-3000:])
    lost = re.findall(r"OK peer_lost (\w+) rank \d: [^\n]*?rank 2 at", proc.stdout)
    assert lost == ["PeerLost", "PeerLost"], proc.stdout[-3000:]
    assert oks.count("destroyed") == 2, proc.stdout[-3000:]


@pytest.mark.timeout(300)
@pytest.mark.slow
def test_ddp_comm_hooks_under_torchrun() -> None:
    # gossip.ddp_hooks: allreduce (plain, fp16, bf16, int8, top-k with its residuals) and
    # gossip (neighbour) hooks against hand-computed steps; torch's post_localSGD_hook and
    # PeriodicModelAverager over the gossip backend.
    proc = _torchrun(3, script=HOOKS)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-6000:]
    oks = _oks(proc.stdout)
    for check in ("allreduce_hook", "codec", "topk_feedback", "gossip_hook", "post_localSGD"):
        assert oks.count(check) == (9 if check == "codec" else 3), (check, proc.stdout[-3000:])
