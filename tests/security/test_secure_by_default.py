"""Secure by default (DESIGN.md "Security by default"): the groups our own tools start
(`gossip run`, gossip.testing.spawn) hold a key made for the job and refuse a process without
it; a job across nodes needs a shared key or an explicit --insecure; under other launchers a
keyless group of several warns once at init(). Real processes, real sockets."""
from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pytest

from collectives.security import write_cluster_key
from gossip.testing import free_port, spawn, wait_until

REPO = Path(__file__).parents[2]
WORKERS = Path(__file__).parent / "workers"
MEMBERSHIP_WORKERS = REPO / "tests" / "membership" / "workers"
WAIT_S = 120


def _env(**extra: str) -> dict[str, str]:
    """This environment without any launcher's or gossip's variables (no inherited key), the
    checkout first on the path."""
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("GOSSIP_", "SLURM_", "OMPI_", "PMI_", "TORCHELASTIC_"))
           and k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "GROUP_RANK",
                         "MASTER_ADDR", "MASTER_PORT", "PYTHONWARNINGS")}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH", "")]))
    env.update(extra)
    return env


def _keyless_joiner(address: str, job: str) -> subprocess.CompletedProcess:
    """A process without the key asking to join the job at ``address`` (it says it means to
    be open: no warning of its own in its output)."""
    return subprocess.run([sys.executable, str(MEMBERSHIP_WORKERS / "bad_joiner.py"), "mismatch",
                           "10"], capture_output=True, text=True, timeout=WAIT_S,
                          env=_env(GOSSIP_RENDEZVOUS=address, GOSSIP_JOB_ID=job,
                                   GOSSIP_MEMBER_NAME="intruder", GOSSIP_INSECURE="1",
                                   JOIN_TIMEOUT="6"))


def _outputs(procs: list[subprocess.Popen]) -> list[tuple[str, str]]:
    """Each process's (stdout, stderr) once it ends; any still running at the deadline (or
    after an error) is killed."""
    try:
        return [p.communicate(timeout=WAIT_S) for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()


def _private(key_path: str) -> tuple[int, int]:
    """(mode of the key's folder, mode of the key file)."""
    return (stat.S_IMODE(os.stat(os.path.dirname(key_path)).st_mode),
            stat.S_IMODE(os.stat(key_path).st_mode))


# ---------------------------------------------------------------- gossip run
def test_gossip_run_peers_hold_a_key_of_the_job_and_only_its_holders_join(tmp_path):
    run = subprocess.Popen([sys.executable, "-m", "gossip", "run", "-n", "2", "--timeout", "30",
                            str(WORKERS / "keyed_member.py"), str(tmp_path)],
                           stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                           env=_env(), start_new_session=True)
    try:
        info = json.loads(wait_until(
            lambda: (tmp_path / "info").exists() and (tmp_path / "info").read_text()
            or run.poll() is not None and f'{{"exited": {run.returncode}}}', 60,
            what="rank 0's info"))
        assert "exited" not in info, run.communicate()[0]
        # A key of the job's own, private to this user, handed to every peer.
        assert info["key"] and _private(info["key"]) == (0o700, 0o600)
        # Without it: refused at the door (the CURVE handshake never completes).
        keyless = _keyless_joiner(info["address"], info["job"])
        # With it: admitted, and the job goes on with three.
        keyed = subprocess.run([sys.executable, str(MEMBERSHIP_WORKERS /
                                                    "synchronous_joiner.py"), "3", "10"],
                               capture_output=True, text=True, timeout=WAIT_S,
                               env=_env(GOSSIP_RENDEZVOUS=info["address"],
                                        GOSSIP_JOB_ID=info["job"], GOSSIP_KEY=info["key"],
                                        GOSSIP_MEMBER_NAME="holder"))
        out, _ = run.communicate(timeout=WAIT_S)
    finally:
        if run.poll() is None:
            run.kill()
            run.wait()
    assert keyless.returncode == 3, keyless.stdout + keyless.stderr
    assert "no member admitted it" in keyless.stdout, keyless.stdout + keyless.stderr
    assert keyed.returncode == 0 and "JOINED" in keyed.stdout, keyed.stdout + keyed.stderr
    assert run.returncode == 0, out
    assert sorted(line.split("KEYED ", 1)[1] for line in out.splitlines()
                  if "KEYED " in line) == ["0 True", "1 True"], out
    done = sorted(line.split("DONE ", 1)[1].split() for line in out.splitlines()
                  if "DONE " in line)
    assert [d[1] for d in done] == ["3", "3"], out            # the holder was admitted...
    assert {d[2] for d in done} == {"1"}, out                 # ...in the first view change
    assert not os.path.exists(os.path.dirname(info["key"]))   # removed with the launcher


def _gossip_run(*args: str, **env: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "gossip", "run", *args], capture_output=True,
                          text=True, timeout=WAIT_S, env=_env(**env))


