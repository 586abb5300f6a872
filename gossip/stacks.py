"""Stacks on request: SIGUSR1 makes a peer write every thread's Python stack to its stderr,
and it runs on.

``gossip.init()`` installs the handler (install_stack_dump) unless GOSSIP_STACKS_ON_SIGUSR1
is ``0``; ``gossip run`` passes a SIGUSR1 it gets on to each of its peers that catches the
signal (catches_signal), and to no other: to a process without a handler (one still
importing, before ``gossip.init()``) SIGUSR1 is fatal, and a peer's own children (data
loaders) are not sent it either.

The handler is a Python one: it runs in the main thread as soon as that thread runs Python
again (a wait of the runtime's, a socket's or a lock's, is interrupted for it) and takes every
thread's stack with the interpreter lock held (sys._current_frames), so what it reads cannot
change under it. faulthandler's all-thread dump, which this used before, reads the other
threads' frames from inside the signal handler while they run, and a peer killed itself with
SIGSEGV that way in CI (a frame freed under the reader). A thread in a C call (a socket wait,
a BLAS kernel) shows at the Python line that made the call. Then it writes each watched peer's
flight recorder (its last calls: collectives/flight_recorder.py). Both go straight to the
stderr file descriptor, never through sys.stderr's buffer, which the interrupted code may be
writing to. A main thread inside a C call that never returns to Python does not run the
handler; ``gossip status --stacks`` reads the stacks from the peer's serving thread instead.
A handler already there is never replaced: the user's own, an earlier ``gossip.init()``'s,
or gossip.testing.spawn's (its children register faulthandler on SIGUSR1 into their log).
"""
from __future__ import annotations

import os
import signal
import sys
import threading
import traceback
import weakref
from types import FrameType
from typing import Any, Mapping

__all__ = ["install_stack_dump", "catches_signal", "stacks_requested", "watch", "format_stacks",
           "STACKS_SIGNAL"]

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
    """Make SIGUSR1 write every thread's stack to stderr (format_stacks), where
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
    try:
        signal.signal(signum, _write_stacks)
    except (ValueError, OSError):
        return False
    return True


def format_stacks(current: FrameType | None = None) -> str:
    """Every thread's Python stack, innermost call first, in faulthandler's layout with each
    thread's name: ``Thread 0x... "name" (most recent call first):`` (``Current thread`` for
    the caller's, from ``current`` if given: a signal handler's interrupted frame), then one
    ``  File "...", line N in function`` line per frame. Taken with the interpreter lock
    held, so no frame changes while it is read."""
    names = {t.ident: t.name for t in threading.enumerate()}
    me = threading.get_ident()
    parts = []
    for tid, frame in sys._current_frames().items():
        head = "Current thread" if tid == me else "Thread"
        if tid == me and current is not None:
            frame = current
        lines = [f'{head} 0x{tid:016x} "{names.get(tid, "?")}" (most recent call first):']
        for summary in reversed(traceback.extract_stack(frame)):
            lines.append(f'  File "{summary.filename}", line {summary.lineno} in {summary.name}')
        parts.append("\n".join(lines))
    return "\n\n".join(parts) + "\n"


_watched: "weakref.WeakSet[Any]" = weakref.WeakSet()


def watch(peer: Any) -> None:
    """Write ``peer``'s flight recorder (``peer.transport.recorder``) on SIGUSR1, after the
    stacks, for as long as the peer lives (gossip.init's peers are watched)."""
    _watched.add(peer)


def _write(text: str) -> bool:
    """All of ``text`` to the stderr file descriptor (not through sys.stderr's buffer: the
    code the signal interrupted may be inside a write to it). False if stderr is gone."""
    data = text.encode("utf-8", "replace")
    try:
        fd = sys.stderr.fileno()
        while data:
            data = data[os.write(fd, data):]
    except (AttributeError, ValueError, OSError):
        return False
    return True


def _write_stacks(signum: int, frame: Any) -> None:
    try:
        sys.stderr.flush()   # what was written before the signal comes first, if it can
    except (AttributeError, ValueError, OSError, RuntimeError):
        pass
    if not _write(format_stacks(frame)):
        return
    for peer in list(_watched):
        try:
            text = peer.transport.recorder.describe()
        except Exception as exc:   # a peer closing: say so, write the others
            text = f"(a peer's flight recorder could not be read: {exc})"
        if not _write(text + "\n"):
            return
