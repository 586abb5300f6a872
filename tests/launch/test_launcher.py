"""Tests of `gossip run` / `python -m gossip.run`: real launchers starting real peers."""
from __future__ import annotations

import os
import re
import signal
import subprocess
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Iterator

import psutil
import pytest

from gossip.testing import wait_until

from gossip.launch.launcher import launch
from gossip.testing import free_port

SCRIPTS = Path(__file__).parent / "workers"
REPO = Path(__file__).parents[2]
WAIT_S = 60  # every subprocess wait; a hang fails the test instead of stalling the run
# The lines gossip run starts with (where the job is: tests/launch/test_inspect.py).
BANNER = ("gossip run: job ", "gossip run: add a peer: ", "gossip run: see it: ",
          "gossip run: every peer's stacks: ")


def _env(**extra: str) -> dict[str, str]:
    env = dict(os.environ, **extra)
    # The launcher must find this checkout even when the tests run from elsewhere.
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), extra.get("PYTHONPATH", "")]))
    return env


def _run(*args: str, entry: str = "gossip.run", **env: str) -> subprocess.CompletedProcess:
    head = ["-m", "gossip", "run"] if entry == "gossip" else ["-m", entry]
    return subprocess.run([sys.executable, *head, *args], capture_output=True, text=True,
                          timeout=WAIT_S, env=_env(**env))


def _script(name: str) -> str:
    return str(SCRIPTS / name)


def _wait_for_files(folder: Path, pattern: str, count: int, proc: subprocess.Popen | None = None,
                    timeout: float = 30.0) -> list[Path]:
    def ready():
        found = sorted(folder.glob(pattern))
        if len(found) >= count:
            return found
        if proc is not None and proc.poll() is not None:
            raise AssertionError(f"launcher exited {proc.returncode} before {count} {pattern}")
        return None
    try:
        return wait_until(ready, timeout, what=f"{count} {pattern} files")
    except TimeoutError as exc:
        raise AssertionError(str(exc)) from None


def _pids(folder: Path, count: int) -> list[int]:
    return [int(p.read_text()) for p in _wait_for_files(folder, "pid.[0-9]", count)]


def _alive(pids: list[int], script: str, timeout: float = 0.0) -> list[int]:
    """PIDs still running ``script`` after up to ``timeout`` s (zombies and reused PIDs count
    as gone)."""
    def still_running() -> list[int]:
        alive = []
        for pid in pids:
            try:
                p = psutil.Process(pid)
                if p.status() != psutil.STATUS_ZOMBIE and any(script in a for a in p.cmdline()):
                    alive.append(pid)
            except (psutil.NoSuchProcess, psutil.AccessDenied):
                pass
        return alive
    try:
        wait_until(lambda: not still_running(), timeout, interval=0.05, what="the peers' end")
    except TimeoutError:
        pass
    return still_running()


@pytest.fixture
def peer_dir(tmp_path: Path) -> Iterator[Path]:
    """A folder for the peers' PID and marker files. Afterwards, any peer still running is
    SIGKILLed, so a failing test (or a stubborn peer) leaves no process behind."""
    yield tmp_path
    pids = [int(p.read_text()) for p in tmp_path.glob("pid.[0-9]")]
    for pid in _alive(pids, str(SCRIPTS)):
        os.kill(pid, signal.SIGKILL)


def _lines(text: str, rank: int) -> list[str]:
    tag = f"[rank {rank}] "
    return [line[len(tag):] for line in text.splitlines() if line.startswith(tag)]


def test_four_peers_get_torchrun_variables_and_prefixed_output() -> None:
    proc = _run("-n", "4", "--topology", "ring", "--timeout", "7", _script("show_env.py"),
                "--foo", "bar", "-n", "9")
    assert proc.returncode == 0, proc.stderr
    ports = set()
    for rank in range(4):
        out = _lines(proc.stdout, rank)
        assert len(out) == 2, proc.stdout
        env = dict(item.split("=", 1) for item in out[0].split())
        assert env["RANK"] == env["LOCAL_RANK"] == str(rank)
        assert env["WORLD_SIZE"] == env["LOCAL_WORLD_SIZE"] == "4"
        assert env["MASTER_ADDR"] == "127.0.0.1" and env["GROUP_RANK"] == "0"
        assert env["GOSSIP_TOPOLOGY"] == "ring" and env["GOSSIP_TIMEOUT"] == "7.0"
        assert env["PYTHONUNBUFFERED"] == "1"
        ports.add(env["MASTER_PORT"])
        assert out[1] == "ARGS --foo bar -n 9"  # flags after the script belong to the script
        assert _lines(proc.stderr, rank) == [f"stderr line of rank {rank}"]
    assert len(ports) == 1 and 0 < int(ports.pop()) < 65536


