"""Sleeping until another process changes a word of shared memory (Linux futex, the shared
kind: keyed by the page of the memfd, so it works between processes that map it at different
addresses), for the on-host calls' waits (algorithms/shm_entry.py): a peer that has yielded
the CPU long enough sleeps here and is woken the moment the awaited counter moves, instead of
polling with sleeps that wake 50-150 us late.

A ``Sleeper`` is an int64 pair in shared memory: [0] the counter, which only its owner
writes; [1] "someone may be asleep on it", which waiters set. ``publish`` stores the counter
and, only when the flag is set, clears it and wakes every sleeper (1.2 us; a flag read costs
0.06). A waiter sets the flag, reads the counter and sleeps only while the low 32 bits still
hold what it read (the kernel compares them as it queues the waiter). x86-64 lets the
waker's read of the flag pass its own store of the counter, so a wake-up can be missed: the
waits are bounded (``wait``'s ``seconds``), so that costs at most one such bound, never a
hang. Where there is no futex (not Linux), ``wait`` sleeps ``seconds``."""
from __future__ import annotations

import ctypes
import platform
import sys
import time

import numpy as np

__all__ = ["available", "publish", "wait"]

_FUTEX_WAIT, _FUTEX_WAKE = 0, 1   # shared (no FUTEX_PRIVATE_FLAG): across processes
_SYS_FUTEX = {"x86_64": 202, "aarch64": 98}.get(platform.machine())
_WAKE_ALL = 0x7FFFFFFF


class _Timespec(ctypes.Structure):
    _fields_ = [("tv_sec", ctypes.c_long), ("tv_nsec", ctypes.c_long)]


def _syscall():
    if not sys.platform.startswith("linux") or _SYS_FUTEX is None:
        return None
    try:
        fn = ctypes.CDLL(None, use_errno=True).syscall
    except (OSError, AttributeError):
        return None
    fn.restype = ctypes.c_long
    fn.argtypes = [ctypes.c_long, ctypes.c_void_p, ctypes.c_int, ctypes.c_uint,
                   ctypes.c_void_p, ctypes.c_void_p, ctypes.c_uint]
    return fn


_SYSCALL = _syscall()


def available() -> bool:
    """Waits sleep on the word itself (Linux x86-64 or aarch64), not for a fixed time."""
    return _SYSCALL is not None


def publish(pair: np.ndarray, value: int) -> None:
    """Store ``value`` as ``pair``'s counter; wake whoever may sleep on it."""
    pair[0] = value
    if pair[1] and _SYSCALL is not None:
        pair[1] = 0
        _SYSCALL(_SYS_FUTEX, pair.ctypes.data, _FUTEX_WAKE, _WAKE_ALL, None, None, 0)


def wait(pair: np.ndarray, below: int, seconds: float) -> None:
    """Sleep while ``pair``'s counter is below ``below``, at most ``seconds``; returns early
    when woken, or at once if the counter already moved (the caller checks again)."""
    if _SYSCALL is None:
        time.sleep(seconds)
        return
    pair[1] = 1
    value = int(pair[0])
    if value >= below:
        return
    timeout = _Timespec(int(seconds), int((seconds % 1.0) * 1e9))
    _SYSCALL(_SYS_FUTEX, pair.ctypes.data, _FUTEX_WAIT, value & 0xFFFFFFFF,
             ctypes.addressof(timeout), None, 0)
