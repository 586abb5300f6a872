"""Looking into a running `gossip run` job: SIGUSR1 stacks that leave it running, and the
banner that says where the job is (tests/launch/workers/inspected_job.py is the job)."""
from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from launched import WAIT_S, Launcher, launcher_env

from gossip.stacks import catches_signal

JOB = Path(__file__).parent / "workers" / "inspected_job.py"


def _dumps(err: str, rank: int) -> list[str]:
    """The thread headers of ``rank``'s stack dumps in the launcher's stderr."""
    return re.findall(rf"^\[rank {rank}\] (?:Current thread|Thread) 0x[0-9a-f]+ ", err, re.MULTILINE)


def _current(err: str, rank: int) -> list[str]:
    """One line per dump of ``rank``: the header of the thread that took the signal."""
    return re.findall(rf"^\[rank {rank}\] Current thread 0x", err, re.MULTILINE)


def _stop(folder: Path) -> None:
    (folder / "stop").touch()


def test_sigusr1_to_the_launcher_dumps_every_peers_stacks_and_the_job_goes_on(
        tmp_path: Path, launcher: list[Launcher]) -> None:
    run = Launcher(tmp_path, "-n", "2", str(JOB), str(tmp_path))
    launcher.append(run)
    run.running(2)
    os.kill(run.proc.pid, signal.SIGUSR1)
    run.wait_for(lambda: _dumps(run.err, 0) and _dumps(run.err, 1), "both ranks' stacks")
    _stop(tmp_path)
    assert run.finish() == 0, run.err
    for rank in (0, 1):
        # Every thread, the main one inside the training loop of the script.
        assert re.search(rf'^\[rank {rank}\]   File ".*inspected_job\.py", line \d+ in '
                         r"<module>$", run.err, re.MULTILINE), run.err
        assert re.search(rf"^\[rank {rank}\] DONE ", run.out, re.MULTILINE), run.out
    assert "gossip run: got SIGUSR1: passed on to rank(s) 0, 1" in run.err, run.err


def test_sigusr1_to_one_peer_dumps_its_stacks_only(tmp_path: Path,
                                                    launcher: list[Launcher]) -> None:
    run = Launcher(tmp_path, "-n", "2", str(JOB), str(tmp_path))
    launcher.append(run)
    pid = int(run.running(2)[1]["pid"])
    os.kill(pid, signal.SIGUSR1)
    run.wait_for(lambda: _dumps(run.err, 1), "rank 1's stacks")
    _stop(tmp_path)
    assert run.finish() == 0, run.err
    assert not _dumps(run.err, 0), run.err


def test_a_burst_of_sigusr1_while_every_thread_runs_leaves_the_peer_running(
        tmp_path: Path, launcher: list[Launcher]) -> None:
    # faulthandler's all-thread dump, read from inside the signal handler while the other
    # threads ran, once killed a peer with SIGSEGV here; each dump now holds the GIL.
    run = Launcher(tmp_path, "-n", "2", str(JOB), str(tmp_path))
    launcher.append(run)
    pid = int(run.running(2)[1]["pid"])
    # 300 signals, 3 ms apart: the old dump crashed the peer within them 3 times in 3.
    for _ in range(300):
        os.kill(pid, signal.SIGUSR1)
        time.sleep(0.003)   # the pace of the burst (Python folds signals that come together)
    run.wait_for(lambda: len(_current(run.err, 1)) >= 100, "rank 1's stacks, 100 times")
    _stop(tmp_path)
    assert run.finish() == 0, run.err[-4000:]
    assert re.search(r"^\[rank 1\] DONE ", run.out, re.MULTILINE), run.out


def test_the_launcher_spares_a_peer_without_a_handler(tmp_path: Path,
                                                      launcher: list[Launcher]) -> None:
    # No gossip.init(): SIGUSR1 would kill this peer, so it is not passed on.
    script = tmp_path / "bare.py"
    script.write_text("import os, signal, sys\n"
                      "print('RUNNING pid=%d' % os.getpid(), flush=True)\n"
                      "signal.signal(signal.SIGTERM, lambda *a: sys.exit(0))\n"
                      "signal.pause()\n")
    run = Launcher(tmp_path, "-n", "1", str(script))
    launcher.append(run)
    pid = int(run.running(1)[0]["pid"])
    os.kill(run.proc.pid, signal.SIGUSR1)
    run.wait_for(lambda: "not to rank(s) 0" in run.err, "the launcher's word on rank 0")
    assert run.proc.poll() is None and catches_signal(pid, signal.SIGUSR1) is False
    run.proc.terminate()
    assert run.finish() == 128 + signal.SIGTERM, run.err


