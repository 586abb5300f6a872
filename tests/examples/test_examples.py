"""The examples in examples/, each run in a fast setting as a user would: real processes under
`gossip run`, torchrun, and by hand with SLURM's and OpenMPI's variables."""
from __future__ import annotations

import os
import random
import re
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from gossip.testing import free_port

REPO = Path(__file__).parents[2]
EXAMPLES = REPO / "examples"
WAIT_S = 120  # every subprocess wait; a hang fails the test instead of stalling the run
# Launcher variables of the environment the tests run in must not leak into the examples.
_LAUNCHER_PREFIXES = ("GOSSIP_", "SLURM_", "OMPI_", "PMI_", "TORCHELASTIC_")
_LAUNCHER_NAMES = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "GROUP_RANK",
                   "MASTER_ADDR", "MASTER_PORT")


def _env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(_LAUNCHER_PREFIXES) and k not in _LAUNCHER_NAMES}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH", "")]))
    # Peers give up well before the test does, so a hang shows up as their own error.
    env.update(GOSSIP_TIMEOUT="45", OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1", **extra)
    return env


def _check(proc: subprocess.CompletedProcess) -> str:
    assert proc.returncode == 0, f"exit {proc.returncode}\n{proc.stdout}\n{proc.stderr}"
    return proc.stdout


def _gossip_run(n: int, example: str, *args: str, launcher: tuple = (),
                **env: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "gossip", "run", "-n", str(n), *launcher,
                           str(EXAMPLES / example), *args],
                          capture_output=True, text=True, timeout=WAIT_S, env=_env(**env))


def _final(out: str) -> str:
    lines = [line for line in out.splitlines() if "final:" in line]
    assert len(lines) == 1, out
    return lines[0]


def _number(line: str, label: str) -> float:
    match = re.search(re.escape(label) + r" ([0-9.e+-]+)", line)
    assert match, (label, line)
    return float(match.group(1))


def _peers(n: int, env_of, *args: str) -> list[str]:
    """Start ``n`` peers of train_torch.py by hand, as srun or mpirun would, each with
    ``env_of(rank)``; return their outputs. Any failure or the deadline kills all of them."""
    procs = [subprocess.Popen([sys.executable, str(EXAMPLES / "train_torch.py"), *args],
                              env=_env(**env_of(rank)), stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, text=True, start_new_session=True)
             for rank in range(n)]
    try:
        outs = [p.communicate(timeout=WAIT_S)[0] for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGKILL)
                p.wait()
    for rank, (p, out) in enumerate(zip(procs, outs)):
        assert p.returncode == 0, f"rank {rank} exit {p.returncode}\n{out}"
    return outs


# --------------------------------------------------------------------------- no group
@pytest.mark.parametrize("example", ["numpy_custom_loop.py", "train_torch.py",
                                     "elastic_averaging.py", "async_gossip.py"])
def test_help_works_without_a_group(example: str) -> None:
    proc = subprocess.run([sys.executable, str(EXAMPLES / example), "--help"],
                          capture_output=True, text=True, timeout=WAIT_S, env=_env())
    assert _check(proc).startswith("usage:")


def test_slurm_script_is_valid_bash() -> None:
    _check(subprocess.run(["bash", "-n", str(EXAMPLES / "slurm.sbatch")], capture_output=True,
                          text=True, timeout=WAIT_S))


# --------------------------------------------------------------------------- numpy examples
def test_numpy_custom_loop_trains_and_never_imports_torch() -> None:
    # Python's own import log names every module each peer imports, whoever imports it.
    proc = _gossip_run(2, "numpy_custom_loop.py", "--steps", "60",
                       PYTHONPROFILEIMPORTTIME="1")
    out = _check(proc)
    imported = re.findall(r"^\[rank \d\] import time:.*\|\s*(\S+)\s*$", proc.stderr, re.M)
    assert "numpy" in imported and "gossip" in imported, proc.stderr[-2000:]
    assert not [m for m in imported if m == "torch" or m.startswith("torch.")]
    for phase in ("by hand", "local-sgd"):
        lines = [line for line in out.splitlines() if f"[{phase}] consensus:" in line]
        assert len(lines) == 1, out
        assert _number(lines[0], "test accuracy") > 0.75, lines[0]   # chance: 0.5


@pytest.mark.parametrize("center", ["replicated", "sharded"])
def test_elastic_averaging_trains_a_centre(center: str) -> None:
    out = _check(_gossip_run(2, "elastic_averaging.py", "--steps", "200", "--center", center))
    assert f"centre {center}" in out
    final = _final(out)
    centre = _number(final, "centre test error")
    workers = [float(x) for x in final.split("workers' ")[1].split()]
    assert len(workers) == 2
    assert centre < 1.0, final   # untrained (zeros): about 50
    if center == "replicated":
        # The centre averages the workers' SGD noise away (seeded data and a synchronous
        # round: bitwise reproducible). The sharded centre's timing-dependent order of
        # updates makes its margin over two workers small either way.
        assert centre < sum(workers) / len(workers), final


