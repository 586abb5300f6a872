"""Shared fixtures: leak checks for threads and ipc socket files."""
from __future__ import annotations

import glob
import os
import tempfile
import threading

import pytest

from gossip.snapshot import crc
from gossip.testing import wait_until


def gossip_threads() -> list[str]:
    """The gossip threads alive, but the process's checksum pool (gossip/snapshot/crc.py):
    shared by every peer of the process and idle between sums, it lives as long as the
    process, as torch's intra-op threads do."""
    return [t.name for t in threading.enumerate() if t.name.startswith("gossip-")
            and not t.name.startswith(crc.THREAD_PREFIX)]


@pytest.fixture
def no_leaks():
    """Fail the test if it leaves a gossip thread or an ipc socket file of this process."""
    before = set(glob.glob(os.path.join(tempfile.gettempdir(), f"gossip-{os.getpid()}-*.sock")))
    yield
    try:
        wait_until(lambda: not gossip_threads(), 2.0, what="the end of gossip threads")
    except TimeoutError:
        pass
    assert gossip_threads() == []
    after = set(glob.glob(os.path.join(tempfile.gettempdir(), f"gossip-{os.getpid()}-*.sock")))
    assert after - before == set()
