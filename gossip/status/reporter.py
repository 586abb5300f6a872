"""A member's side of ``gossip status``: what this peer answers when asked, from its door's
thread, while its training loop runs (nothing in the answer waits on the loop or on another
peer).

The answer: who it is (rank, name, incarnation, host, pid, view), its progress (steps and
steps per second of its policies, bytes per second), what it runs now and how long it has
waited in it, the sequences each channel has begun and the seconds it waited on each other
rank (the flight recorder's), where its main thread is (the innermost frame of the user's
code), its last calls, and, when asked, every thread's stack. The coordinator's answer also
lists the view's members and their doors, so a client that reached one door finds the
others (gossip/status/job_status.py).

Rates come from samples the door thread takes once a second (``sample``): the last ten
seconds' steps and bytes.
"""
from __future__ import annotations

import os
import socket
import sys
import threading
import time
import traceback
from collections import deque
from typing import Any, Protocol

from collectives import Transport
from collectives.group import View

__all__ = ["StatusReporter", "StatusSource", "where", "thread_stacks", "LIBRARY_DIRS"]

_SAMPLE_EVERY = 1.0     # seconds between the rate samples
_SAMPLES = 11           # ... kept: rates over the last ten seconds
_RECORDS = 32           # the last calls an answer carries
_STACK_CHARS = 64_000   # an answer's stacks, at most (a door message is capped at 1 MiB)

_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
LIBRARY_DIRS = (_ROOT, os.path.dirname(threading.__file__))
"""Where gossip's packages and the standard library live: ``where`` skips their frames."""
_OWN = tuple(os.path.join(_ROOT, d) + os.sep for d in ("gossip", "collectives", "topologies"))


def where(thread_id: int | None = None) -> str | None:
    """The innermost frame of a thread (the main thread by default) that is the user's code,
    not gossip's nor the standard library's: ``file:line in function``; None if the thread
    runs none."""
    frames = sys._current_frames()
    tid = threading.main_thread().ident if thread_id is None else thread_id
    frame = frames.get(tid) if tid is not None else None
    innermost = None
    for summary in traceback.extract_stack(frame) if frame is not None else []:
        path = os.path.abspath(summary.filename)
        if path.startswith(_OWN) or path.startswith(LIBRARY_DIRS[1]) or "site-packages" in path:
            continue
        innermost = f"{summary.filename}:{summary.lineno} in {summary.name}"
    return innermost


def thread_stacks(limit: int = _STACK_CHARS) -> str:
    """Every thread's Python stack, as ``traceback`` prints it, at most ``limit`` chars."""
    names = {t.ident: t.name for t in threading.enumerate()}
    parts = []
    for tid, frame in sys._current_frames().items():
        parts.append(f"Thread {names.get(tid, tid)!s} ({tid}):\n"
                     + "".join(traceback.format_stack(frame)))
    text = "\n".join(parts)
    return text if len(text) <= limit else text[:limit] + "\n... (cut)"


class StatusSource(Protocol):
    """What a status answer reads of a peer (gossip.Peer is one)."""

    @property
    def rank(self) -> int: ...
    @property
    def world_size(self) -> int: ...
    @property
    def job_id(self) -> str: ...
    @property
    def transport(self) -> Transport: ...
    @property
    def view(self) -> View | None: ...
    @property
    def policies(self) -> list[Any]: ...
    def lost_peers(self) -> dict[int, str]: ...


class StatusReporter:
    """What ``peer`` answers to a status request (its door calls ``answer``)."""

    def __init__(self, peer: StatusSource) -> None:
        self._peer = peer
        self._samples: deque[tuple[float, int, int]] = deque(maxlen=_SAMPLES)
        self._next_sample = 0.0
        self._started = time.time()

    def sample(self) -> None:
        """(Door thread, every poll.) Take a rate sample once a second."""
        now = time.monotonic()
        if now < self._next_sample:
            return
        self._next_sample = now + _SAMPLE_EVERY
        self._samples.append((now, self._steps() or 0, self._bytes()))

    def _steps(self) -> int | None:
        steps = None
        for policy in self._peer.policies:
            n = getattr(policy, "step", None)
            if isinstance(n, int):
                steps = max(steps or 0, n)
        return steps

    def _bytes(self) -> int:
        return sum(c.bytes_sent + c.bytes_received for c in list(self._peer.transport.counters))

    def _rates(self) -> tuple[float | None, float | None]:
        if len(self._samples) < 2:
            return None, None
        (t0, s0, b0), (t1, s1, b1) = self._samples[0], self._samples[-1]
        if t1 <= t0:
            return None, None
        # (A view change starts the transport's counters again: no negative rate.)
        steps = max(0, s1 - s0) / (t1 - t0) if self._steps() is not None else None
        return steps, max(0, b1 - b0) / (t1 - t0)

    def answer(self, message: dict) -> dict[str, Any]:
        """(Door thread.) This member's status; with ``message["stacks"]`` its threads'
        stacks; with ``message["members"]`` the view's members and their doors."""
        peer = self._peer
        transport = peer.transport
        recorder = transport.recorder
        steps_per_s, bytes_per_s = self._rates()
        view = peer.view
        out: dict[str, Any] = {
            "rank": peer.rank, "world_size": peer.world_size, "pid": os.getpid(),
            "hostname": socket.gethostname(), "host": transport.endpoints.get("host", ""),
            "job": peer.job_id, "started": self._started, "time": time.time(),
            "view": view.number if view is not None else None,
            "steps": self._steps(), "steps_per_s": steps_per_s, "bytes_per_s": bytes_per_s,
            "policies": [self._policy(p) for p in peer.policies],
            "running": recorder.running(),
            "begun": {str(c): s for c, s in recorder.begun.items()},
            "waited": {str(r): s for r, s in recorder.waited.items()},
            "lost": sorted(peer.lost_peers()),
            "where": where(),
            "calls": recorder.records(int(message.get("last", _RECORDS))),
        }
        if view is not None:
            me = view.members[peer.rank] if peer.rank < len(view.members) else None
            if me is not None:
                out.update(name=me.name, incarnation=me.incarnation, door=me.door)
        if message.get("members") and view is not None:
            out["members"] = [{"rank": r, "name": m.name, "incarnation": m.incarnation,
                               "door": m.door, "host": m.host}
                              for r, m in enumerate(view.members)]
        if message.get("stacks"):
            out["stacks"] = thread_stacks()
        return out

    @staticmethod
    def _policy(policy: Any) -> dict[str, Any]:
        """A policy's name, steps and health figures (its stats(), never the collective
        consensus measurement; the last consensus distance it measured, if any)."""
        try:
            stats = policy.stats()
        except Exception as exc:   # not attached yet, closing: say so, answer the rest
            return {"policy": getattr(policy, "name", type(policy).__name__),
                    "error": f"{type(exc).__name__}: {exc}"}
        keep = ("policy", "steps", "comm_fraction", "bytes_per_step", "skipped_steps",
                "consensus_distance_last", "consensus_distance_estimate", "weight", "staleness", "lost_peers")
        return {k: stats[k] for k in keep if k in stats}