def test_async_gossip_with_a_slow_peer() -> None:
    out = _check(_gossip_run(2, "async_gossip.py", "--steps", "120", "--slow-rank", "1",
                             "--delay", "0.004"))
    assert out.count("loop took") == 2, out
    final = _final(out)
    # A peer alone would stay near a test error of 6 (its shard's bias, for 2 peers).
    assert _number(final, "mean model test error") < 4, final
    assert _number(final, "consensus distance") < _number(final, "(|x|"), final


def test_async_gossip_survivors_finish_after_a_peer_dies() -> None:
    # Long enough (about 1.5 s) that the survivors train on well after noticing the death
    # (about 0.3 s after it: the connection drops, then a grace period).
    proc = _gossip_run(3, "async_gossip.py", "--steps", "600", "--leave-rank", "2",
                       "--leave-at", "20", launcher=("--keep-going",))
    out = proc.stdout
    assert proc.returncode == 9, f"exit {proc.returncode}\n{out}\n{proc.stderr}"  # rank 2's
    took = re.findall(r"^\[rank (\d)\] rank \d loop took", out, re.M)
    assert sorted(took) == ["0", "1"], out
    assert "final:" not in out   # no collective with a dead peer
    # Mixing went on: the survivors' weights stayed (a pairwise exchange never leaves a peer
    # light) and their exchanges were answered after the death.
    weights = [float(w) for w in re.findall(r"push-sum weight ([0-9.]+)", out)]
    assert len(weights) == 2 and min(weights) > 0.5, out
    answered = [int(a) for a in re.findall(r"(\d+) of \d+ exchanges answered", out)]
    assert len(answered) == 2 and min(answered) > 100, out


# --------------------------------------------------------------------------- train_torch
@pytest.mark.slow
def test_train_torch_under_gossip_run_with_four_peers() -> None:
    final = _final(_check(_gossip_run(4, "train_torch.py", "--epochs", "1",
                                      "--policy", "gossip")))
    assert "4 peers, policy gossip" in final
    assert _number(final, "averaged model test accuracy") > 0.4, final   # chance: 0.1


def _torchrun(*args: str, **env: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "torch.distributed.run", "--nproc-per-node",
                           "2", "--master-port", str(free_port()),
                           str(EXAMPLES / "train_torch.py"), "--epochs", "1", *args],
                          capture_output=True, text=True, timeout=WAIT_S, env=_env(**env))


@pytest.mark.slow   # (8 s) plain torchrun and the torch backend's torchrun tests are default
def test_train_torch_under_torchrun_with_a_gossip_port() -> None:
    # torchrun's agent holds --master-port (its TCP store) for the whole run, so gossip's
    # rendezvous goes to another port; see examples/multi_node.md.
    final = _final(_check(_torchrun(GOSSIP_MASTER_PORT=str(free_port()))))
    assert "2 peers, policy synchronous" in final
    assert _number(final, "averaged model test accuracy") > 0.4, final


@pytest.mark.slow   # 8 s; torchrun stays in the default run: tests/backend/test_torch_backend.py
def test_train_torch_under_plain_torchrun() -> None:
    # torchrun's agent store holds MASTER_PORT for the whole run; gossip takes the next port.
    final = _final(_check(_torchrun()))
    assert "2 peers" in final


def _slurm_port() -> int:
    """A free port that SLURM's convention (20000 + job id % 20000) can name."""
    for _ in range(200):
        port = random.randrange(20000, 40000)
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    raise RuntimeError("no free port in 20000-39999")


def _slurm_up() -> bool:
    if shutil.which("srun") is None or shutil.which("sinfo") is None:
        return False
    try:
        return subprocess.run(["sinfo", "-h", "-o", "%T"], capture_output=True, text=True,
                              timeout=10).stdout.split()[:1] in (["idle"], ["mixed"])
    except (OSError, subprocess.SubprocessError):
        return False


@pytest.mark.slow   # the sbatch test below runs srun too, in the default run
@pytest.mark.skipif(not _slurm_up(), reason="no SLURM node up (.ci/run installs slurm-wlm and "
                    "starts one: scripts/slurm-one-node.sh)")
def test_train_torch_under_a_real_srun() -> None:
    # The README's "SLURM" row under SLURM itself (Debian's slurm-wlm, one node): the peers
    # take their ranks from SLURM_PROCID/SLURM_NTASKS and the rendezvous port from the job id.
    proc = subprocess.run(["srun", "-N1", "-n2", "--overcommit", "--kill-on-bad-exit=1",
                           f"--chdir={REPO}", sys.executable, str(EXAMPLES / "train_torch.py"),
                           "--epochs", "1"],
                          capture_output=True, text=True, timeout=WAIT_S, env=_env())
    out = _check(proc)
    final = _final(out)
    assert "2 peers, policy synchronous" in final
    assert _number(final, "averaged model test accuracy") > 0.4, final
    assert "rank 1 epoch 1" in out


