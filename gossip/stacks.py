"""Stacks on request: SIGUSR1 makes a peer write every thread's Python stack to its stderr,
and it runs on.

``gossip.init()`` installs the handler (install_stack_dump) unless GOSSIP_STACKS_ON_SIGUSR1
is ``0``; ``gossip run`` passes a SIGUSR1 it gets on to each of its peers that catches the
signal (catches_signal), and to no other: to a process without a handler (one still
importing, before ``gossip.init()``) SIGUSR1 is fatal, and a peer's own children (data
loaders) are not sent it either.

The handler is faulthandler's (chain=False): written from the signal handler itself, so it
shows a peer stuck in a C call (a socket wait, a BLAS kernel) as well as one running Python.
A handler already there is never replaced: the user's own, an earlier ``gossip.init()``'s,
or gossip.testing.spawn's (its children register faulthandler on SIGUSR1 into their log).
"""
from __future__ import annotations

import faulthandler
import os
import signal
import sys
import threading
from typing import Mapping

__all__ = ["install_stack_dump", "catches_signal", "stacks_requested", "STACKS_SIGNAL"]

STACKS_SIGNAL: int | None = getattr(signal, "SIGUSR1", None)
"""The signal that asks for a peer's stacks (None where the platform has no SIGUSR1)."""
_OFF = ("0", "false", "no", "off")


def stacks_requested(env: Mapping[str, str] | None = None) -> bool:
    """GOSSIP_STACKS_ON_SIGUSR1 is not ``0`` (nor false, no, off): the default is on."""
    value = (os.environ if env is None else env).get("GOSSIP_STACKS_ON_SIGUSR1", "")
    return value.strip().lower() not in _OFF


def catches_signal(pid: int, signum: int) -> bool | None:
    """Whether process ``pid`` has a handler for ``signum`` (or ignores it), so that the signal
    does not end it: read from /proc/PID/status (SigCgt, SigIgn), which sees handlers of
    every kind (Python's, faulthandler's, a C library's). None where that cannot be read (no
    /proc, a process gone)."""
    try:
        with open(f"/proc/{pid}/status", "rb") as f:
            fields = dict(line.split(b":", 1) for line in f if b":" in line)
        caught = int(fields[b"SigCgt"].strip(), 16) | int(fields[b"SigIgn"].strip(), 16)
    except (OSError, KeyError, ValueError):
        return None
    return bool(caught >> (signum - 1) & 1)


def install_stack_dump(env: Mapping[str, str] | None = None) -> bool:
    """Make SIGUSR1 write every thread's stack to stderr (faulthandler, all threads), where
    that is allowed and nothing else has the signal: GOSSIP_STACKS_ON_SIGUSR1 is not 0, this
    is the main thread, SIGUSR1's disposition is still the default, and stderr is a file.
    Returns whether it installed the handler; never raises."""
    signum = STACKS_SIGNAL
    if signum is None or not stacks_requested(env):
        return False
    if threading.current_thread() is not threading.main_thread():
        return False   # Python installs handlers from the main thread only
    if signal.getsignal(signum) is not signal.SIG_DFL:
        return False   # a Python handler of the user's (or SIG_IGN): theirs
    if catches_signal(os.getpid(), signum):
        return False   # a handler below Python's view: faulthandler's, a C library's
    try:
        faulthandler.register(signum, file=sys.stderr, all_threads=True, chain=False)
    except (AttributeError, ValueError, RuntimeError, OSError):
        return False   # no stderr, or one without a file descriptor (captured in a test)
    return True
