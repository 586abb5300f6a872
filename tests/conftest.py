"""Shared fixtures: leak checks for threads and ipc sockets; a cluster key for tests that start
processes beside a group."""
from __future__ import annotations

import os
import signal
import threading

import pytest

from collectives.security import write_cluster_key
from gossip.snapshot import crc
from gossip.testing import wait_until
from helpers import ipc_sockets


# A suite started in the background by a non-interactive shell (`pytest &`, nohup) inherits
# SIGINT ignored, and so would every process it starts (an ignored signal stays ignored
# across exec): the tests that send SIGINT to a launcher or a demo would wait out their
# timeouts and fail (4 of them, 420 s). The tests send it on purpose, so the suite takes it
# back: a Python handler is reset to the default in the children at exec.
if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)


def gossip_threads() -> list[str]:
    """The gossip threads alive, but the process's checksum pool (gossip/snapshot/crc.py):
    shared by every peer of the process and idle between sums, it lives as long as the
    process, as torch's intra-op threads do."""
    return [t.name for t in threading.enumerate() if t.name.startswith("gossip-")
            and not t.name.startswith(crc.THREAD_PREFIX)]


@pytest.fixture
def no_leaks():
    """Fail the test if it leaves a gossip thread or an ipc socket of this process."""
    before = ipc_sockets(os.getpid())
    yield
    try:
        wait_until(lambda: not gossip_threads(), 2.0, what="the end of gossip threads")
    except TimeoutError:
        pass
    assert gossip_threads() == []
    assert ipc_sockets(os.getpid()) - before == set()


@pytest.fixture
def group_key(tmp_path, monkeypatch):
    """A cluster key for the test's groups and for the processes it starts beside them (a
    joiner, a restarted member, a second `gossip run` node): written to tmp_path and set as
    GOSSIP_KEY in this process, which gossip.testing.spawn takes as its key and every process
    started with this environment inherits. Returns the key file's path."""
    path = tmp_path / "group.key"
    write_cluster_key(path)
    monkeypatch.setenv("GOSSIP_KEY", str(path))
    return str(path)
