"""`gossip run`: start N peer processes on this machine, with torchrun's habits.

    gossip run -n 4 train.py --lr 0.1          # or: python -m gossip.run -n 4 train.py ...
    gossip run -n 2 -m mypkg.train             # a module instead of a script
    gossip run --nnodes 2 --node-rank 1 --master-addr node0 -n 8 train.py

Each peer gets torchrun's variables (RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE,
MASTER_ADDR, MASTER_PORT, GROUP_RANK), so ``gossip.init()`` (or torch.distributed) finds the
group. Every output line is prefixed with the peer's rank. The first peer to fail stops the
others (SIGTERM, then SIGKILL after ``grace`` seconds) and its exit code becomes the
launcher's (128+N for death by signal N, like a shell). SIGINT/SIGTERM/SIGHUP to the launcher
are forwarded to every peer, with the same escalation, and the launcher exits 128+signal.

This module must not import torch: it only starts processes, and should start fast.

Why not gossip.supervisor: that one runs Python functions and brings their results back
through pipes, asking each child for a faulthandler stack dump (SIGUSR1) before terminating
it. Here the peers are arbitrary commands: the unit is a process group (a peer's own
children go too), the output is streamed, not collected, SIGUSR1 would kill a program that
did not register it, and the grace between signal and SIGKILL is cut short by a second
signal to the launcher, which only this event loop sees.
"""
from __future__ import annotations

import argparse
import os
import queue
import signal
import subprocess
import sys
import threading
import time
from typing import IO, Callable, Mapping, Sequence

from collectives import defaults
from gossip.supervisor import free_port

__all__ = ["launch", "main", "build_parser", "add_arguments", "run_from_args", "DEFAULT_GRACE"]

DEFAULT_GRACE = defaults.LAUNCHER_GRACE  # seconds between the polite signal and SIGKILL
_MULTI_NODE_PORT = 29500  # torchrun's default, for runs where every node must agree on it
_FORWARDED = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
# These outrank torchrun's variables in gossip.settings: a stale one inherited from the
# launcher's own environment would override the ranks we hand out, so peers never see them.
_OVERRIDES = ("GOSSIP_RANK", "GOSSIP_WORLD_SIZE", "GOSSIP_LOCAL_RANK", "GOSSIP_RENDEZVOUS",
              "GOSSIP_MASTER_ADDR", "GOSSIP_MASTER_PORT")
_READER_JOIN_S = 2.0  # a grandchild holding a pipe open must not hold the launcher too
# Python runs signal handlers in the main thread, but the kernel may deliver a signal to any
# thread; then the handler waits until the main thread next runs bytecode. Helper threads
# block our signals, and the main thread never sleeps longer than this, as a safety net.
_POLL_S = 0.25


def _exit_code(returncode: int) -> int:
    """Popen's -N (killed by signal N) as a shell reports it: 128+N."""
    return 128 - returncode if returncode < 0 else returncode


def _signal_name(signum: int) -> str:
    try:
        return signal.Signals(signum).name
    except ValueError:
        return f"signal {signum}"


