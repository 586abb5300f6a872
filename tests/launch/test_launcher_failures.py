"""What `gossip run` shows when peers cannot meet: one line per rank (its rank, the exception
and its message, naming the address and the operation) and the closing summary; the
tracebacks whole under GOSSIP_LOG_LEVEL=DEBUG. And a peer that ends without close(), under
a launcher that knows nothing of gossip, leaves no socket file behind."""
from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from gossip.testing import free_port
from test_launcher import WAIT_S, _env, _run, _script

MET = _script("rendezvous_only.py")


def _rank_lines(err: str) -> list[str]:
    return [line for line in err.splitlines() if line.startswith("[rank ")]


def _summary(err: str) -> list[str]:
    return [line for line in err.splitlines() if line.startswith("gossip run: rank")]


@pytest.fixture
def held_port():
    """A rendezvous port held by another program: a listening socket of the test's."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        yield s.getsockname()[1]


@pytest.mark.timeout(120)
def test_a_held_rendezvous_port_is_one_line_per_rank_and_the_summary(held_port) -> None:
    # --keep-going: ranks 1 and 2 wait out their timeout and fail too, each on one line.
    proc = _run("-n", "3", "--keep-going", "--timeout", "1", "--master-port", str(held_port),
                MET)
    err = proc.stderr
    assert proc.returncode == 1, err
    assert proc.stdout == "", proc.stdout
    assert "Traceback" not in err and "  File " not in err, err
    lines = _rank_lines(err)
    assert sorted(line[:8] for line in lines) == ["[rank 0]", "[rank 1]", "[rank 2]"], err
    address = f"tcp://127.0.0.1:{held_port}"
    assert all(line.startswith(f"[rank {line[6]}] RendezvousError: rank {line[6]}: ")
               and address in line for line in lines), err
    first = [line for line in lines if line.startswith("[rank 0]")][0]
    assert "cannot bind the rendezvous" in first and "Address already in use" in first, first
    assert all("no answer from the rendezvous" in line for line in lines if line != first)
    summary = _summary(err)
    assert summary[0].startswith("gossip run: rank 0 failed with exit code 1 (RendezvousError: "
                                 f"rank 0: cannot bind the rendezvous at {address}"), err
    assert len(summary) == 3, err
    assert err.strip().splitlines()[-1] == (
        "gossip run: 3 traceback(s) shortened to their last line; GOSSIP_LOG_LEVEL=DEBUG shows "
        "them whole"), err


def test_under_debug_the_traceback_is_whole(held_port) -> None:
    proc = _run("-n", "2", "--timeout", "5", "--master-port", str(held_port), MET,
                GOSSIP_LOG_LEVEL="DEBUG")
    err = proc.stderr
    assert proc.returncode == 1, err
    assert "[rank 0] Traceback (most recent call last):" in err, err
    assert "[rank 0] collectives.errors.RendezvousError: rank 0: cannot bind the rendezvous" \
        in err, err
    assert "shortened" not in err, err
    # The first failure stopped rank 1 before its timeout: no error of its own.
    assert "[rank 1] Traceback" not in err, err


@pytest.mark.timeout(120)
def test_an_absent_rank_0_is_one_line_per_waiting_rank(group_key: str) -> None:
    # Node 1 of two: node 0 (rank 0) never starts.
    port = free_port()
    proc = _run("--nnodes", "2", "--node-rank", "1", "--master-addr", "127.0.0.1",
                "--master-port", str(port), "-n", "2", "--keep-going", "--timeout", "1", MET)
    err = proc.stderr
    assert proc.returncode == 1, err
    assert "Traceback" not in err, err
    lines = _rank_lines(err)
    assert sorted(line[:8] for line in lines) == ["[rank 2]", "[rank 3]"], err
    for line in lines:
        assert f"RendezvousError: rank {line[6]}: no answer from the rendezvous at " \
               f"tcp://127.0.0.1:{port}" in line, line
    assert len(_summary(err)) == 2, err


@pytest.mark.timeout(120)
@pytest.mark.parametrize("differ, words", [
    (("--job-id", "job-a", "--job-id", "job-b"), ("never came", "never met its own job")),
    (("--topology", "ring", "--topology", "complete"), ("topology=", "topology=")),
], ids=["job", "topology"])
def test_launchers_that_disagree_each_show_one_line_per_rank(differ, words,
                                                              group_key: str) -> None:
    port = str(free_port())
    common = ["--nnodes", "2", "--master-addr", "127.0.0.1", "--master-port", port,
              "--timeout", "2", "-n", "1"]
    launchers = [subprocess.Popen(
        [sys.executable, "-m", "gossip.run", *common, "--node-rank", str(node),
         *differ[2 * node:2 * node + 2], MET], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        text=True, env=_env()) for node in (0, 1)]
    try:
        results = [p.communicate(timeout=WAIT_S) for p in launchers]
    finally:
        for p in launchers:
            p.kill()
            p.wait(timeout=WAIT_S)
    for node, (p, (out, err)) in enumerate(zip(launchers, results)):
        assert p.returncode == 1, err
        assert "Traceback" not in err, err
        lines = _rank_lines(err)
        assert len(lines) == 1 and lines[0].startswith(
            f"[rank {node}] RendezvousError: rank {node}"), err
        assert words[node] in lines[0] and f"127.0.0.1:{port}" in lines[0], lines[0]
        assert _summary(err)[0].startswith(f"gossip run: rank {node} failed with exit code 1 "
                                           "(RendezvousError: "), err


@pytest.mark.parametrize("how", ["exit", "sigkill"])
def test_a_peer_ending_without_close_leaves_no_socket_file(how: str) -> None:
    # No gossip launcher to clean up after it (torchrun's worker leaving by os._exit, a
    # process of the test's own): its ipc socket must go with it. Before: a file in TMPDIR
    # each time (~12 in /tmp after a run of the tests, from test_torch_backend's rank 2 and
    # the torchrun and SIGKILLed-joiner tests of test_membership).
    folder = tempfile.mkdtemp(prefix="g")
    try:
        proc = subprocess.run([sys.executable, _script("exit_without_close.py"), how],
                              capture_output=True, text=True, timeout=WAIT_S,
                              env=_env(TMPDIR=folder))
        left = os.listdir(folder)
    finally:
        for name in os.listdir(folder):
            os.unlink(os.path.join(folder, name))
        os.rmdir(folder)
    assert proc.returncode == (-signal.SIGKILL if how == "sigkill" else 0), proc.stderr
    endpoint = proc.stdout.split()[1]
    assert left == [], left
    if sys.platform.startswith("linux"):   # an abstract socket: gone with its process
        name = endpoint[len("ipc://"):]
        assert name.startswith("@gossip-"), endpoint
        assert name not in Path("/proc/net/unix").read_text()
