"""`gossip bench` prints each row as soon as its size is measured, and on Ctrl-C keeps the
rows printed (and the "# Avg bus bandwidth" line over them), stops every process it started,
leaves no file behind and exits 130. Real subprocesses and signals; every wait is on a
condition with a deadline."""
from __future__ import annotations

import os
import queue
import signal
import subprocess
import sys
import threading

import pytest

from gossip.testing import wait_until

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def data_rows(text: str) -> list[list[str]]:
    return [line.split() for line in text.splitlines() if line.strip()
            and not line.startswith("#")]


def descendants(pid: int) -> set[int]:
    """Every live process below ``pid`` (from /proc)."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                ppid = int(f.read().rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            continue
        children.setdefault(ppid, []).append(int(entry))
    found, todo = set(), [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            found.add(child)
            todo.append(child)
    return found


def alive(pid: int) -> bool:
    """Running (a zombie waiting for a reaper that is not ours counts as gone)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


@pytest.mark.parametrize("target", ["process", "group"])
def test_ctrl_c_keeps_printed_rows_and_stops_every_peer(tmp_path, target):
    """SIGINT once the first row is out: the second size (64 MiB, 50 iterations) is still
    being measured then. ``group`` is a terminal's Ctrl-C: every process gets it."""
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    env = dict(os.environ, TMPDIR=str(tmp))
    proc = subprocess.Popen([sys.executable, "-m", "gossip", "bench", "allreduce", "-n", "2",
                             "--sizes", "4,64M", "--iters", "50", "--warmup", "1"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            cwd=ROOT, env=env, start_new_session=True)
    lines: queue.Queue = queue.Queue()

    def read() -> None:   # stdout line by line as it comes (None: closed)
        for line in proc.stdout:
            lines.put(line)
        lines.put(None)
    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    printed = []
    try:
        while not data_rows("".join(printed)):   # the first row, before anything ends
            line = lines.get(timeout=120)
            assert line is not None, ("ended before a row", proc.wait(30),
                                      proc.stderr.read())
            printed.append(line)
        started = descendants(proc.pid)
        assert started   # the fork server, the peers
        if target == "group":
            os.killpg(proc.pid, signal.SIGINT)
        else:
            proc.send_signal(signal.SIGINT)
        assert proc.wait(timeout=60) == 130
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    reader.join(30)
    while (line := lines.get(timeout=5)) is not None:
        printed.append(line)
    stdout, stderr = "".join(printed), proc.stderr.read()
    (row,) = data_rows(stdout)   # the 4-byte row, kept
    assert row[0] == "4"
    assert stdout.rstrip().splitlines()[-1].startswith("# Avg bus bandwidth")
    interrupted = [line for line in stderr.splitlines() if "interrupted" in line]
    assert interrupted == ["gossip bench: interrupted after 1 of 2 sizes; every peer was "
                           "stopped"], stderr
    assert "Traceback" not in stderr, stderr
    wait_until(lambda: not any(alive(pid) for pid in started), 30,
               what="the end of every process the bench started")
    wait_until(lambda: not os.listdir(tmp), 30, what=f"an empty TMPDIR: {os.listdir(tmp)}")