def _death_signal_hook(parent: int) -> Callable[[], None] | None:
    """A preexec_fn that makes the kernel SIGTERM the child if the launcher dies (even by
    SIGKILL, when no cleanup of ours can run). None where prctl is unavailable. The kernel
    ties this to the forking thread, so a peer may get one SIGTERM per launcher thread."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        import ctypes
        prctl = ctypes.CDLL(None, use_errno=True).prctl  # resolved here, not after fork
    except (OSError, AttributeError):
        return None
    pr_set_pdeathsig = 1

    def hook() -> None:
        prctl(pr_set_pdeathsig, int(signal.SIGTERM), 0, 0, 0)
        if os.getppid() != parent:  # the launcher died before prctl took effect
            os._exit(1)
    return hook


def _pump(src: IO[bytes], dst: IO[str], prefix: bytes, lock: threading.Lock) -> None:
    """Copy whole lines from a child's pipe to ``dst``; the lock keeps lines of different
    peers (and of stdout vs stderr on one terminal) from interleaving mid-line."""
    out = getattr(dst, "buffer", None)
    broken = False
    for line in iter(src.readline, b""):
        if broken:
            continue  # keep draining, or the child blocks on a full pipe
        if not line.endswith(b"\n"):
            line += b"\n"
        try:
            with lock:
                if out is not None:
                    out.write(prefix + line)
                    out.flush()
                else:  # a text-only stream (e.g. replaced in tests)
                    dst.write((prefix + line).decode(errors="replace"))
                    dst.flush()
        except (BrokenPipeError, ValueError):
            broken = True  # our reader went away; peers may still be finishing
    src.close()


def _check(nprocs: int, nnodes: int, node_rank: int, master_addr: str | None,
           master_port: int | None, topology: str | None, timeout: float | None,
           key: str | None, grace: float) -> None:
    """Raise ValueError with a one-line message for every input a user can get wrong."""
    if type(nprocs) is not int or nprocs < 1:
        raise ValueError(f"-n must be at least 1, got {nprocs}")
    if type(nnodes) is not int or nnodes < 1:
        raise ValueError(f"--nnodes must be at least 1, got {nnodes}")
    if type(node_rank) is not int or not 0 <= node_rank < nnodes:
        raise ValueError(f"--node-rank {node_rank} is outside 0..{nnodes - 1} (--nnodes {nnodes})")
    if nnodes > 1 and not master_addr:
        raise ValueError("--nnodes > 1 needs --master-addr (the host of node rank 0)")
    if master_port is not None and not 0 < master_port < 65536:
        raise ValueError(f"--master-port {master_port} is not a valid TCP port (1..65535)")
    if timeout is not None and not timeout > 0:
        raise ValueError(f"--timeout must be > 0 seconds, got {timeout}")
    if grace < 0:
        raise ValueError(f"--grace must be >= 0, got {grace}")
    if key is not None and not os.path.isfile(key):
        raise ValueError(f"--key {key}: no such file (make one with `gossip keygen`)")
    if topology is not None:
        import topologies  # numpy only; catches a typo before N peers each fail on it
        try:
            topologies.parse(topology, nnodes * nprocs)
        except ValueError as exc:
            raise ValueError(f"--topology {topology!r}: {exc}") from None


def launch(cmd: list[str], nprocs: int, *, nnodes: int = 1, node_rank: int = 0,
           master_addr: str | None = None, master_port: int | None = None,
           env: Mapping[str, str] | None = None, topology: str | None = None,
           timeout: float | None = None, key: str | None = None, prefix: bool = True,
           grace: float = DEFAULT_GRACE, keep_going: bool = False) -> int:
    """Run ``cmd`` as ``nprocs`` peers of this node; return the launcher's exit code.

    ``cmd`` is the full command line (e.g. ``[sys.executable, "train.py"]``). ``env`` adds to
    the launcher's environment. ``timeout`` (GOSSIP_TIMEOUT) is each peer's operation
    deadline, not a limit on the run. ``keep_going``: a failed peer does not stop the
    others (gossip policies train on around a dead peer); the exit code is then the first
    failure's once all have ended. Raises ValueError for bad arguments, before any process
    starts. Signal forwarding is installed only when called from the main thread.
    """
    _check(nprocs, nnodes, node_rank, master_addr, master_port, topology, timeout, key, grace)
    if not cmd:
        raise ValueError("nothing to run: give a script or -m module")
    addr = master_addr or "127.0.0.1"
    port = master_port or (free_port() if nnodes == 1 else _MULTI_NODE_PORT)
    world = nnodes * nprocs
    base = {k: v for k, v in os.environ.items() if k not in _OVERRIDES}
    base.update(env or {})
    base.update(WORLD_SIZE=str(world), LOCAL_WORLD_SIZE=str(nprocs), MASTER_ADDR=addr,
                MASTER_PORT=str(port), GROUP_RANK=str(node_rank))
    if prefix:
        # Lines reach us through pipes, where Python would hold them in a block buffer (and
        # lose them if the peer is killed). Passed-through output keeps the user's buffering.
        base["PYTHONUNBUFFERED"] = "1"
    if nprocs > 1:
        # torchrun's habit: N peers each spawning one BLAS thread per core oversubscribe.
        base.setdefault("OMP_NUM_THREADS", "1")
    if topology is not None:
        base["GOSSIP_TOPOLOGY"] = topology
    if timeout is not None:
        base["GOSSIP_TIMEOUT"] = str(timeout)
    if key is not None:
        base["GOSSIP_KEY"] = os.path.abspath(key)  # peers may chdir; the path must hold
    return _Group(cmd, nprocs, node_rank * nprocs, base, prefix, grace, keep_going).run()


class _Group:
    """The peers of this node: starts them, watches them, stops them, reaps them."""

    def __init__(self, cmd: list[str], nprocs: int, first_rank: int, env: dict[str, str],
                 prefix: bool, grace: float, keep_going: bool = False) -> None:
        self.cmd, self.nprocs, self.first_rank = cmd, nprocs, first_rank
        self.env, self.prefix, self.grace = env, prefix, grace
        self.keep_going = keep_going
        self.procs: list[subprocess.Popen] = []
        self.running: set[int] = set()
        # SimpleQueue.put is reentrant, so signal handlers may post to it safely.
        self.events: queue.SimpleQueue = queue.SimpleQueue()
        self.threads: list[threading.Thread] = []
        self.lock = threading.Lock()  # one line at a time on our stdout/stderr

    def _say(self, message: str) -> None:
        with self.lock:
            print(f"gossip run: {message}", file=sys.stderr, flush=True)

    def run(self) -> int:
        saved = self._install_handlers()
        try:
            self._start()
            return self._watch()
        finally:
            try:
                self._reap()
            finally:
                for signum, handler in saved.items():
                    signal.signal(signum, handler)

    def _install_handlers(self) -> dict[int, object]:
        if threading.current_thread() is not threading.main_thread():
            return {}
        saved = {}
        for signum in _FORWARDED:
            if signal.getsignal(signum) is signal.SIG_IGN:
                continue  # e.g. SIGHUP under nohup: peers inherit the ignore, as they should
            saved[signum] = signal.signal(
                signum, lambda s, _frame: self.events.put(("signal", s, 0)))
        return saved

    def _start(self) -> None:
        hook = _death_signal_hook(os.getpid())
        pipe = subprocess.PIPE if self.prefix else None
        for local in range(self.nprocs):
            rank = self.first_rank + local
            env = dict(self.env, RANK=str(rank), LOCAL_RANK=str(local))
            # Own session: a terminal's Ctrl-C reaches only the launcher, which forwards it
            # once (otherwise peers would get it twice). That also takes peers off the
            # terminal, so stdin could not be read anyway: give them /dev/null.
            p = subprocess.Popen(self.cmd, env=env, stdin=subprocess.DEVNULL, stdout=pipe,
                                 stderr=pipe, start_new_session=True, preexec_fn=hook)
            self.procs.append(p)
            self.running.add(local)
        # Threads start after every fork: preexec_fn is only safe while we are single-threaded.
        for local, p in enumerate(self.procs):
            self._thread(self._wait_one, local, p)
            if self.prefix:
                tag = f"[rank {self.first_rank + local}] ".encode()
                self._thread(_pump, p.stdout, sys.stdout, tag, self.lock)
                self._thread(_pump, p.stderr, sys.stderr, tag, self.lock)

    def _thread(self, target: Callable, *args: object) -> None:
        def body() -> None:
            if hasattr(signal, "pthread_sigmask"):
                signal.pthread_sigmask(signal.SIG_BLOCK, _FORWARDED)  # see _POLL_S
            target(*args)
        t = threading.Thread(target=body, daemon=True)
        t.start()
        self.threads.append(t)

    def _next_event(self, deadline: float | None = None) -> tuple[str, int, int]:
        """The next exit or signal; queue.Empty once ``deadline`` (monotonic) passes."""
        while True:
            wait = _POLL_S if deadline is None else min(_POLL_S, deadline - time.monotonic())
            if wait <= 0:
                raise queue.Empty
            try:
                return self.events.get(timeout=wait)
            except queue.Empty:
                pass  # a moment of bytecode, for a handler held up by another thread

    def _wait_one(self, local: int, p: subprocess.Popen) -> None:
        self.events.put(("exit", local, p.wait()))

    def _watch(self) -> int:
        """Wait for every peer; on the first failure (unless keep_going) or signal, stop the
        rest."""
        failed = 0
        while self.running:
            kind, who, code = self._next_event()
            if kind == "signal":
                self._say(f"got {_signal_name(who)}, stopping {len(self.running)} peer(s)")
                # SIGINT goes on as SIGINT, so Python peers raise KeyboardInterrupt and clean up.
                self._stop(who)
                return 128 + who
            self.running.discard(who)
            if code != 0:
                rank = self.first_rank + who
                how = (f" (killed by {_signal_name(-code)})" if code < 0 else "")
                if self.keep_going:
                    self._say(f"rank {rank} failed with exit code {_exit_code(code)}{how}; "
                              f"{len(self.running)} peer(s) go on (--keep-going)")
                    failed = failed or _exit_code(code)
                    continue
                self._say(f"rank {rank} failed with exit code {_exit_code(code)}{how}; "
                          f"stopping the other peers")
                self._stop(signal.SIGTERM)
                return _exit_code(code)
        return failed

    def _signal(self, signum: int) -> None:
        for local in sorted(self.running):
            try:
                # The whole process group: a peer's own children (data loaders) go too.
                os.killpg(self.procs[local].pid, signum)
            except (ProcessLookupError, PermissionError):
                pass

    def _stop(self, signum: int) -> None:
        """Send ``signum``, give peers ``grace`` seconds, then SIGKILL; a second signal to
        the launcher skips the wait."""
        self._signal(signum)
        deadline = time.monotonic() + self.grace
        while self.running:
            try:
                kind, who, _ = self._next_event(deadline)
            except queue.Empty:
                break
            if kind == "signal":
                break
            self.running.discard(who)
        if self.running:
            ranks = ", ".join(str(self.first_rank + r) for r in sorted(self.running))
            self._say(f"rank(s) {ranks} still running after {self.grace:g} s: killing")
            self._signal(signal.SIGKILL)

    def _reap(self) -> None:
        """No orphans: whatever happened above, every peer is dead and waited for."""
        for p in self.procs:
            if p.poll() is None:
                try:
                    os.killpg(p.pid, signal.SIGKILL)
                except (ProcessLookupError, PermissionError):
                    p.kill()
            p.wait()
        # Let the last lines through; a grandchild still holding a pipe is not waited for.
        deadline = time.monotonic() + _READER_JOIN_S
        for t in self.threads:
            t.join(max(0.0, deadline - time.monotonic()))


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The options of `gossip run` (shared by `python -m gossip.run`)."""
    parser.add_argument("-n", "--nproc-per-node", dest="nprocs", type=int, default=1,
                        metavar="N", help="peers to start on this node (default 1)")
    parser.add_argument("--nnodes", type=int, default=1, help="number of nodes (default 1)")
    parser.add_argument("--node-rank", type=int, default=0, help="this node's rank (default 0)")
    parser.add_argument("--master-addr", default=None, help="host of global rank 0 "
                        "(default 127.0.0.1; required with --nnodes > 1)")
    parser.add_argument("--master-port", type=int, default=None,
                        help=f"rendezvous port (default: a free port on one node, "
                             f"{_MULTI_NODE_PORT} on several)")
    parser.add_argument("--topology", default=None, help="topology spec, e.g. ring, torus:2x2")
    parser.add_argument("--timeout", type=float, default=None,
                        help="each peer's operation timeout in seconds (GOSSIP_TIMEOUT)")
    parser.add_argument("--key", default=None, help="cluster key file for CURVE (GOSSIP_KEY)")
    parser.add_argument("--grace", type=float, default=DEFAULT_GRACE, help="seconds between "
                        f"SIGTERM/SIGINT and SIGKILL (default {DEFAULT_GRACE:g})")
    parser.add_argument("--keep-going", action="store_true",
                        help="a failed peer does not stop the others (for gossip policies, "
                             "which train on around it); exit code: the first failure's")
    parser.add_argument("--no-prefix", dest="prefix", action="store_false",
                        help="pass peer output through without the [rank k] prefix")
    parser.add_argument("-m", "--module", action="store_true",
                        help="run the target as a module (python -m), not a script")
    parser.add_argument("script", metavar="script|module", help="script (or module with -m)")
    parser.add_argument("script_args", nargs=argparse.REMAINDER,
                        help="arguments for the script, passed through untouched")


