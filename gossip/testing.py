"""A harness for multi-process tests on one machine: real peer processes, real sockets on
127.0.0.1, a global deadline, and every peer's traceback when anything goes wrong.

    from gossip.testing import spawn

    def check(peer, size):
        x = np.full(size, peer.rank, dtype=np.float64)
        return peer.allreduce(x).tolist()

    results = spawn(check, n=4, timeout=60, args=(10,))   # one result per rank

The first peer to fail (an exception or a non-zero exit) stops the others: each is asked to
dump its threads' stacks (faulthandler), then terminated, then killed. The SpawnError raised
carries every rank's outcome, traceback and output. A peer whose function calls pytest.skip
makes the whole spawn skip, so a skip is never mistaken for a pass.
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
from dataclasses import dataclass, field
from multiprocessing.connection import wait as wait_any
from typing import Any, Callable

from collectives.errors import GossipError

__all__ = ["spawn", "SpawnError", "SpawnTimeout", "PeerOutcome", "free_port", "wait_until"]

_GRACE = 2.0  # seconds between terminate and kill


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port that was free a moment ago on ``host``."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def wait_until(predicate: Callable[[], Any], timeout: float, *, interval: float = 0.02,
               what: str = "the condition") -> Any:
    """Poll ``predicate`` until it returns something truthy (returned) or ``timeout`` seconds
    pass (TimeoutError naming ``what``). For conditions with no event to wait on, such as a
    file another process writes."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() >= deadline:
            raise TimeoutError(f"{what} did not happen within {timeout:g}s")
        time.sleep(interval)


@dataclass
class PeerOutcome:
    rank: int
    status: str = "running"   # ok | error | skip | died | killed | running
    result: Any = None
    error: str = ""           # the formatted traceback
    exitcode: int | None = None
    output: str = ""          # what the process wrote to stdout/stderr (tail)
    noticed: float = float("inf")  # when the harness saw it fail (monotonic): first = cause


class SpawnError(GossipError):
    """A spawned peer failed; ``outcomes`` holds every rank's status, traceback and output."""

    def __init__(self, message: str, outcomes: list[PeerOutcome]) -> None:
        super().__init__(message)
        self.outcomes = outcomes


class SpawnTimeout(SpawnError, TimeoutError):
    """The spawned peers did not all finish before the global deadline."""


@dataclass
class _Job:
    fn: Callable
    n: int
    port: int
    topology: Any
    args: tuple
    kwargs: dict
    peer_timeout: float | None
    deadline_s: float
    env: dict = field(default_factory=dict)
    init_kwargs: dict = field(default_factory=dict)
    tolerate: frozenset = frozenset()


def _watch_parent(parent: int) -> None:
    while True:
        time.sleep(0.5)
        if os.getppid() != parent:  # orphaned: the harness died, do not linger
            os._exit(70)


def _child(job: _Job, rank: int, conn, log_path: str, parent: int) -> None:
    log = open(log_path, "w", buffering=1)
    os.dup2(log.fileno(), 1)
    os.dup2(log.fileno(), 2)
    sys.stdout = sys.stderr = log
    faulthandler.enable(file=log, all_threads=True)
    faulthandler.register(signal.SIGUSR1, file=log, all_threads=True)
    # Backstop: a peer that outlives the global deadline dumps its stacks and exits by itself.
    faulthandler.dump_traceback_later(job.deadline_s + 5 * _GRACE, exit=True, file=log)
    threading.Thread(target=_watch_parent, args=(parent,), daemon=True).start()
    os.environ.update(job.env)
    os.environ.update({"GOSSIP_RANK": str(rank), "GOSSIP_WORLD_SIZE": str(job.n),
                       "GOSSIP_LOCAL_RANK": str(rank), "LOCAL_WORLD_SIZE": str(job.n),
                       "GOSSIP_RENDEZVOUS": f"tcp://127.0.0.1:{job.port}"})
    peer = None
    try:
        import gossip
        peer = gossip.init(rank=rank, world_size=job.n,
                           rendezvous=f"tcp://127.0.0.1:{job.port}", topology=job.topology,
                           timeout=job.peer_timeout, **job.init_kwargs)
        result = job.fn(peer, *job.args, **job.kwargs)
        conn.send(("ok", result, ""))
        code = 0
    except BaseException as exc:  # everything goes back to the parent
        kind = "skip" if type(exc).__name__ == "Skipped" else "error"
        text = "".join(traceback.format_exception(exc))
        try:
            conn.send((kind, None, text if kind == "error" else str(exc)))
        except Exception:
            pass
        code = 0 if kind == "skip" else 1
    finally:
        if peer is not None:
            try:
                peer.close()
            except Exception:
                traceback.print_exc()
    log.flush()
    os._exit(code)  # skip interpreter teardown: no atexit surprises in peers


def _tail(path: str, limit: int = 6000) -> str:
    try:
        with open(path, errors="replace") as f:
            text = f.read()
    except OSError:
        return ""
    return text if len(text) <= limit else "...\n" + text[-limit:]


