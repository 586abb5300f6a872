"""Small helpers test files of several folders share (importable by spawned peers: tests/ is
on the path)."""
from __future__ import annotations

import os
import signal
from pathlib import Path

import numpy as np

__all__ = ["publish", "read", "batch_plan", "mlp", "regression_batch", "train", "quiet_point",
           "export_and_die", "REPO", "clean_env"]

#: The repository root (on a child's PYTHONPATH, so it imports this checkout's gossip).
REPO = str(Path(__file__).resolve().parents[1])


def clean_env(**extra: str) -> dict[str, str]:
    """This process's environment without any launcher's variables (the test's own run may
    be under one), this checkout first on PYTHONPATH, and ``extra``: for a process a test
    starts by hand. GOSSIP_KEY stays: the group's key (conftest's group_key), which a process
    joining the test's group needs."""
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("GOSSIP_", "RANK", "WORLD_SIZE", "MASTER_", "SLURM_", "OMPI_",
                                "TORCHELASTIC_")) or k == "GOSSIP_KEY"}
    env["PYTHONPATH"] = REPO + os.pathsep + env.get("PYTHONPATH", "")
    env.update(extra)
    return env


def publish(path: Path, text: str) -> None:
    """Write ``text`` to ``path`` atomically, for another process polling ``read(path)``."""
    path.with_suffix(".tmp").write_text(text)
    os.replace(path.with_suffix(".tmp"), path)


def read(path: Path) -> str | None:
    """What ``publish`` wrote, or None until then."""
    try:
        return path.read_text()
    except FileNotFoundError:
        return None


def batch_plan(n: int, n_train: int, epochs: int, batch: int) -> list[list[np.ndarray]]:
    """For each step, each peer's batch of indices: peer r trains on its shard (every n-th
    sample from r) only, in an order fixed by epoch and rank."""
    shards = [np.arange(r, n_train, n) for r in range(n)]
    steps = min(len(s) for s in shards) // batch
    plan = []
    for epoch in range(epochs):
        orders = [np.random.default_rng(1000 * epoch + r).permutation(s)
                  for r, s in enumerate(shards)]
        for k in range(steps):
            plan.append([o[k * batch:(k + 1) * batch] for o in orders])
    return plan


def mlp(seed: int, sizes=(20, 32, 5)):
    """A small tanh MLP with weights drawn from ``seed`` (torch imported here: the other
    helpers serve numpy-only tests)."""
    import torch
    torch.manual_seed(seed)
    layers = []
    for a, b in zip(sizes[:-1], sizes[1:]):
        layers += [torch.nn.Linear(a, b), torch.nn.Tanh()]
    return torch.nn.Sequential(*layers[:-1])


def regression_batch(rank: int, step: int):
    """Peer ``rank``'s batch of step ``step``: the same on every run (a deterministic loop)."""
    import torch
    g = torch.Generator().manual_seed(1000 * rank + step)
    x = torch.randn(16, 20, generator=g)
    return x, x[:, :5].sin() + 0.1 * torch.randn(16, 5, generator=g)


def train(model, opt, rank: int, steps) -> None:
    """MSE steps on regression_batch(rank, t) for t in ``steps`` (an int: range(steps))."""
    import torch
    for t in range(steps) if isinstance(steps, int) else steps:
        x, y = regression_batch(rank, t)
        opt.zero_grad()
        torch.nn.functional.mse_loss(model(x), y).backward()
        opt.step()


def ipc_sockets(pid: int) -> set[str]:
    """The ipc sockets of process ``pid`` that still exist: files in TMPDIR, and on Linux
    abstract ones ("@gossip-PID-...", listed in /proc/net/unix while any process holds
    them: collectives/transport/sockets.py)."""
    import glob
    import tempfile
    found = set(glob.glob(os.path.join(tempfile.gettempdir(), f"gossip-{pid}-*.sock")))
    try:
        with open("/proc/net/unix") as f:
            found |= {line.split()[-1] for line in f
                      if line.rstrip().endswith(".sock") and f"@gossip-{pid}-" in line}
    except OSError:
        pass
    return found


def ipc_exists(endpoint: str) -> bool:
    """Whether the ipc socket of ``endpoint`` ("ipc://PATH" or "ipc://@NAME") still exists."""
    path = endpoint[len("ipc://"):]
    if path.startswith("@"):
        pid = int(path.split("-")[1])
        return path in ipc_sockets(pid)
    return os.path.exists(path)


def quiet_point(peer, *victims: int) -> None:
    """Every peer's earlier operations are complete everywhere (the barrier waits for this
    peer's own and for every peer to enter), and a victim dies only once every survivor has
    left the barrier too (each tells it so), so no message of a victim is still on its way
    when it dies: it holds exactly what it holds, and nothing is in transit."""
    peer.barrier()
    survivors = [r for r in range(peer.world_size) if r not in victims]
    if peer.rank in victims:
        for r in survivors:
            peer.recv(r, np.zeros(1))
    else:
        for v in victims:
            peer.send(v, np.ones(1))


def export_and_die(path: str, numerators: np.ndarray, weight: float) -> None:
    """The victim's last state, written where the test reads it (atomically), then SIGKILL."""
    np.save(path + ".tmp.npy", np.concatenate([numerators, [weight]]))
    os.replace(path + ".tmp.npy", path)
    os.kill(os.getpid(), signal.SIGKILL)


def wait_steady(value, timeout: float, *, steady: float = 0.5, what: str = "a steady value"):
    """Wait until ``value()`` has not changed for ``steady`` seconds (what is in flight has
    landed), at most ``timeout`` seconds (TimeoutError naming ``what``); returns the value."""
    import time
    from gossip.testing import wait_until
    last = [value(), time.monotonic()]

    def settled() -> bool:
        now, current = time.monotonic(), value()
        if current != last[0]:
            last[0], last[1] = current, now
        return now - last[1] >= steady
    wait_until(settled, timeout, interval=0.05, what=what)
    return last[0]


def sigkill_when_written(job, pid_file: Path, wait_s: float, what: str) -> str:
    """SIGKILL the process whose pid a victim writes to ``pid_file`` (mid-training), then
    return ``job``'s output (a Popen of its own session, stdout piped, text) once it ends;
    ``job``'s whole session is SIGKILLed if it outlives ``wait_s``. Fails, with the output,
    when the job ends before the victim wrote its pid."""
    from gossip.testing import wait_until
    try:
        try:
            wait_until(lambda: pid_file.exists() or job.poll() is not None, wait_s,
                       interval=0.02, what=what)
        except TimeoutError:
            pass
        assert pid_file.exists(), job.communicate(timeout=30)[0][-8000:]
        os.kill(int(pid_file.read_text()), signal.SIGKILL)
        return job.communicate(timeout=wait_s)[0]
    finally:
        if job.poll() is None:
            os.killpg(job.pid, signal.SIGKILL)
            job.wait()