@pytest.mark.parametrize("case", ["default", "off", "user"])
def test_init_installs_the_handler_only_where_it_may(tmp_path: Path, case: str) -> None:
    """A world of one: the handler writes the stacks and the process runs on; with
    GOSSIP_STACKS_ON_SIGUSR1=0 SIGUSR1 stays fatal; a handler of the user's stays theirs."""
    script = ("import os, signal, sys\n"
              "import gossip\n"
              "if sys.argv[1] == 'user':\n"
              "    signal.signal(signal.SIGUSR1, lambda *a: print('USER HANDLER', flush=True))\n"
              "with gossip.init() as peer:\n"
              "    os.kill(os.getpid(), signal.SIGUSR1)\n"
              "    print('RAN ON', flush=True)\n")
    env = launcher_env(GOSSIP_STACKS_ON_SIGUSR1="0") if case == "off" else launcher_env()
    proc = subprocess.run([sys.executable, "-c", script, case], capture_output=True, text=True,
                          timeout=WAIT_S, env=env, cwd=tmp_path)
    if case == "off":
        assert proc.returncode == -signal.SIGUSR1, proc.stdout + proc.stderr
        return
    assert proc.returncode == 0, proc.stderr
    assert "RAN ON" in proc.stdout
    dumped = re.search(r'^Current thread 0x[0-9a-f]+ "MainThread" \(most recent call first\):$',
                       proc.stderr, re.MULTILINE)
    if case == "user":
        assert "USER HANDLER" in proc.stdout and not dumped, proc.stderr
    else:
        assert dumped and 'File "<string>", line 6 in <module>' in proc.stderr, proc.stderr
        # Its own frames are not in it: the main thread's stack is where the signal came.
        assert "stacks.py" not in proc.stderr, proc.stderr


def _banner(err: str) -> dict[str, str]:
    lines = [line for line in err.splitlines() if line.startswith("gossip run: ")]
    job = re.match(r"gossip run: job (\S+) at (\S+), (\d+) peer\(s\) on this node", lines[0])
    assert job, err
    add = [line.split("add a peer: ", 1)[1] for line in lines if "add a peer: " in line]
    stacks = [line for line in lines if "every peer's stacks: kill -USR1 " in line]
    return {"job": job.group(1), "address": job.group(2), "peers": job.group(3),
            "add": add[0], "stacks": stacks[0]}


def test_the_banner_names_the_job_the_peers_are_in_and_its_command_adds_a_peer(
        tmp_path: Path, launcher: list[Launcher]) -> None:
    # The job trains until it has 3 members: the one the printed command starts.
    run = Launcher(tmp_path, "-n", "2", str(JOB), str(tmp_path), "3")
    launcher.append(run)
    peers = run.running(2)
    banner = _banner(run.err)
    assert banner["peers"] == "2" and banner["stacks"].endswith(f" {run.proc.pid}")
    for rank in (0, 1):
        assert peers[rank]["job"] == banner["job"]
        assert peers[rank]["rendezvous"] == f"tcp://{banner['address']}"
    assert "GOSSIP_KEY=" in banner["add"] and "BEGIN" not in run.err   # a path, not a key
    # From another shell: the command as printed, in an environment of no job's.
    joiner = subprocess.Popen(["bash", "-c", banner["add"]], stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, text=True, env=launcher_env(), cwd=tmp_path)
    try:
        joined = run.wait_for(lambda: sorted(p for p in tmp_path.glob("joined.*")
                                             if p.suffix != ".tmp"),   # (written, then renamed)
                              "the joiner's file")
        out = joiner.communicate(timeout=WAIT_S)[0]
    finally:
        if joiner.poll() is None:
            joiner.kill()
    assert joiner.returncode == 0, out
    assert json.loads(joined[0].read_text())["members"] == 3
    assert run.finish() == 0, run.err
    assert len(re.findall(r"^\[rank \d\] DONE step=\d+ members=3 ", run.out, re.MULTILINE)) == 2, run.out
    assert re.search(r"^DONE step=\d+ members=3 ", out, re.MULTILINE), out
