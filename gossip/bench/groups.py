"""A group of measuring processes that stays up for a whole ``gossip bench`` run and measures
one size at a time, on command: how rows stream (each printed as soon as its size is measured
by ours and by the baselines) and how Ctrl-C stops everything.

    group = Group("gloo", n, lambda ends: supervise(worker, n, args=(..., ends), ...))
    group.start(); group.ready(60)           # every process up (torch imported, connected)
    per_rank = group.measure((nbytes, warmup, iters, k), limit)
    group.close()                            # or close(abort=True) on error or Ctrl-C

Why long-lived groups rather than one run of processes per size: a Gloo process imports torch
(2-6 s for 4 of them on 2 CPUs, measured), which per size would dominate a run; and why not
one run over all sizes as before: a row needs ours and the baselines' figures for its size,
so the implementations take turns size by size, each waiting idle (blocked on its pipe, no
CPU) while another measures. Each group's processes start, and connect, before anything is
measured, so no start-up overlaps a measurement.

Each process first calls ``announce`` (its pid, so that even a process still starting up can
be stopped), sets up (imports, connects), then runs ``serve``: it says it is ready, then
answers every task ``(bytes, warm-up, iterations, messages per iteration)`` with what its
``measure`` returns, until it reads None or the pipe closes. The processes are
gossip.launch.supervisor's (through gossip.testing.spawn for gossip peers), supervised in a thread
of this process, so a failing process stops its group and its traceback comes back in the
error.
"""
from __future__ import annotations

import multiprocessing as mp
import os
import signal
import threading
import time
from contextlib import contextmanager
from multiprocessing.connection import wait
from typing import Any, Callable, Iterator, Protocol

from gossip.bench.sizes import STARTUP_LIMIT, size_limit, stream_count

__all__ = ["BenchError", "MeasuringGroup", "Group", "announce", "serve", "run_plan", "stop_all"]

_IDLE_GRACE = 2.0   # seconds an idle group gets to close its peers when a run is aborted
_JOIN_LIMIT = 60.0  # seconds for a group's supervisor to finish once its processes are told


class BenchError(RuntimeError):
    """A benchmark run failed (a process died, timed out or computed a wrong result)."""


def announce(ends: list, rank: int) -> Any:
    """First thing in each process of a group: keep only this rank's pipe and tell the parent
    this process's pid (so that an aborted run can stop a process still starting up, say
    importing torch). Returns the pipe for serve."""
    conn = ends[rank]
    for i, other in enumerate(ends):
        if i != rank:
            other.close()   # only the parent may hold our end: its EOF then means our death
    conn.send(("pid", os.getpid()))
    return conn


def serve(conn: Any, measure: Callable[..., Any], hello: Any = None) -> None:
    """In each process of a group, once set up: say so (with ``hello``, anything the parent
    needs before measuring), then answer the parent's tasks with ``measure(*task)`` until told
    to stop (None) or the parent closes the pipe (an aborted run: return, so the process
    closes its peer as usual)."""
    conn.send(("ready", hello))
    while True:
        try:
            task = conn.recv()
        except EOFError:
            return
        if task is None:
            return
        conn.send(("done", measure(*task)))


class MeasuringGroup(Protocol):
    """What a run asks of a group of measuring processes: Group's interface, which
    gossip.bench.mpi.MpiGroup (the ranks under one mpirun) has too."""

    name: str
    n: int
    #: What each process said when it was ready (after ready()).
    hello: list[Any]

    def start(self) -> None:
        """Start the processes."""

    def ready(self, limit: float) -> None:
        """Wait until every process is set up; BenchError past ``limit`` seconds."""

    def measure(self, task: tuple, limit: float) -> list[Any]:
        """Every rank's result for ``task`` (bytes, warm-up, iterations, k)."""

    def close(self, abort: bool = False) -> None:
        """Stop the processes (``abort``: at once, never raising)."""


