"""Shared fixtures: leak checks for threads and ipc sockets."""
from __future__ import annotations

import os
import threading

import pytest

from gossip.snapshot import crc
from gossip.testing import wait_until
from helpers import ipc_sockets


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