def spawn(fn: Callable, n: int = 4, *, timeout: float = 60.0, topology: Any = None,
          args: tuple = (), kwargs: dict | None = None, peer_timeout: float | None = None,
          env: dict[str, str] | None = None, tolerate=(), **init_kwargs) -> list[Any]:
    """Run ``fn(peer, *args, **kwargs)`` in ``n`` peer processes; return each rank's result.

    ``timeout`` is the global deadline for the whole run; ``peer_timeout`` is each peer's
    own operation timeout (default: a third of ``timeout``, so peers report PeerLost before
    the harness has to kill them). ``fn`` and its arguments must be picklable (a module-level
    function). Extra keyword arguments go to gossip.init (key=, transport=, config=).
    ``tolerate``: ranks expected to die or fail (fault-injection tests); the others go on, and
    those ranks' results are None.
    """
    if n < 1:
        raise ValueError(f"n must be at least 1, got {n}")
    job = _Job(fn, n, free_port(), topology, tuple(args), dict(kwargs or {}),
               peer_timeout if peer_timeout is not None else max(5.0, timeout / 3), timeout,
               dict(env or {}), init_kwargs, frozenset(tolerate))
    ctx = mp.get_context("spawn")
    logdir = tempfile.mkdtemp(prefix="gossip-spawn-")
    outcomes = [PeerOutcome(rank) for rank in range(n)]
    procs, conns = [], {}
    try:
        for rank in range(n):
            recv_end, send_end = ctx.Pipe(duplex=False)
            path = os.path.join(logdir, f"rank{rank}.log")
            p = ctx.Process(target=_child, args=(job, rank, send_end, path, os.getpid()),
                            name=f"gossip-peer-{rank}", daemon=True)
            p.start()
            send_end.close()
            procs.append((p, path))
            conns[recv_end] = rank
        _supervise(procs, conns, outcomes, timeout, job.tolerate)
    finally:
        for p, _ in procs:
            if p.is_alive():
                p.kill()
            p.join(5)
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
    return _verdict(outcomes, timeout, job.tolerate)


def _supervise(procs, conns, outcomes, timeout: float, tolerate: frozenset) -> None:
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
                if outcomes[rank].status == "running" and conn in open_conns and conn.poll(0.5):
                    take_report(rank)
                if outcomes[rank].status == "running":
                    outcomes[rank].status = "died"
        now = time.monotonic()
        for o in outcomes:
            if o.status in ("error", "died") and o.noticed == float("inf"):
                o.noticed = now
        if any(o.status in ("error", "died") and o.rank not in tolerate for o in outcomes):
            _stop_all(procs, outcomes, "killed")
            return


def _stop_all(procs, outcomes, status: str) -> None:
    """Dump every live peer's stacks, then terminate, then kill."""
    live = [(rank, p) for rank, (p, _) in enumerate(procs) if p.is_alive()]
    for _, p in live:
        try:
            os.kill(p.pid, signal.SIGUSR1)
        except ProcessLookupError:
            pass
    time.sleep(0.3)  # let faulthandler write the stacks
    for rank, p in live:
        if outcomes[rank].status == "running":
            outcomes[rank].status = status
        p.terminate()
    end = time.monotonic() + _GRACE
    for _, p in live:
        p.join(max(0.0, end - time.monotonic()))
    for _, p in live:
        if p.is_alive():
            p.kill()


def _verdict(outcomes: list[PeerOutcome], timeout: float, tolerate: frozenset) -> list[Any]:
    if all(o.status == "ok" or o.rank in tolerate and o.status in ("error", "died")
           for o in outcomes):
        return [o.result if o.status == "ok" else None for o in outcomes]
    skips = [o for o in outcomes if o.status == "skip"]
    if skips and all(o.status in ("ok", "skip") for o in outcomes):
        import pytest
        pytest.skip(f"rank {skips[0].rank}: {skips[0].error}")
    lines = []
    for o in outcomes:
        lines.append(f"--- rank {o.rank}: {o.status} (exit code {o.exitcode})")
        if o.error:
            lines.append(o.error.rstrip())
        if o.output.strip() and o.status != "ok":
            lines.append(f"    output of rank {o.rank}:\n" + o.output.rstrip())
    timed_out = any(o.status == "killed" for o in outcomes) and not any(
        o.status in ("error", "died") for o in outcomes)
    # The headline names the failure seen first (the cause: a peer that died comes before
    # the PeerLost it caused in the others); a tie goes to a death, then to the lower rank.
    failures = [o for o in outcomes if o.status in ("error", "died") and o.rank not in tolerate]
    first = min(failures, key=lambda o: (o.noticed, o.status != "died", o.rank), default=None)
    head = (f"spawned peers did not finish within {timeout:g}s" if timed_out
            else f"rank {first.rank} {'failed' if first.status == 'error' else 'died'} "
                 f"(exit code {first.exitcode})")
    cls = SpawnTimeout if timed_out else SpawnError
    raise cls(head + "\n" + "\n".join(lines), outcomes)