def test_gossip_run_subcommand_and_no_prefix() -> None:
    proc = _run("-n", "2", "--no-prefix", _script("show_env.py"), entry="gossip")
    assert proc.returncode == 0, proc.stderr
    assert "[rank" not in proc.stdout + proc.stderr
    # Passed through untouched: both peers write to one pipe, in any order.
    assert sorted(re.findall(r"RANK=(\d) WORLD_SIZE=2 ", proc.stdout)) == ["0", "1"]
    assert sorted(re.findall(r"stderr line of rank (\d)", proc.stderr)) == ["0", "1"]


@pytest.mark.timeout(120)
@pytest.mark.parametrize("entry", ["gossip.run", "gossip"])
def test_real_allreduce_rendezvous_from_launcher_variables(entry: str) -> None:
    # Stale GOSSIP_* settings in the launcher's environment would outrank the torchrun
    # variables in the peers: the launcher must not pass them on.
    proc = _run("-n", "3", _script("allreduce_sum.py"), entry=entry, GOSSIP_RANK="5",
                GOSSIP_WORLD_SIZE="9", GOSSIP_RENDEZVOUS="tcp://127.0.0.1:1")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    for rank in range(3):
        assert "SUM 3.0 WORLD 3" in _lines(proc.stdout, rank), proc.stdout


@pytest.mark.timeout(120)
def test_two_launchers_form_one_world_across_nodes(group_key: str) -> None:
    port = str(free_port())
    common = ["--nnodes", "2", "--master-addr", "127.0.0.1", "--master-port", port, "-n", "2"]
    launchers = [subprocess.Popen([sys.executable, "-m", "gossip.run", *common, "--node-rank",
                                   str(node), _script("allreduce_sum.py")],
                                  stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                  env=_env()) for node in (0, 1)]
    try:
        results = [p.communicate(timeout=WAIT_S) for p in launchers]
    finally:
        for p in launchers:
            p.kill()
            p.wait(timeout=WAIT_S)
    for node, (p, (out, err)) in enumerate(zip(launchers, results)):
        assert p.returncode == 0, out + err
        for rank in (2 * node, 2 * node + 1):  # global rank = node_rank * n + local rank
            assert "SUM 6.0 WORLD 4" in _lines(out, rank), out


def test_first_failure_stops_the_others_with_its_exit_code(peer_dir: Path) -> None:
    start = time.monotonic()
    proc = _run("-n", "3", "--grace", "30", _script("fail_one.py"), str(peer_dir), "1", "exit")
    elapsed = time.monotonic() - start
    assert proc.returncode == 3, proc.stderr
    assert elapsed < 15, elapsed  # the sleepers were stopped, not waited for
    failure = [line for line in proc.stderr.splitlines() if line.startswith("gossip run: rank")]
    assert failure and "rank 1" in failure[0] and "exit code 3" in failure[0], proc.stderr
    assert _alive(_pids(peer_dir, 3), "fail_one.py") == []


def test_keep_going_lets_the_others_finish_and_returns_the_failure(peer_dir: Path) -> None:
    proc = _run("-n", "3", "--keep-going", _script("fail_one.py"), str(peer_dir), "1", "exit",
                "finish")
    assert proc.returncode == 3, proc.stderr
    assert "go on (--keep-going)" in proc.stderr, proc.stderr
    for rank in (0, 2):
        assert f"rank {rank} finished" in _lines(proc.stdout, rank), proc.stdout


