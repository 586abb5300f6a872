"""The local process supervisor: run ``target(rank, *args)`` in N fresh Python processes on
this machine and bring back each rank's outcome.

    outcomes = supervise(worker, 4, args=(plan,), timeout=60)
    failure = first_failure(outcomes)        # None when every rank reported

Each child gets a result pipe, writes its stdout and stderr to a log file (the tail comes
back in its outcome) and has faulthandler on. The parent polls the pipes and the exit codes;
the first failure (an exception or a non-zero exit, outside ``tolerate``) or the global
deadline stops everyone: each live child is asked to dump its threads' stacks (SIGUSR1), then
terminated, then killed after a grace. A child whose target raises pytest's Skipped reports
``skip`` and exits with SKIP_CODE, so a skip travels back as a skip, never as a pass. A rank
given ``restarts`` is started again when it fails, with the next GOSSIP_INCARNATION (a peer
killed and started again rejoins the running job: `gossip demo --kill`).

Used by gossip.testing.spawn (peer processes), by the bench's gossip and baseline runs (Gloo,
plain pyzmq) and by benchmarks/policies.py's torch.distributed runs. ``gossip run``
(gossip.launch.launcher) supervises arbitrary commands instead: see its docstring.
"""
from __future__ import annotations

import faulthandler
import logging
import multiprocessing as mp
import os
import random
import select
import signal
import socket
import sys
import tempfile
import threading
import time
import traceback
from dataclasses import dataclass, field
from multiprocessing.connection import wait as wait_any
from typing import Any, Callable, Iterable, Mapping