def build_parser(prog: str = "gossip run") -> argparse.ArgumentParser:
    """A parser of the `gossip run` options on its own, for `python -m gossip.run`."""
    parser = argparse.ArgumentParser(
        prog=prog, description="Start N gossip peers on this machine, torchrun-style.")
    add_arguments(parser)
    return parser


def run_from_args(args: argparse.Namespace) -> int:
    """Launch from parsed options; ValueError (a one-line message) for bad input."""
    if args.module:
        cmd = [sys.executable, "-m", args.script, *args.script_args]
    else:
        if not os.path.isfile(args.script):
            raise ValueError(f"script {args.script!r} not found")
        cmd = [sys.executable, args.script, *args.script_args]
    return launch(cmd, args.nprocs, nnodes=args.nnodes, node_rank=args.node_rank,
                  master_addr=args.master_addr, master_port=args.master_port,
                  topology=args.topology, timeout=args.timeout, key=args.key,
                  prefix=args.prefix, grace=args.grace, keep_going=args.keep_going)


def main(argv: Sequence[str] | None = None) -> int:
    """`python -m gossip.run ...`: returns the exit code (2 for bad arguments)."""
    args = build_parser().parse_args(argv)
    try:
        return run_from_args(args)
    except KeyboardInterrupt:  # before our handlers were in place: nothing started yet
        return 130
    except ValueError as exc:
        print(f"gossip run: error: {exc}", file=sys.stderr)
        return 2
