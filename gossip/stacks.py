"""Stacks on request: SIGUSR1 makes a peer write every thread's Python stack to its stderr,
and it runs on.

``gossip.init()`` installs the handler (install_stack_dump) unless GOSSIP_STACKS_ON_SIGUSR1
is ``0``; ``gossip run`` passes a SIGUSR1 it gets on to each of its peers that catches the
signal (catches_signal), and to no other: to a process without a handler (one still
importing, before ``gossip.init()``) SIGUSR1 is fatal, and a peer's own children (data
loaders) are not sent it either.

The stacks are faulthandler's: written from the signal handler itself, so they show a peer
stuck in a C call (a socket wait, a BLAS kernel) as well as one running Python. It chains to
a Python handler that then writes each watched peer's flight recorder (its last calls:
collectives/flight_recorder.py), as soon as the main thread runs Python again.
A handler already there is never replaced: the user's own, an earlier ``gossip.init()``'s,
or gossip.testing.spawn's (its children register faulthandler on SIGUSR1 into their log).
"""
from __future__ import annotations

import faulthandler
import os
import signal
import sys
import threading
import weakref
from typing import Any, Mapping

__all__ = ["install_stack_dump", "catches_signal", "stacks_requested", "watch", "STACKS_SIGNAL"]

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
        sys.stderr.fileno()
    except (AttributeError, ValueError, OSError):
        return False   # no stderr, or one without a file descriptor (captured in a test)
    # Two handlers: faulthandler's writes the stacks from the signal handler itself (a peer
    # stuck in a C call shows), then chains to Python's, which writes the flight recorders
    # once the main thread runs Python again.
    signal.signal(signum, _write_recorders)
    try:
        faulthandler.register(signum, file=sys.stderr, all_threads=True, chain=True)
    except (AttributeError, ValueError, RuntimeError, OSError):
        signal.signal(signum, signal.SIG_DFL)
        return False
    return True


_watched: "weakref.WeakSet[Any]" = weakref.WeakSet()


def watch(peer: Any) -> None:
    """Write ``peer``'s flight recorder (``peer.transport.recorder``) on SIGUSR1, after the
    stacks, for as long as the peer lives (gossip.init's peers are watched)."""
    _watched.add(peer)


def _write_recorders(signum: int, frame: Any) -> None:
    for peer in list(_watched):
        try:
            text = peer.transport.recorder.describe()
        except Exception as exc:   # a peer closing: say so, write the others
            text = f"(a peer's flight recorder could not be read: {exc})"
        try:
            sys.stderr.write(text + "\n")
            sys.stderr.flush()
        except (OSError, ValueError):
            return