class Group:
    """n processes started by ``launch(ends)`` (which runs them to the end: supervise or
    spawn, passing ``ends[rank]`` to serve) in a thread, driven over one pipe per rank."""

    def __init__(self, name: str, n: int, launch: Callable[[list], Any],
                 cleanup: Callable[[], Any] | None = None) -> None:
        self.name, self.n = name, n
        pairs = [mp.Pipe() for _ in range(n)]
        self._ends = [a for a, _ in pairs]            # ours
        child_ends = [b for _, b in pairs]
        self._child_ends: list | None = child_ends   # theirs, until every child has its own
        self._launch, self._cleanup = launch, cleanup
        self._done_r, self._done_w = mp.Pipe(duplex=False)
        self._error: BaseException | None = None
        self._handles: list[Any] = []                 # pidfds (or pids) of the processes
        self.hello: list[Any] = []
        self._ready = False   # every process has set up and serves
        self._busy = False    # a size is being measured
        self._closed = False
        self._thread = threading.Thread(target=self._run, args=(child_ends,),
                                        name=f"bench-{name}", daemon=True)

    def _run(self, child_ends: list) -> None:
        try:
            self._launch(child_ends)
        except BaseException as exc:   # kept for the parent, raised where it waits
            self._error = exc
        finally:
            self._done_w.close()       # wakes a parent waiting on the group

    def start(self) -> None:
        """Start the processes (they connect, then say they are ready)."""
        self._thread.start()

    def ready(self, limit: float) -> None:
        """Wait until every process has said it is ready; BenchError if one failed first or
        ``limit`` seconds pass."""
        self.hello = [hello for _, hello in self._replies(limit, "start")]
        # Every child has its copy of its end now: ours must go, so that a child's death is
        # an EOF here.
        for end in self._child_ends or ():
            end.close()
        self._child_ends = None
        self._ready = True

    def measure(self, task: tuple, limit: float) -> list[Any]:
        """Every rank's ``measure(*task)``, in rank order."""
        self._busy = True
        for conn in self._ends:
            try:
                conn.send(task)
            except OSError:
                break   # a rank is gone: _replies reports the group's failure
        replies = self._replies(limit, f"{task[0]} bytes")
        self._busy = False
        return [result for _, result in replies]

    def _replies(self, limit: float, what: str) -> list[Any]:
        deadline = time.monotonic() + limit
        got: dict[int, Any] = {}
        waiting = {conn: rank for rank, conn in enumerate(self._ends)}
        while waiting:
            left = deadline - time.monotonic()
            if left <= 0:
                raise BenchError(f"{self.name}: ranks {sorted(waiting.values())} did not "
                                 f"finish ({what}) within {limit:g}s")
            ready = wait(list(waiting) + [self._done_r], left)
            for conn in [c for c in ready if c in waiting]:
                try:
                    reply = conn.recv()
                except (EOFError, OSError):
                    raise self._failure(what) from None
                if reply[0] == "pid":
                    self._handles.append(_handle(reply[1]))
                else:
                    got[waiting.pop(conn)] = reply
            if self._done_r in ready and waiting:
                raise self._failure(what)
        return [got[rank] for rank in range(self.n)]

    def _failure(self, what: str) -> BenchError:
        """The group's error, once its supervisor has the outcome."""
        self._thread.join(_JOIN_LIMIT)
        if isinstance(self._error, BenchError):
            return self._error
        if self._error is not None:
            return BenchError(f"{self.name} ({what}): {self._error}")
        return BenchError(f"{self.name}: the processes ended before finishing ({what})")

    def close(self, abort: bool = False) -> None:
        """Stop the group. Normally: tell every process to stop and wait for the supervisor;
        BenchError if it failed. ``abort`` (an error elsewhere, Ctrl-C): close the pipes, so
        idle processes return and close their peers; a group caught measuring or setting up,
        or one not done within _IDLE_GRACE, is killed (the supervisor then removes what
        killed peers leave: ipc socket files, logs). Never raises when aborting."""
        if self._closed:
            return
        self._closed = True
        if abort:
            self._pids_announced()
        else:
            for conn in self._ends:
                try:
                    conn.send(None)
                except OSError:
                    pass
        for conn in self._ends + (self._child_ends or []):
            conn.close()
        if self._thread.ident is None:   # never started
            self._done_w.close()
        if self._thread.is_alive():
            # Busy or still setting up, a process reads its pipe only when done: do not wait.
            idle = self._ready and not self._busy
            if abort and (not idle or not wait([self._done_r], _IDLE_GRACE)):
                self._kill()
            self._thread.join(_JOIN_LIMIT)
            if self._thread.is_alive():
                self._kill()
                self._thread.join(_JOIN_LIMIT)
        for h in self._handles:
            if isinstance(h, int) and h >= 0 and _PIDFD:
                os.close(h)
        self._handles = []
        self._done_r.close()
        if self._cleanup is not None:
            self._cleanup()
        if not abort and self._error is not None:
            raise self._failure("stop")

    def _pids_announced(self) -> None:
        """Take the pids that processes still starting up have sent, unread."""
        for conn in self._ends:
            try:
                while conn.poll(0):
                    reply = conn.recv()
                    if reply[0] == "pid":
                        self._handles.append(_handle(reply[1]))
            except (EOFError, OSError):
                continue

    def _kill(self) -> None:
        for h in self._handles:
            try:
                if _PIDFD:
                    signal.pidfd_send_signal(h, signal.SIGKILL)
                else:
                    os.kill(h, signal.SIGKILL)
            except (ProcessLookupError, OSError):
                pass   # already gone


@contextmanager
def _interrupts_held() -> Iterator[None]:
    """Ctrl-C while stopping processes is held until they are stopped (then handled as it
    would have been): cut short, the stopping would leave peers and their files behind."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    seen: list[int] = []
    previous = signal.signal(signal.SIGINT, lambda signum, frame: seen.append(signum))
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)
        if seen and callable(previous):
            previous(signal.SIGINT, None)
        elif seen and previous == signal.SIG_DFL:
            raise KeyboardInterrupt


def stop_all(groups: dict[str, MeasuringGroup]) -> None:
    """Abort every group left in ``groups`` (emptying it), Ctrl-C held meanwhile."""
    with _interrupts_held():
        while groups:
            groups.pop(next(iter(groups))).close(abort=True)


def run_plan(group: Group, plan, n: int, *, stream=1,
             timeout: float | None = None) -> dict[int, list[Any]]:
    """Start ``group``, measure every size of ``plan`` in turn, stop it: {bytes: every
    rank's result} (the batch use: benchmarks/transport.py). ``timeout``: the limit of each
    size (default size_limit)."""
    group.start()
    try:
        group.ready(STARTUP_LIMIT)
        out = {}
        for nbytes, warmup, iters in plan:
            k = stream_count(stream, nbytes)
            out[nbytes] = group.measure((nbytes, warmup, iters, k),
                                        timeout or size_limit((nbytes, warmup, iters), n, k))
    except BaseException:
        stop_all({group.name: group})
        raise
    group.close()
    return out


# A pidfd names the process itself, never a later one given the same pid.
_PIDFD = hasattr(os, "pidfd_open") and hasattr(signal, "pidfd_send_signal")


def _handle(pid: int) -> int:
    if not _PIDFD:
        return pid
    try:
        return os.pidfd_open(pid)
    except OSError:
        return -1   # already gone (pidfd_send_signal on -1 fails: nothing is killed)
