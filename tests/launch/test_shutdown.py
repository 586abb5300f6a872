"""Shutdown: close() with operations in flight is prompt and fails them clearly; Ctrl-C on
`gossip run -n 4` ends every peer; nothing is left behind (process, thread, socket, ipc file).
(tests/collectives/test_transport.py and tests/launch/test_launcher.py cover close() with
sends queued, and signals to peers that are not gossip peers.)"""
from __future__ import annotations

import glob
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import psutil

import gossip
from gossip.testing import spawn, wait_until
from helpers import ipc_exists, ipc_sockets

REPO = Path(__file__).parents[2]
CLOSE_BOUND_S = 5.0  # generous: the design says about a second, CPUs here are contended


def _leftovers(pid: int, since: float) -> list[str]:
    """ipc socket files of ``pid`` and gossip files in /dev/shm (rings are memfds: none) made
    since ``since`` (time.time()): older ones belong to earlier processes with a reused pid."""
    def recent(path: str) -> bool:
        try:
            return os.stat(path).st_mtime >= since - 1
        except FileNotFoundError:
            return False
    return sorted(ipc_sockets(pid)) + [f for f in glob.glob("/dev/shm/gossip*") if recent(f)]


def close_with_operations_pending(peer):
    if peer.rank == 1:  # never joins: rank 0's operations stay pending until it closes
        peer.barrier()
        try:
            peer.recv(0)
        except gossip.PeerLost:
            return None
        raise AssertionError("rank 0 sent something")
    peer.barrier()
    since = time.time() - 60  # this peer's files are younger than that
    ipc = peer.transport.endpoints["ipc"]
    handles = [peer.allreduce(np.ones(1 << 20), wait=False) for _ in range(3)]
    recv_error = []

    def receive():
        try:
            peer.recv(1)
        except Exception as exc:  # what a thread waiting in recv gets at close()
            recv_error.append(exc)

    receiver = threading.Thread(target=receive)
    receiver.start()
    wait_until(lambda: peer.transport.inbox._slots, 10, what="the receive to start waiting")
    start = time.monotonic()
    peer.close()
    elapsed = time.monotonic() - start
    receiver.join(CLOSE_BOUND_S)
    errors = []
    for h in handles:
        try:
            h.wait(CLOSE_BOUND_S)
            errors.append(None)
        except Exception as exc:
            errors.append(f"{type(exc).__name__}: {exc}")
    after_errors = time.monotonic() - start
    threads = [t.name for t in threading.enumerate() if t is not threading.main_thread()]
    sockets = [c for c in psutil.Process().net_connections(kind="inet")
               if c.status in (psutil.CONN_LISTEN, psutil.CONN_ESTABLISHED)]
    return {"elapsed": elapsed, "after_errors": after_errors, "errors": errors,
            "recv": [f"{type(e).__name__}: {e}" for e in recv_error],
            "receiver_alive": receiver.is_alive(), "threads": threads,
            "sockets": [str(c.laddr) for c in sockets],
            "ipc_left": bool(ipc) and ipc_exists(ipc),
            "leftovers": _leftovers(os.getpid(), since)}


def test_close_with_operations_pending_is_prompt_and_fails_them(tmp_path):
    result = spawn(close_with_operations_pending, n=2, timeout=60, tolerate=[1])[0]
    print(f"\nclose() with 3 allreduces and a recv pending: {result['elapsed']:.3f}s; "
          f"all pending calls failed {result['after_errors']:.3f}s after close() began\n"
          f"  allreduce: {result['errors'][0]}\n  recv: {result['recv'][0]}")
    assert result["elapsed"] < CLOSE_BOUND_S, result
    assert result["after_errors"] < CLOSE_BOUND_S, result
    assert len(result["errors"]) == 3 and all(e and ("PeerLost" in e or "closed" in e)
                                              for e in result["errors"]), result
    assert len(result["recv"]) == 1 and "closed" in result["recv"][0], result
    assert not result["receiver_alive"]
    # Only the harness's own threads are left (its parent watcher), no gossip-* thread.
    assert not [t for t in result["threads"] if t.startswith("gossip-")], result
    assert result["sockets"] == [], result    # every data socket closed
    assert not result["ipc_left"] and result["leftovers"] == [], result


PEER_SCRIPT = '''
import os, sys, numpy as np, gossip
folder = sys.argv[1]
with gossip.init(timeout=30) as peer:
    with open(os.path.join(folder, f"info.{peer.rank}.tmp"), "w") as f:
        f.write(f"{os.getpid()} {peer.transport.endpoints['ipc'] or ''}")
    os.rename(os.path.join(folder, f"info.{peer.rank}.tmp"),
              os.path.join(folder, f"info.{peer.rank}"))
    rounds = 0
    while True:
        x = np.ones(100_000)
        peer.allreduce(x)
        rounds += 1
        if rounds == 3:
            open(os.path.join(folder, f"running.{peer.rank}"), "w").close()
'''


def test_ctrl_c_on_gossip_run_ends_every_peer_and_leaves_nothing(tmp_path):
    since = time.time()
    script = tmp_path / "peer.py"
    script.write_text(PEER_SCRIPT)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(
        filter(None, [str(REPO), os.environ.get("PYTHONPATH", "")])))
    launcher = subprocess.Popen([sys.executable, "-m", "gossip", "run", "-n", "4",
                                 str(script), str(tmp_path)], stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True, env=env,
                                start_new_session=True)
    try:
        def running():
            if launcher.poll() is not None:
                raise AssertionError(f"launcher exited {launcher.returncode}")
            return len(list(tmp_path.glob("running.*"))) == 4
        wait_until(running, 60, what="4 peers in their allreduce loop")
        infos = [(tmp_path / f"info.{r}").read_text().split(" ") for r in range(4)]
        pids = [int(i[0]) for i in infos]
        ipc_paths = [i[1] for i in infos if len(i) > 1 and i[1]]
        children = psutil.Process(launcher.pid).children(recursive=True)
        assert {p.pid for p in children} >= set(pids)
        start = time.monotonic()
        launcher.send_signal(signal.SIGINT)
        out, err = launcher.communicate(timeout=60)
        elapsed = time.monotonic() - start
    finally:
        if launcher.poll() is None:
            launcher.kill()
            launcher.wait(30)
    gone, alive = psutil.wait_procs(children, timeout=10)
    print(f"\nCtrl-C: launcher exited {launcher.returncode} after {elapsed:.2f}s; "
          f"{len(gone)} children gone, {len(alive)} alive")
    for p in alive:
        p.kill()
    assert alive == [], err
    assert launcher.returncode == 128 + signal.SIGINT, err
    assert "KeyboardInterrupt" in err  # every peer got the SIGINT as Python's Ctrl-C
    assert [p for p in ipc_paths if ipc_exists(p)] == []
    assert [f for pid in pids for f in _leftovers(pid, since)] == []