from collectives.transport.sockets import remove_ipc_files
from gossip.logs import EVENTS_LOGGER, configure_logging

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
    """A TCP port that was free a moment ago on ``host``, below the kernel's ephemeral range
    when it can: a port bind(0) hands out is in that range, where every connect and every
    other bind(0) (each peer's data socket) may take it before its user binds it (seen:
    "Address already in use" at a test's rendezvous while the suite ran)."""
    low = _ephemeral_low()
    for _ in range(64):
        port = random.randrange(10_000, low) if low > 10_000 else 0
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            try:
                s.bind((host, port))
            except OSError:
                continue   # in use: try another
            return s.getsockname()[1]
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def _ephemeral_low() -> int:
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
            return int(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        return 0   # unknown: let the kernel choose


@dataclass
class PeerOutcome:
    """How one rank's process ended (or stands): its ``status``, its function's ``result``, the
    formatted traceback of an ``error``, its exit code and the tail of its output; a rank
    started again keeps the outcomes of its earlier starts in ``earlier``."""

    rank: int
    status: str = "running"   # ok | error | skip | died | killed | stopped | running
    result: Any = None
    error: str = ""           # the formatted traceback
    exitcode: int | None = None
    output: str = ""          # what the process wrote to stdout/stderr (tail)
    noticed: float = float("inf")  # when the supervisor saw it fail (monotonic): first = cause
    incarnation: int = 0      # which start of the rank this is (0: the first; see restarts)
    earlier: list = field(default_factory=list)  # the outcomes of its earlier starts, in order


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
    # The supervisor is not this process's parent (the fork server is): watch its pid, by a
    # pidfd where there is one (it cannot name a reused pid), else by signal 0.
    try:
        handle = os.pidfd_open(parent)
    except (AttributeError, OSError):
        handle = None
    while True:
        if handle is not None:
            if select.select([handle], [], [], _PARENT_POLL)[0]:   # readable: it exited
                os._exit(_ORPHAN_CODE)
            continue
        time.sleep(_PARENT_POLL)
        try:
            os.kill(parent, 0)
        except ProcessLookupError:   # orphaned: the supervisor died, do not linger
            os._exit(_ORPHAN_CODE)
        except PermissionError:
            pass


def _child(target: Callable, rank: int, args: tuple, conn, *, log_path: str, parent: int,
           backstop_s: float, env: dict[str, str], cwd: str) -> None:
    # Forked from the fork server: the supervisor's environment and directory as they are
    # now (not the server's, from its start), and numpy's global generator seeded afresh,
    # as a spawned interpreter's would be (a fork copies the server's state to every child).
    os.environ.clear()
    os.environ.update(env)
    os.chdir(cwd)
    if "numpy" in sys.modules:
        sys.modules["numpy"].random.seed()
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
# What the fork server imports once, so that a child starts as a fork of a process that has
# them (about 10 ms) instead of a fresh interpreter importing them (0.2-0.3 s each, 4 of
# them on 2 cores about 0.8 s before a peer's first line: measured, a trivial 4-peer spawn).
_PRELOAD = ["numpy", "zmq", "msgpack", "gossip", "gossip.launch.supervisor", "gossip.testing"]


#: The longest path of a Unix socket (sun_path, less its NUL), and what multiprocessing adds to
#: the temporary directory for the fork server's socket ("/pymp-XXXXXXXX/listener-XXXXXXXX").
_SOCKET_PATH_MAX = 107
_LISTENER_SUFFIX = 32
_warned_tmpdir = False


def _context() -> Any:
    """multiprocessing's fork server where there is one (a server process started once per
    supervisor process, forking each child from its clean state: no sockets, threads or
    ZeroMQ contexts of the caller's; the caller's environment and directory are handed to
    each child), else spawn. Spawn too, with a line saying why, where the temporary directory
    (TMPDIR) is too long a path for the fork server's socket (which would fail as "AF_UNIX
    path too long")."""
    global _warned_tmpdir
    if "forkserver" not in mp.get_all_start_methods():
        return mp.get_context("spawn")
    tmp = tempfile.gettempdir()
    if len(tmp) + _LISTENER_SUFFIX > _SOCKET_PATH_MAX:
        if not _warned_tmpdir:
            _warned_tmpdir = True
            configure_logging()   # (the events logger: an operator sees it by default)
            logging.getLogger(EVENTS_LOGGER).warning(
                "the temporary directory %r (%d characters, from TMPDIR) is too long for the "
                "fork server's Unix socket (at most %d): starting each peer as a fresh "
                "interpreter instead (slower); set TMPDIR to a shorter directory",
                tmp, len(tmp), _SOCKET_PATH_MAX - _LISTENER_SUFFIX)
        return mp.get_context("spawn")
    ctx = mp.get_context("forkserver")
    ctx.set_forkserver_preload(_PRELOAD)
    return ctx


class _Children:
    """The latest process of every rank, its result pipe and its log file."""

    def __init__(self, target: Callable, args: tuple, name: str, timeout: float) -> None:
        self.target, self.args, self.name = target, args, name
        self.ctx = _context()
        self.logdir = tempfile.mkdtemp(prefix="gossip-spawn-")
        # A child outliving the global deadline (restarted ones too) stops by itself then.
        self.backstop_at = time.monotonic() + timeout + 5 * GRACE
        self.procs: dict[int, tuple[Any, Any, str]] = {}   # rank -> (process, pipe, log)

    def start(self, rank: int, incarnation: int, env: dict[str, str]) -> None:
        recv_end, send_end = self.ctx.Pipe(duplex=False)
        suffix = f".{incarnation}" if incarnation else ""
        path = os.path.join(self.logdir, f"rank{rank}{suffix}.log")
        backstop = max(1.0, self.backstop_at - time.monotonic())
        p = self.ctx.Process(target=_child, args=(self.target, rank, self.args, send_end),
                             kwargs=dict(log_path=path, parent=os.getpid(), backstop_s=backstop,
                                         env={**os.environ, **env}, cwd=os.getcwd()),
                             name=f"{self.name}-{rank}", daemon=True)
        p.start()
        send_end.close()
        self.procs[rank] = (p, recv_end, path)

    def live(self) -> list[tuple[int, Any]]:
        return [(rank, p) for rank, (p, _, _) in sorted(self.procs.items()) if p.is_alive()]

    def reap(self, rank: int, outcome: PeerOutcome) -> None:
        """Kill ``rank``'s process if it still runs, wait for it, and put its exit code and
        output in ``outcome``."""
        p, conn, path = self.procs.pop(rank)
        if p.is_alive():
            p.kill()
        p.join(_REAP_WAIT)
        conn.close()
        if p.exitcode is not None:   # dead: the ipc file of a peer that did not close goes
            remove_ipc_files([p.pid])
        outcome.exitcode = p.exitcode
        outcome.output = _tail(path)
        try:
            os.unlink(path)
        except OSError:
            pass

    def close(self, outcomes: list[PeerOutcome]) -> None:
        for rank in list(self.procs):
            self.reap(rank, outcomes[rank])
        try:
            os.rmdir(self.logdir)
        except OSError:
            pass


def supervise(target: Callable, n: int, *, args: tuple = (), timeout: float,
              tolerate: Iterable[int] = (), name: str = "gossip-peer",
              restarts: Mapping[int, int] | None = None,
              tolerated_grace: float | None = None) -> list[PeerOutcome]:
    """Run ``target(rank, *args)`` for rank 0..n-1, each in a fresh process (forked from
    multiprocessing's fork server, or spawned): no sockets, threads or ZeroMQ contexts
    inherited from the caller. ``target`` and ``args``
    must be picklable (module-level). Returns every rank's outcome once all have reported,
    the first failure outside ``tolerate`` has stopped the rest, or ``timeout`` (seconds, the
    global deadline) has passed (the ranks still running are then ``killed``).

    ``restarts``: rank -> how many times that rank is started again when it fails (an error
    or a death), as ``gossip run --max-restarts`` does: each of its processes has
    GOSSIP_INCARNATION set to its start's number (0, then 1, ...), so a gossip peer started
    again rejoins the running job (gossip/membership/). A failure followed by a restart is
    no failure (it is kept in the outcome's ``earlier``); the last one allowed counts as
    usual. ``tolerated_grace``: once every rank outside ``tolerate`` has reported, the
    tolerated ranks still running get this many seconds, then are ``stopped`` (a restarted
    peer still trying to rejoin a job that has ended); None waits for them."""
    tolerate = frozenset(tolerate)
    restarts = dict(restarts or {})
    children = _Children(target, tuple(args), name, timeout)
    outcomes = [PeerOutcome(rank) for rank in range(n)]
    try:
        for rank in range(n):
            children.start(rank, 0, _incarnation_env(rank, 0, restarts))
        _watch(children, outcomes, timeout, tolerate, restarts, tolerated_grace)
    finally:
        children.close(outcomes)
    return outcomes


def _incarnation_env(rank: int, incarnation: int, restarts: Mapping[int, int]) -> dict:
    # Only the ranks that may restart: the others keep the clock-made incarnation, and a
    # count is only compared with the counts of the same slot.
    return {"GOSSIP_INCARNATION": str(incarnation)} if rank in restarts else {}


def _tail(path: str, limit: int = _OUTPUT_TAIL) -> str:
    try:
        with open(path, errors="replace") as f:
            text = f.read()
    except OSError:
        return ""
    return text if len(text) <= limit else "...\n" + text[-limit:]


def _watch(children: _Children, outcomes: list[PeerOutcome], timeout: float,
           tolerate: frozenset, restarts: dict[int, int],
           tolerated_grace: float | None) -> None:
    deadline = time.monotonic() + timeout
    settle_at: float | None = None   # when the tolerated ranks still running are stopped

    def take_report(rank: int) -> None:
        conn = children.procs[rank][1]
        open_conns.pop(conn, None)
        try:
            kind, result, error = conn.recv()
        except (EOFError, OSError):
            return  # died before reporting; its sentinel tells
        outcomes[rank].status, outcomes[rank].result, outcomes[rank].error = kind, result, error

    def follow(rank: int) -> None:
        p, conn, _ = children.procs[rank]
        sentinels[p.sentinel] = rank
        open_conns[conn] = rank

    sentinels: dict[Any, int] = {}
    open_conns: dict[Any, int] = {}
    for rank in children.procs:
        follow(rank)
    while any(o.status == "running" for o in outcomes):
        now = time.monotonic()
        if now >= deadline:
            _stop_all(children, outcomes, "killed")
            return
        wait = deadline - now
        if tolerated_grace is not None and all(
                o.status == "ok" for o in outcomes if o.rank not in tolerate):
            settle_at = now + tolerated_grace if settle_at is None else settle_at
            if now >= settle_at:
                _stop_all(children, outcomes, "stopped")
                return
            wait = min(wait, settle_at - now)
        for obj in wait_any(list(open_conns) + list(sentinels), timeout=wait):
            if obj in open_conns:
                take_report(open_conns[obj])
            elif obj in sentinels:
                rank = sentinels.pop(obj)
                p, conn, _ = children.procs[rank]
                # Exited: its report may still sit in the pipe.
                if (outcomes[rank].status == "running" and conn in open_conns
                        and conn.poll(_REPORT_WAIT)):
                    take_report(rank)
                if outcomes[rank].status == "running":
                    # A skip whose report was lost is still a skip: its exit code says so.
                    skipped = p.exitcode == SKIP_CODE
                    outcomes[rank].status = "skip" if skipped else "died"
        now = time.monotonic()
        for o in outcomes:
            if o.status in _FAILED and o.noticed == float("inf"):
                o.noticed = now
        for o in list(outcomes):
            if o.status in _FAILED and len(o.earlier) < restarts.get(o.rank, 0):
                _restart(children, outcomes, o, restarts, sentinels, open_conns)
                follow(o.rank)
        if any(o.status in _FAILED and o.rank not in tolerate for o in outcomes):
            _stop_all(children, outcomes, "killed")
            return


def _restart(children: _Children, outcomes: list[PeerOutcome], failed: PeerOutcome,
             restarts: dict[int, int], sentinels: dict, open_conns: dict) -> None:
    """Start ``failed``'s rank again: its old process reaped (exit code and output kept in
    the new outcome's ``earlier``), a new one with the next incarnation."""
    rank = failed.rank
    p, conn, _ = children.procs[rank]
    sentinels.pop(p.sentinel, None)
    open_conns.pop(conn, None)
    children.reap(rank, failed)
    earlier, failed.earlier = failed.earlier, []
    incarnation = len(earlier) + 1
    outcomes[rank] = PeerOutcome(rank, incarnation=incarnation, earlier=[*earlier, failed])
    children.start(rank, incarnation, _incarnation_env(rank, incarnation, restarts))


def _stop_all(children: _Children, outcomes: list[PeerOutcome], status: str) -> None:
    """Dump every live child's stacks, then terminate, then kill."""
    live = children.live()
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
