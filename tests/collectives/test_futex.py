"""Sleeping on a counter in shared memory (collectives/transport/futex.py), with real
processes mapping one memfd: a sleeper is woken by the owner's publish, not by its own
bound; a wait on a counter that already moved returns at once."""
from __future__ import annotations

import mmap
import multiprocessing as mp
import os

import numpy as np
import pytest

from collectives.transport import futex
from gossip.testing import wait_until

pytestmark = pytest.mark.skipif(not futex.available(), reason="no futex here")

LONG = 120.0   # a sleeper's own bound: the test would time out long before it


def _sleeper(fd: int, below: int, conn) -> None:
    """Map the memfd (at its own address), say so, sleep until the counter reaches
    ``below``, report how many sleeps it took."""
    pair = np.frombuffer(mmap.mmap(fd, 4096), np.int64)[2:4]
    conn.send("mapped")
    sleeps = 0
    while pair[0] < below:
        futex.wait(pair, below, LONG)
        sleeps += 1
    conn.send(sleeps)


def test_a_sleeper_in_another_process_is_woken_by_publish():
    fd = os.memfd_create("futex-test")
    os.ftruncate(fd, 4096)
    pair = np.frombuffer(mmap.mmap(fd, 4096), np.int64)[2:4]
    ctx = mp.get_context("fork")
    ours, theirs = ctx.Pipe()
    child = ctx.Process(target=_sleeper, args=(fd, 3, theirs))
    child.start()
    try:
        assert ours.poll(60) and ours.recv() == "mapped"
        # It is about to sleep, or asleep: it set the flag.
        wait_until(lambda: pair[1], 60, interval=0.001, what="the sleeper's flag")
        futex.publish(pair, 1)   # below its target: it wakes, sees 1, sleeps again
        wait_until(lambda: pair[1], 60, interval=0.001, what="the sleeper's flag again")
        futex.publish(pair, 3)
        assert ours.poll(60), "publish did not wake the sleeper"
        assert ours.recv() >= 2
        assert pair[1] == 0   # the waker cleared the flag
    finally:
        child.join(10)
        if child.is_alive():
            child.kill()
        os.close(fd)


def test_a_wait_on_a_counter_that_moved_returns_at_once_and_publish_without_sleepers():
    pair = np.zeros(2, np.int64)
    futex.publish(pair, 5)   # nobody asleep: no flag, nothing to wake
    assert pair.tolist() == [5, 0]
    futex.wait(pair, 5, LONG)   # already there: returns without sleeping LONG
    futex.wait(pair, 6, 0.001)  # below: sleeps at most its bound
    assert pair[0] == 5