@pytest.mark.skipif(not _slurm_up(), reason="no SLURM node up (.ci/run installs slurm-wlm and "
                    "starts one: scripts/slurm-one-node.sh)")
def test_examples_slurm_sbatch_under_a_real_sbatch(tmp_path) -> None:
    # examples/slurm.sbatch as written (its srun line starts the peers), on the one node:
    # its two-node header is overridden on the command line, as a user with one node would.
    out_file = tmp_path / "job.out"
    proc = subprocess.run(["sbatch", "--parsable", "--nodes=1", "--ntasks-per-node=4",
                           "--cpus-per-task=1", "--overcommit", f"--chdir={REPO}",
                           f"--output={out_file}", str(EXAMPLES / "slurm.sbatch"),
                           "--epochs", "1"],
                          capture_output=True, text=True, timeout=WAIT_S, env=_env())
    job = _check(proc).strip().split(";")[0]
    state = _wait_for_job(job, time.monotonic() + WAIT_S)
    out = out_file.read_text() if out_file.exists() else "(no output file)"
    assert state == ("COMPLETED", "0:0"), (state, out[-3000:])
    final = _final(out)
    assert "4 peers, policy synchronous" in final
    assert _number(final, "averaged model test accuracy") > 0.4, final


def _wait_for_job(job: str, deadline: float) -> tuple[str, str]:
    """(state, exit code) of a SLURM job once it ended (sbatch --wait backs off to tens of
    seconds between polls); cancelled at the deadline."""
    pause = threading.Event()
    while True:
        info = subprocess.run(["scontrol", "show", "job", job], capture_output=True,
                              text=True, timeout=30).stdout
        state = re.search(r"JobState=(\w+)", info)
        code = re.search(r"ExitCode=([0-9:]+)", info)
        if state and state.group(1) not in ("PENDING", "RUNNING", "CONFIGURING",
                                            "COMPLETING"):
            return state.group(1), code.group(1) if code else "?"
        if time.monotonic() > deadline:
            subprocess.run(["scancel", job], timeout=30)
            return "TIMEOUT (cancelled by the test)", "?"
        pause.wait(0.2)


@pytest.mark.skipif(shutil.which("mpirun") is None,
                    reason="OpenMPI's mpirun is not installed (.ci/run installs openmpi-bin)")
@pytest.mark.slow
def test_train_torch_under_a_real_openmpi_mpirun() -> None:
    # The README's "OpenMPI" row, run by OpenMPI's own launcher (Debian's openmpi-bin): the
    # peers take their ranks from OMPI_COMM_WORLD_*; MASTER_PORT as `-x` passes it (alone,
    # 29500 might be taken).
    env = _env(MASTER_PORT=str(free_port()))
    proc = subprocess.run(["mpirun", "--allow-run-as-root", "--oversubscribe", "-np", "2",
                           "-x", "MASTER_PORT", "-x", "PYTHONPATH", "-x", "GOSSIP_TIMEOUT",
                           sys.executable, str(EXAMPLES / "train_torch.py"), "--epochs", "1",
                           "--policy", "local-sgd"],
                          capture_output=True, text=True, timeout=WAIT_S, env=env)
    final = _final(_check(proc))
    assert "2 peers, policy local-sgd" in final
    assert _number(final, "averaged model test accuracy") > 0.4, final


# --------------------------------------------------------------------------- the documents
def _documented_commands(program: str) -> list[list[str]]:
    """Every `program ...` command line in multi_node.md and slurm.sbatch, as arguments."""
    found = []
    for name in ("multi_node.md", "slurm.sbatch"):
        # Join continued lines (in the sbatch file, continued comment lines).
        text = re.sub(r"\\\n#?\s*", " ", (EXAMPLES / name).read_text())
        for line in text.splitlines():
            line = line.lstrip("#").strip()
            # At the start of a line (after VAR=value settings) or of a quoted command.
            match = re.match(r'(?:\w+=\S+\s+)*(?:.*")?(' + re.escape(program) + " .*)", line)
            if not match or "..." in line or "`" in line:   # prose, or an elided command
                continue
            words = shlex.split(match.group(1).split(" # ")[0].split('"')[0])
            found.append(words[len(program.split()):])
    return found


def test_documented_gossip_run_commands_parse() -> None:
    from gossip.launch.launcher import build_parser
    commands = _documented_commands("gossip run")
    assert len(commands) >= 3
    for args in commands:
        args = [a if "$" not in a else "1" for a in args]   # shell variables: any value
        parsed = build_parser().parse_args(args)
        assert parsed.script.endswith("train_torch.py"), args


def test_documented_torchrun_commands_parse() -> None:
    from torch.distributed.run import get_args_parser
    commands = _documented_commands("torchrun")
    assert len(commands) == 2
    for args in commands:
        parsed = get_args_parser().parse_args(args)
        assert parsed.nnodes == "2" and parsed.training_script.endswith("train_torch.py")
