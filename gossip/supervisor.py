"""The local process supervisor: run ``target(rank, *args)`` in N fresh Python processes on
this machine and bring back each rank's outcome.

    outcomes = supervise(worker, 4, args=(plan,), timeout=60)
    failure = first_failure(outcomes)        # None when every rank reported

Each child gets a result pipe, writes its stdout and stderr to a log file (the tail comes
back in its outcome) and has faulthandler on. The parent polls the pipes and the exit codes;
the first failure (an exception or a non-zero exit, outside ``tolerate``) or the global
deadline stops everyone: each live child is asked to dump its threads' stacks (SIGUSR1), then
terminated, then killed after a grace. A child whose target raises pytest's Skipped reports
``skip`` and exits with SKIP_CODE, so a skip travels back as a skip, never as a pass.

Used by gossip.testing.spawn (peer processes), by the bench's gossip and baseline runs (Gloo,
plain pyzmq) and by benchmarks/policies.py's torch.distributed runs. ``gossip run``
(gossip.launcher) supervises arbitrary commands instead: see its docstring.
"""
from __future__ import annotations

import faulthandler
import multiprocessing as mp
import os
import signal
import socket
import sys
import tempfile
import threading
import time
import traceback
from dataclasses import dataclass
from multiprocessing.connection import wait as wait_any
from typing import Any, Callable, Iterable

__all__ = ["PeerOutcome", "supervise", "first_failure", "after_report", "free_port", "GRACE",
           "SKIP_CODE"]

GRACE = 2.0           # seconds between terminate and kill
_DUMP_WAIT = 0.3      # seconds for faulthandler to write the stacks before we terminate
_REPORT_WAIT = 0.5    # an exited child's report may still be in the pipe: wait this long for it
_OUTPUT_TAIL = 6000   # characters of each child's output kept in its outcome
_ORPHAN_CODE = 70     # exit code of a child whose parent went away
_PARENT_POLL = 0.5    # seconds between a child's checks that its parent is still there
_REAP_WAIT = 5.0      # seconds to wait for a killed child to be reaped
SKIP_CODE = 75        # exit code of a child that skipped: a skip is never an exit 0 (a pass)
_FAILED = ("error", "died")


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port that was free a moment ago on ``host``."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return s.getsockname()[1]


@dataclass
class PeerOutcome:
    rank: int
    status: str = "running"   # ok | error | skip | died | killed | running
    result: Any = None
    error: str = ""           # the formatted traceback
    exitcode: int | None = None
    output: str = ""          # what the process wrote to stdout/stderr (tail)
    noticed: float = float("inf")  # when the supervisor saw it fail (monotonic): first = cause


def first_failure(outcomes: Iterable[PeerOutcome],
                  tolerate: frozenset = frozenset()) -> PeerOutcome | None:
    """The failure seen first: the cause (a peer that died comes before the PeerLost it caused
    in the others); a tie goes to a death, then to the lower rank. None if nothing failed."""
    failures = [o for o in outcomes if o.status in _FAILED and o.rank not in tolerate]
    return min(failures, key=lambda o: (o.noticed, o.status != "died", o.rank), default=None)


# ---------------------------------------------------------------------------- in the child
_after_report: list[Callable[[], Any]] = []  # this child's clean-ups; a child runs one target


def after_report(cleanup: Callable[[], Any]) -> None:
    """In a supervised child: run ``cleanup`` once the result (or error) has gone to the
    parent, so a slow or failing clean-up (closing a peer) never delays or hides the report."""
    _after_report.append(cleanup)


def _watch_parent(parent: int) -> None:
    while True:
        time.sleep(_PARENT_POLL)
        if os.getppid() != parent:  # orphaned: the supervisor died, do not linger
            os._exit(_ORPHAN_CODE)


def _child(target: Callable, rank: int, args: tuple, conn, log_path: str, parent: int,
           backstop_s: float) -> None:
    log = open(log_path, "w", buffering=1)
    os.dup2(log.fileno(), 1)
    os.dup2(log.fileno(), 2)
    sys.stdout = sys.stderr = log
    faulthandler.enable(file=log, all_threads=True)
    faulthandler.register(signal.SIGUSR1, file=log, all_threads=True)
    # Backstop: a child that outlives the global deadline dumps its stacks and exits by itself.
    faulthandler.dump_traceback_later(backstop_s, exit=True, file=log)
    threading.Thread(target=_watch_parent, args=(parent,), daemon=True).start()
    try:
        result = target(rank, *args)
        conn.send(("ok", result, ""))
        code = 0
    except BaseException as exc:  # everything goes back to the parent
        kind = "skip" if type(exc).__name__ == "Skipped" else "error"
        text = "".join(traceback.format_exception(exc))
        try:
            conn.send((kind, None, text if kind == "error" else str(exc)))
        except Exception:
            pass
        code = SKIP_CODE if kind == "skip" else 1
    finally:
        for cleanup in reversed(_after_report):
            try:
                cleanup()
            except Exception:
                traceback.print_exc()
    log.flush()
    os._exit(code)  # skip interpreter teardown: no atexit surprises in children