@pytest.mark.parametrize("nnodes", ["2", "1:2"])
def test_a_job_across_nodes_without_a_key_or_insecure_is_refused_at_once(nnodes):
    began = time.monotonic()
    proc = _gossip_run("--nnodes", nnodes, "--node-rank", "0", "--master-addr", "127.0.0.1",
                       "-n", "1", str(WORKERS / "open_member.py"))
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert time.monotonic() - began < 30 and proc.stdout == ""   # nothing started
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("gossip run: error: "), proc.stderr
    for words in ("a job across nodes", "gossip keygen PATH", "copy the file to every node",
                  "--key PATH", "--insecure"):
        assert words in lines[0], lines[0]


def test_key_and_insecure_together_are_one_line_error(tmp_path):
    key = tmp_path / "cluster.key"
    write_cluster_key(key)
    proc = _gossip_run("--key", str(key), "--insecure", "-n", "1",
                       str(WORKERS / "open_member.py"))
    assert proc.returncode == 2 and "--key and --insecure" in proc.stderr, proc.stderr
    bad = tmp_path / "bad.key"
    bad.write_text("not a key\n")
    proc = _gossip_run("-n", "1", str(WORKERS / "open_member.py"), GOSSIP_KEY=str(bad))
    assert proc.returncode == 2 and "GOSSIP_KEY: " in proc.stderr \
        and "not a gossip cluster key" in proc.stderr, proc.stderr


@pytest.mark.timeout(150)
def test_two_nodes_with_insecure_run_open_and_do_not_warn():
    port = str(free_port())
    common = ["--nnodes", "2", "--master-addr", "127.0.0.1", "--master-port", port, "-n", "1",
              "--insecure"]
    nodes = [subprocess.Popen([sys.executable, "-m", "gossip", "run", *common, "--node-rank",
                               str(node), str(WORKERS / "open_member.py")],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                              env=_env()) for node in (0, 1)]
    outs = _outputs(nodes)
    for node, (p, (out, err)) in enumerate(zip(nodes, outs)):
        assert p.returncode == 0, out + err
        assert f"MET {node} False" in out, out
        assert "InsecureWarning" not in err, err


# ---------------------------------------------------------------- gossip.testing.spawn
def door_member(peer, workdir):
    """Steps a Synchronous group (a joiner would be admitted at a boundary) until the test
    says stop; rank 0 publishes where the group is. Returns what the test checks."""
    from gossip.policies import Synchronous
    key = os.environ.get("GOSSIP_KEY", "")
    if peer.rank == 0:
        info = json.dumps({"address": peer.settings.rendezvous, "job": peer.job_id})
        Path(workdir, "info.tmp").write_text(info)
        os.replace(Path(workdir, "info.tmp"), Path(workdir, "info"))
    x = np.zeros(10)
    policy = Synchronous().attach(peer, [x])
    while policy.step < 100_000:
        x += 1.0
        policy.after_step()
        stop = np.array([float(Path(workdir, "stop").exists())])
        peer.allreduce(stop, op="max")
        if stop[0]:
            break
        time.sleep(0.01)
    return (peer.transport.config.key is not None, key, _private(key) if key else None,
            peer.world_size, peer.view.number, float(x[0]) == policy.step)


