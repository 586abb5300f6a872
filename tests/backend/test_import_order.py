"""The import order does not matter: ``import gossip`` before ``import torch`` (the order
isort gives) still makes "gossip" a torch.distributed backend (gossip/torch_import_hook.py's
finder), and a script that never imports gossip has it too (torch's "torch.backends" entry
point, setup.py, which torch calls at the end of ``import torch``). Real 2-rank jobs under
`gossip run` and torchrun."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from gossip.testing import free_port

pytest.importorskip("torch")

REPO = Path(__file__).resolve().parents[2]

SCRIPT = """
import gossip                       # first, as isort orders it
import torch
import torch.distributed as dist

dist.init_process_group("gossip")
t = torch.tensor([float(dist.get_rank() + 1)])
dist.all_reduce(t)
print(f"rank {dist.get_rank()}: all_reduce {t.item():g}", flush=True)
dist.destroy_process_group()
"""


def test_gossip_imported_before_torch_still_registers_the_backend(tmp_path) -> None:
    script = tmp_path / "train.py"
    script.write_text(SCRIPT)
    env = {k: v for k, v in os.environ.items() if not k.startswith("GOSSIP_")}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")]))
    env["TORCH_DEVICE_BACKEND_AUTOLOAD"] = "0"   # the finder alone, not torch's entry point
    proc = subprocess.run([sys.executable, "-m", "gossip", "run", "-n", "2", str(script)],
                          capture_output=True, text=True, timeout=120, env=env, cwd=tmp_path)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    for rank in (0, 1):
        assert f"rank {rank}: all_reduce 3" in proc.stdout, proc.stdout + proc.stderr[-3000:]


def test_torch_imported_first_needs_no_hook() -> None:
    code = ("import sys, torch, gossip, torch.distributed as dist\n"
            "from gossip.torch_import_hook import _TorchDistributedFinder\n"
            "assert 'GOSSIP' in dist.Backend._plugins\n"
            "assert not any(isinstance(f, _TorchDistributedFinder) for f in sys.meta_path)\n")
    env = dict(os.environ, PYTHONPATH=str(REPO))
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=120, env=env)
    assert proc.returncode == 0, proc.stderr[-3000:]


NEVER_IMPORTS_GOSSIP = """
import sys
import torch
import torch.distributed as dist

dist.init_process_group("gossip")
t = torch.tensor([float(dist.get_rank() + 1)])
dist.all_reduce(t)
print(f"rank {dist.get_rank()}: all_reduce {t.item():g} "
      f"peer {type(dist.group.WORLD.peer).__module__}", flush=True)
dist.destroy_process_group()
"""


def test_a_script_that_never_imports_gossip_gets_the_backend_from_torch(tmp_path) -> None:
    """As under Ray Train or Lightning, whose workers call init_process_group themselves."""
    script = tmp_path / "train.py"
    script.write_text(NEVER_IMPORTS_GOSSIP)
    env = {k: v for k, v in os.environ.items()
           if not k.startswith("GOSSIP_") and k != "TORCH_DEVICE_BACKEND_AUTOLOAD"}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")]))
    proc = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--nproc-per-node",
                           "2", "--master-port", str(free_port()), str(script)],
                          capture_output=True, text=True, timeout=120, env=env, cwd=tmp_path)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    for rank in (0, 1):
        assert f"rank {rank}: all_reduce 3 peer gossip.peer" in proc.stdout, \
            proc.stdout + proc.stderr[-3000:]
    # torch's own switch turns the entry point off: then nothing registers "gossip".
    off = subprocess.run([sys.executable, "-c",
                          "import sys, torch.distributed as dist\n"
                          "print('GOSSIP' in dist.Backend._plugins, 'gossip' in sys.modules)"],
                         capture_output=True, text=True, timeout=120,
                         env=dict(env, TORCH_DEVICE_BACKEND_AUTOLOAD="0"))
    assert off.stdout.split() == ["False", "False"], off.stdout + off.stderr[-2000:]