# ---------------------------------------------------------------------------- in the parent
def supervise(target: Callable, n: int, *, args: tuple = (), timeout: float,
              tolerate: Iterable[int] = (), name: str = "gossip-peer") -> list[PeerOutcome]:
    """Run ``target(rank, *args)`` for rank 0..n-1, each in a fresh (spawned) process: no
    sockets, threads or ZeroMQ contexts inherited from the parent. ``target`` and ``args``
    must be picklable (module-level). Returns every rank's outcome once all have reported,
    the first failure outside ``tolerate`` has stopped the rest, or ``timeout`` (seconds, the
    global deadline) has passed (the ranks still running are then ``killed``)."""
    tolerate = frozenset(tolerate)
    ctx = mp.get_context("spawn")
    logdir = tempfile.mkdtemp(prefix="gossip-spawn-")
    outcomes = [PeerOutcome(rank) for rank in range(n)]
    procs, conns = [], {}
    try:
        for rank in range(n):
            recv_end, send_end = ctx.Pipe(duplex=False)
            path = os.path.join(logdir, f"rank{rank}.log")
            p = ctx.Process(target=_child, args=(target, rank, tuple(args), send_end, path,
                                                  os.getpid(), timeout + 5 * GRACE),
                            name=f"{name}-{rank}", daemon=True)
            p.start()
            send_end.close()
            procs.append((p, path))
            conns[recv_end] = rank
        _watch(procs, conns, outcomes, timeout, tolerate)
    finally:
        for p, _ in procs:
            if p.is_alive():
                p.kill()
            p.join(_REAP_WAIT)
        for conn in conns:
            conn.close()
        for rank, (p, path) in enumerate(procs):
            outcomes[rank].exitcode = p.exitcode
            outcomes[rank].output = _tail(path)
            try:
                os.unlink(path)
            except OSError:
                pass
        try:
            os.rmdir(logdir)
        except OSError:
            pass
    return outcomes


def _tail(path: str, limit: int = _OUTPUT_TAIL) -> str:
    try:
        with open(path, errors="replace") as f:
            text = f.read()
    except OSError:
        return ""
    return text if len(text) <= limit else "...\n" + text[-limit:]


def _watch(procs, conns, outcomes, timeout: float, tolerate: frozenset) -> None:
    deadline = time.monotonic() + timeout
    sentinels = {p.sentinel: rank for rank, (p, _) in enumerate(procs)}
    open_conns = dict(conns)
    by_rank = {rank: conn for conn, rank in conns.items()}

    def take_report(rank: int) -> None:
        conn = by_rank[rank]
        open_conns.pop(conn, None)
        try:
            kind, result, error = conn.recv()
        except (EOFError, OSError):
            return  # died before reporting; its sentinel tells
        outcomes[rank].status, outcomes[rank].result, outcomes[rank].error = kind, result, error

    while any(o.status == "running" for o in outcomes):
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            _stop_all(procs, outcomes, "killed")
            return
        for obj in wait_any(list(open_conns) + list(sentinels), timeout=remaining):
            if obj in open_conns:
                take_report(open_conns[obj])
            elif obj in sentinels:
                rank = sentinels.pop(obj)
                conn = by_rank[rank]
                # Exited: its report may still sit in the pipe.
                if (outcomes[rank].status == "running" and conn in open_conns
                        and conn.poll(_REPORT_WAIT)):
                    take_report(rank)
                if outcomes[rank].status == "running":
                    # A skip whose report was lost is still a skip: its exit code says so.
                    skipped = procs[rank][0].exitcode == SKIP_CODE
                    outcomes[rank].status = "skip" if skipped else "died"
        now = time.monotonic()
        for o in outcomes:
            if o.status in _FAILED and o.noticed == float("inf"):
                o.noticed = now
        if any(o.status in _FAILED and o.rank not in tolerate for o in outcomes):
            _stop_all(procs, outcomes, "killed")
            return


def _stop_all(procs, outcomes, status: str) -> None:
    """Dump every live child's stacks, then terminate, then kill."""
    live = [(rank, p) for rank, (p, _) in enumerate(procs) if p.is_alive()]
    for _, p in live:
        try:
            os.kill(p.pid, signal.SIGUSR1)
        except ProcessLookupError:
            pass
    time.sleep(_DUMP_WAIT)
    for rank, p in live:
        if outcomes[rank].status == "running":
            outcomes[rank].status = status
        p.terminate()
    end = time.monotonic() + GRACE
    for _, p in live:
        p.join(max(0.0, end - time.monotonic()))
    for _, p in live:
        if p.is_alive():
            p.kill()