def test_a_spawned_group_holds_a_key_of_its_own_and_refuses_a_keyless_joiner(tmp_path):
    box = {}

    def intrude():
        try:
            info = json.loads(wait_until(lambda: (tmp_path / "info").exists()
                                         and (tmp_path / "info").read_text(), 60,
                                         what="rank 0's info"))
            box["joiner"] = _keyless_joiner(info["address"], info["job"])
        finally:
            (tmp_path / "stop").touch()

    thread = threading.Thread(target=intrude)
    thread.start()
    try:
        results = spawn(door_member, n=2, timeout=WAIT_S, args=(str(tmp_path),))
    finally:
        thread.join(WAIT_S)
    joiner = box["joiner"]
    assert joiner.returncode == 3 and "no member admitted it" in joiner.stdout, \
        joiner.stdout + joiner.stderr
    (keyed0, key0, modes, *rest0), (keyed1, key1, _, *rest1) = results
    assert keyed0 and keyed1 and key0 == key1 and modes == (0o700, 0o600)
    assert rest0 == rest1 == [2, 0, True]       # no view change: nobody was let in
    assert not os.path.exists(os.path.dirname(key0))   # removed when spawn returned


def holds(peer):
    return peer.transport.config.key is not None, os.environ.get("GOSSIP_KEY", "")


def test_spawn_takes_a_given_key_or_none_when_insecure(tmp_path):
    key = tmp_path / "given.key"
    write_cluster_key(key)
    assert spawn(holds, n=2, key=str(key)) == [(True, str(key))] * 2
    assert spawn(holds, n=2, insecure=True) == [(False, "")] * 2
    with pytest.raises(ValueError, match="not both"):
        spawn(holds, n=2, key=str(key), insecure=True)


# ---------------------------------------------------------------- other launchers
def _by_hand(n: int, **env: str) -> list[subprocess.CompletedProcess]:
    """``n`` peers started as torchrun starts them (its variables), each with ``env``."""
    port = str(free_port())
    procs = [subprocess.Popen([sys.executable, str(WORKERS / "open_member.py")],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                              env=_env(RANK=str(r), WORLD_SIZE=str(n), LOCAL_RANK=str(r),
                                       MASTER_ADDR="127.0.0.1", MASTER_PORT=port, **env))
             for r in range(n)]
    outs = _outputs(procs)
    for p, (out, err) in zip(procs, outs):
        assert p.returncode == 0, out + err
    return [subprocess.CompletedProcess(p.args, p.returncode, out, err)
            for p, (out, err) in zip(procs, outs)]


def test_init_warns_once_under_torchrun_variables_without_a_key(tmp_path):
    for rank, proc in enumerate(_by_hand(2)):
        assert f"MET {rank} False" in proc.stdout
        assert proc.stderr.count("InsecureWarning") == 1, proc.stderr
        warning = proc.stderr[proc.stderr.index("InsecureWarning"):]
        for words in (f"rank {rank} of 2 without a cluster key", "tcp://127.0.0.1:",
                      "data ports", "take a rank, read and inject data",
                      "gossip keygen PATH", "GOSSIP_KEY=PATH", "GOSSIP_INSECURE=1"):
            assert words in warning, warning
    # Silenced when meant; never there with a key, nor for a world of one.
    for proc in _by_hand(2, GOSSIP_INSECURE="1"):
        assert "MET" in proc.stdout and "InsecureWarning" not in proc.stderr, proc.stderr
    key = tmp_path / "cluster.key"
    write_cluster_key(key)
    for rank, proc in enumerate(_by_hand(2, GOSSIP_KEY=str(key))):
        assert f"MET {rank} True" in proc.stdout and proc.stderr == "", proc.stderr
    alone = subprocess.run([sys.executable, str(WORKERS / "open_member.py")],
                           capture_output=True, text=True, timeout=WAIT_S, env=_env())
    assert alone.returncode == 0 and "MET 0 False" in alone.stdout
    assert alone.stderr == "", alone.stderr