def test_peer_killed_by_a_signal_exits_128_plus_signal(peer_dir: Path) -> None:
    proc = _run("-n", "2", _script("fail_one.py"), str(peer_dir), "0", "sigkill")
    assert proc.returncode == 128 + signal.SIGKILL, proc.stderr
    assert "rank 0" in proc.stderr and "SIGKILL" in proc.stderr
    assert _alive(_pids(peer_dir, 2), "fail_one.py") == []


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_signal_to_the_launcher_reaches_every_peer(peer_dir: Path, signum: int) -> None:
    launcher = subprocess.Popen(
        [sys.executable, "-m", "gossip.run", "-n", "3", _script("wait_for_signal.py"),
         str(peer_dir)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        env=_env(), start_new_session=True)  # our signals, not the terminal's
    try:
        _wait_for_files(peer_dir, "pid.[0-9]", 3, launcher)
        pids = _pids(peer_dir, 3)
        launcher.send_signal(signum)
        out, err = launcher.communicate(timeout=WAIT_S)
    finally:
        launcher.kill()
        launcher.wait(timeout=WAIT_S)
    assert launcher.returncode == 128 + signum, err
    name = signal.Signals(signum).name
    caught = sorted(p.name for p in peer_dir.glob("caught.*"))
    assert caught == [f"caught.{rank}.{name}" for rank in range(3)], out + err
    assert _alive(pids, "wait_for_signal.py") == []


def _start_stubborn(folder: Path, grace: float) -> tuple[subprocess.Popen, list[int]]:
    launcher = subprocess.Popen(
        [sys.executable, "-m", "gossip.run", "-n", "2", "--grace", str(grace),
         _script("wait_for_signal.py"), str(folder), "--stubborn"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=_env(),
        start_new_session=True)
    try:
        _wait_for_files(folder, "pid.[0-9]", 2, launcher)
    except BaseException:
        launcher.kill()
        launcher.wait(timeout=WAIT_S)
        raise
    return launcher, _pids(folder, 2)


def test_peers_that_ignore_signals_are_killed_after_the_grace(peer_dir: Path) -> None:
    launcher, pids = _start_stubborn(peer_dir, grace=1.0)
    try:
        start = time.monotonic()
        launcher.send_signal(signal.SIGTERM)
        out, err = launcher.communicate(timeout=WAIT_S)
        elapsed = time.monotonic() - start
    finally:
        launcher.kill()
        launcher.wait(timeout=WAIT_S)
    assert launcher.returncode == 143, err
    assert 1.0 <= elapsed < 10, elapsed
    assert "killing" in err
    assert _alive(pids, "wait_for_signal.py") == []


def test_a_second_ctrl_c_skips_the_grace(peer_dir: Path) -> None:
    launcher, pids = _start_stubborn(peer_dir, grace=60.0)
    try:
        launcher.send_signal(signal.SIGINT)
        # The launcher says it is stopping before it waits out the grace: then press again.
        line = launcher.stderr.readline()
        while line.startswith(BANNER):   # the launcher's opening lines, from before the signal
            line = launcher.stderr.readline()
        assert "got SIGINT" in line, line
        launcher.send_signal(signal.SIGINT)
        out, err = launcher.communicate(timeout=20)  # far below the 60 s grace
    finally:
        launcher.kill()
        launcher.wait(timeout=WAIT_S)
    assert launcher.returncode == 130, err
    assert _alive(pids, "wait_for_signal.py") == []


def test_lines_of_many_peers_never_interleave() -> None:
    count = 2000
    proc = _run("-n", "4", _script("chatter.py"), str(count))
    assert proc.returncode == 0, proc.stderr[-2000:]
    for rank in range(4):
        out, err = _lines(proc.stdout, rank), _lines(proc.stderr, rank)
        body = "x" * 300
        assert out == [f"<{rank}:{i}:{body}>" for i in range(1, count, 2)] + [f"<{rank}:end>"]
        assert err == [f"<{rank}:{i}:{body}>" for i in range(0, count, 2)]
    # Every line of the output belongs to exactly one peer (but the launcher's banner).
    assert all(line.startswith("[rank ") for line in proc.stdout.splitlines())
    assert all(line.startswith(("[rank ", "gossip run: ")) for line in proc.stderr.splitlines())


def test_peers_do_not_outlive_a_killed_launcher(peer_dir: Path) -> None:
    launcher = subprocess.Popen(
        [sys.executable, "-m", "gossip.run", "-n", "2", _script("wait_for_signal.py"),
         str(peer_dir)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=_env(),
        start_new_session=True)
    try:
        _wait_for_files(peer_dir, "pid.[0-9]", 2, launcher)
        pids = _pids(peer_dir, 2)
    finally:
        launcher.kill()  # SIGKILL: no cleanup of the launcher's own can run
        launcher.wait(timeout=WAIT_S)
    # PR_SET_PDEATHSIG: the kernel sends each peer SIGTERM when the launcher dies.
    assert _alive(pids, "wait_for_signal.py", timeout=20) == []
    _wait_for_files(peer_dir, "caught.*.SIGTERM", 2)


def test_module_form() -> None:
    proc = _run("-n", "2", "-m", "hello_module", "x", "--y", PYTHONPATH=str(SCRIPTS))
    assert proc.returncode == 0, proc.stderr
    for rank in range(2):
        assert _lines(proc.stdout, rank) == [f"module __main__ as {rank}/2 args x --y"]


@pytest.mark.parametrize("args, words", [
    (["-n", "0", _script("show_env.py")], "-n must be at least 1"),
    (["-n", "2", "no_such_script.py"], "not found"),
    (["--nnodes", "2", _script("show_env.py")], "--master-addr"),
    (["--nnodes", "2", "--node-rank", "2", "--master-addr", "h", _script("show_env.py")],
     "--node-rank 2"),
    (["--master-port", "70000", _script("show_env.py")], "not a valid TCP port"),
    (["--topology", "nonsense", _script("show_env.py")], "--topology"),
    (["--key", "no_such_key_file", _script("show_env.py")], "--key"),
    (["--timeout", "-1", _script("show_env.py")], "--timeout"),
])
@pytest.mark.parametrize("entry", ["gossip.run", "gossip"])
def test_bad_arguments_are_one_line_errors(args: list[str], words: str, entry: str) -> None:
    proc = _run(*args, entry=entry)
    assert proc.returncode == 2
    assert "Traceback" not in proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("gossip run: error:"), proc.stderr
    assert words in lines[0]
    assert proc.stdout == ""


def test_the_launcher_does_not_import_torch() -> None:
    code = ("import sys, gossip.launch.launcher, gossip.run, gossip.cli.run_command; "
            "print('torch' in sys.modules)")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=WAIT_S, env=_env())
    assert proc.stdout.strip() == "False", proc.stderr


def test_launch_api_in_process(peer_dir: Path, capfd: pytest.CaptureFixture[str]) -> None:
    code = launch([sys.executable, _script("show_env.py"), "api"], 2, env={"EXTRA": "1"},
                  topology="complete")
    out, err = capfd.readouterr()
    assert code == 0, err
    for rank in range(2):
        assert _lines(out, rank)[1] == "ARGS api"
        assert "GOSSIP_TOPOLOGY=complete" in _lines(out, rank)[0]
    code = launch([sys.executable, _script("fail_one.py"), str(peer_dir), "1", "exit"], 2)
    assert code == 3
    assert _alive(_pids(peer_dir, 2), "fail_one.py") == []
    with pytest.raises(ValueError, match="--node-rank"):
        launch([sys.executable, "x.py"], 2, nnodes=2, node_rank=5, master_addr="h")


@pytest.mark.timeout(120)
def test_the_interpreter_named_before_the_script_is_taken_as_mpiruns_habit() -> None:
    # `gossip run -n 2 python script.py` ran the python binary as a script before
    # ("SyntaxError: source code cannot contain null bytes").
    proc = _run("-n", "2", "python3", _script("allreduce_sum.py"))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    for rank in range(2):
        assert "SUM 1.0 WORLD 2" in _lines(proc.stdout, rank), proc.stdout
    bare = _run("-n", "2", "python")
    assert bare.returncode == 2 and "no script" in bare.stderr, bare.stderr


def test_version_and_a_bad_log_level_get_one_line() -> None:
    proc = subprocess.run([sys.executable, "-m", "gossip", "--version"], capture_output=True,
                          text=True, timeout=WAIT_S, env=_env())
    assert proc.returncode == 0 and re.fullmatch(r"gossip \d+\.\d+\.\d+\s*", proc.stdout), \
        proc.stdout + proc.stderr
    bad = _run("-n", "2", _script("allreduce_sum.py"), GOSSIP_LOG_LEVEL="bogus")
    assert bad.returncode == 2, bad.stdout + bad.stderr
    assert bad.stderr.strip().splitlines() == [
        "gossip run: error: GOSSIP_LOG_LEVEL='bogus': expected DEBUG, INFO, WARNING, ERROR, "
        "CRITICAL or a number"], bad.stderr


@pytest.mark.timeout(120)
def test_one_traceback_in_full_the_consequences_in_a_line_and_the_cause_named() -> None:
    # Before: every survivor's PeerLost traceback after the real one, and the closing line
    # said only "rank 2 failed with exit code 1". --keep-going lets the survivors raise.
    folder = tempfile.mkdtemp(prefix="g")   # short: an ipc path is at most 107 bytes
    try:
        proc = _run("-n", "4", "--keep-going", _script("raise_one.py"), TMPDIR=folder)
        # The peers died without closing: the launcher removed their ipc socket files
        # (before: 4 left in /tmp per such run; 16,509 had piled up on this machine).
        assert os.listdir(folder) == [], os.listdir(folder)
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    err = proc.stderr
    assert err.count("Traceback (most recent call last)") == 1, err
    assert "[rank 2] ValueError: bad batch at step 3" in err, err
    assert ("gossip run: rank 2 failed with exit code 1 (ValueError: bad batch at step 3)"
            in err), err
    lost = [line for line in err.splitlines() if line.startswith("[rank") and "PeerLost" in line]
    assert len(lost) == 3 and all("a consequence of rank 2's failure" in line
                                  for line in lost), lost


def test_log_dir_keeps_each_peers_output_unprefixed_and_still_shows_it(tmp_path) -> None:
    proc = _run("-n", "2", "--log-dir", str(tmp_path / "logs"), _script("show_env.py"), "x")
    assert proc.returncode == 0, proc.stderr
    for rank in range(2):
        out = (tmp_path / "logs" / f"rank{rank}.stdout").read_text().splitlines()
        assert out[0].startswith(f"RANK={rank} ") and out[1] == "ARGS x", out
        err = (tmp_path / "logs" / f"rank{rank}.stderr").read_text()
        assert err == f"stderr line of rank {rank}\n", err
        assert f"[rank {rank}] ARGS x" in proc.stdout   # shown here too (tee)


@pytest.mark.timeout(120)
def test_a_restart_that_comes_back_after_the_job_ended_is_stopped_not_waited_for(
        tmp_path: Path) -> None:
    """Rank 2 of 3 is SIGKILLed and started again; the others end before its restart looks
    for the rendezvous (a preempted machine that comes back after the last step). It used to
    wait out its rendezvous timeout for a job that was gone, then fail the launcher (exit 1,
    RendezvousError: no answer). Now the launcher, once every other peer has finished, gives
    it the grace and stops it: exit 0 and a line that says so."""
    proc = subprocess.run(
        [sys.executable, "-m", "gossip", "run", "-n", "3", "--max-restarts", "1", "--grace", "1",
         _script("late_restart.py")], capture_output=True, text=True, timeout=WAIT_S,
        env=_env(DONE_FILE=str(tmp_path / "done"), GOSSIP_TIMEOUT="100"))
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "rank 2 failed with exit code 137 (killed by SIGKILL); starting it again" \
        in proc.stderr, proc.stderr[-3000:]
    assert "gossip run: the job ended here: rank(s) 0, 1 finished (exit code 0), and rank(s) " \
           "2 (restart 1) had not finished 1 s later" in proc.stderr, proc.stderr[-3000:]
    assert "RendezvousError" not in proc.stderr, proc.stderr[-3000:]
    for rank in (0, 1):
        assert f"[rank {rank}] rank {rank}: ended at step " in proc.stdout, proc.stdout


def test_a_peer_that_fails_after_the_job_ended_is_not_started_again(tmp_path: Path) -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "gossip", "run", "-n", "3", "--max-restarts", "1",
         _script("late_restart.py")], capture_output=True, text=True, timeout=WAIT_S,
        env=_env(DONE_FILE=str(tmp_path / "done"), FAIL_AFTER_END="1"))
    assert proc.returncode == 3, proc.stderr[-3000:]
    assert "rank 2 failed with exit code 3; not started again: the job has ended here; " \
           "stopping the other peers" in proc.stderr, proc.stderr[-3000:]
    assert "starting it again" not in proc.stderr, proc.stderr[-3000:]
