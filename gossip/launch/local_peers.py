"""The peer processes of one node under `gossip run`: started, watched, stopped, reaped.

The first peer to fail stops the others (SIGTERM, then SIGKILL after ``grace`` seconds) and
its exit code becomes the launcher's (128+N for death by signal N, like a shell).
SIGINT/SIGTERM/SIGHUP to the launcher are forwarded to every peer, with the same escalation.
Under ``max_restarts``, a failed peer is started again; once every other peer of this node has
finished (exit 0), the job has ended here: a restart still running is given ``grace`` seconds
to finish (one that rejoined ends at the others' step) and is then stopped, said in a line, not
counted as a failure (one still waiting for the rendezvous would wait out its timeout for a
job that is gone); a peer failing then is not started again.
SIGUSR1 is passed on and nothing stops: each peer that catches it (gossip.init() makes it
write the peer's stacks: gossip/stacks.py) gets it, the peer process alone; a peer without
a handler (still importing, or a program that has none) is not sent it, since it would die.

Why not gossip.launch.supervisor: that one runs Python functions and brings their results back
through pipes, asking each child for a faulthandler stack dump (SIGUSR1) before terminating
it. Here the peers are arbitrary commands: the unit is a process group (a peer's own
children go too), the output is streamed, not collected, SIGUSR1 would kill a program that
did not register it (hence the check above), and the grace between signal and SIGKILL is
cut short by a second signal to the launcher, which only this event loop sees.
"""
from __future__ import annotations

import os
import queue
import signal
import subprocess
import sys
import threading
import time
from functools import partial
from types import FrameType
from typing import IO, Any, Callable, TypeAlias

from collectives.transport.sockets import remove_ipc_files
from gossip.launch.failure_report import FailureReport
from gossip.stacks import STACKS_SIGNAL, catches_signal

__all__ = ["LocalPeers"]

_FORWARDED = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)   # passed on, and the job stops
# Passed on while the job goes on (SIGUSR1: each peer writes its stacks).
_PASSED_ON = tuple(s for s in (STACKS_SIGNAL,) if s is not None)
_HANDLED = _FORWARDED + _PASSED_ON
# What signal.signal takes and returns: a handler, SIG_DFL or SIG_IGN, or None.
_Handler: TypeAlias = Callable[[int, FrameType | None], Any] | int | None
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


# A restarted peer is started by the launcher's main thread while its helper threads run, where
# a preexec_fn is unsafe: this tiny program sets the same death signal, then becomes the peer.
_GUARD = ("import ctypes, os, signal, sys\n"
          "ctypes.CDLL(None).prctl(1, int(signal.SIGTERM), 0, 0, 0)\n"
          "os.getppid() == int(sys.argv[1]) or os._exit(1)\n"
          "os.execvp(sys.argv[2], sys.argv[2:])\n")


def _pump(src: IO[bytes], dst: IO[str] | None, prefix: bytes, lock: threading.Lock,
          feed: Callable[[bytes], list[bytes]], flush: Callable[[], list[bytes]],
          log: IO[bytes] | None = None) -> None:
    """Copy whole lines from a child's pipe to ``dst``, through ``feed`` (the FailureReport:
    a traceback comes out whole, or as one line when it is a consequence of another rank's
    failure); the lock keeps lines of different peers (and of stdout vs stderr on one
    terminal) from interleaving mid-line. ``log``: every line also goes there, unprefixed
    and unfiltered (--log-dir). ``dst`` None: the stream is not shown (--tee), but still
    fed, so the closing line can name the exception."""
    out = getattr(dst, "buffer", None)
    broken = dst is None

    def write(lines: list[bytes]) -> bool:
        try:
            with lock:
                for line in lines:
                    if out is not None:
                        out.write(prefix + line)
                    elif dst is not None:  # a text-only stream (e.g. replaced in tests)
                        dst.write((prefix + line).decode(errors="replace"))
                if out is not None:
                    out.flush()
                elif dst is not None:
                    dst.flush()
            return False
        except (BrokenPipeError, ValueError):
            return True  # our reader went away; peers may still be finishing
    for line in iter(src.readline, b""):
        if not line.endswith(b"\n"):
            line += b"\n"
        if log is not None:
            log.write(line)
            log.flush()
        lines = feed(line)
        if lines and not broken:
            broken = write(lines)   # (once broken, keep draining: the child must not block)
    left = flush()
    if left and not broken:
        write(left)
    src.close()
    if log is not None:
        log.close()


class LocalPeers:
    """The peers of this node: starts them, watches them, stops them, reaps them."""

    def __init__(self, cmd: list[str], nprocs: int, *, first_rank: int, env: dict[str, str],
                 prefix: bool, grace: float, keep_going: bool = False,
                 max_restarts: int = 0, log_dir: str | None = None,
                 tee: list[int] | None = None, verbose: bool = False) -> None:
        self.cmd, self.nprocs, self.first_rank = cmd, nprocs, first_rank
        self.env, self.prefix, self.grace = env, prefix, grace
        self.log_dir = log_dir
        # Per local rank, the streams also shown here (torchrun's --tee: 1 stdout, 2 stderr,
        # 3 both); without a log dir every stream is shown, there being nowhere else.
        self.tee = list(tee) if log_dir and tee is not None else [3] * nprocs
        self.keep_going = keep_going
        # A failed peer is started again, up to this many times per slot, with the same
        # variables and the next GOSSIP_INCARNATION: it rejoins the running job.
        self.max_restarts = max_restarts
        self.restarts = [0] * nprocs
        self.exits: dict[int, int] = {}   # local -> its latest life's exit code, once ended
        self.procs: list[subprocess.Popen] = []
        self.running: set[int] = set()
        # SimpleQueue.put is reentrant, so signal handlers may post to it safely.
        self.events: queue.SimpleQueue = queue.SimpleQueue()
        self.threads: list[threading.Thread] = []
        self.lock = threading.Lock()  # one line at a time on our stdout/stderr
        self.report = FailureReport(verbose)
        self.pids: list[int] = []   # every peer process started, restarts included
        self.pumps: dict[int, list[threading.Thread]] = {}   # local -> its output threads

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
                if self.report.left_out:
                    kept = (f" (and {self.log_dir}/rank*.stderr has them)" if self.log_dir
                            else "")
                    self._say(f"{self.report.left_out} traceback(s) shortened to their last "
                              f"line; GOSSIP_LOG_LEVEL=DEBUG shows them whole{kept}")
            finally:
                for signum, handler in saved.items():
                    signal.signal(signum, handler)

    def _install_handlers(self) -> dict[int, _Handler]:
        if threading.current_thread() is not threading.main_thread():
            return {}
        saved: dict[int, _Handler] = {}
        for signum in _HANDLED:
            if signal.getsignal(signum) is signal.SIG_IGN:
                continue  # e.g. SIGHUP under nohup: peers inherit the ignore, as they should
            saved[signum] = signal.signal(
                signum, lambda s, _frame: self.events.put(("signal", s, 0)))
        return saved

    def _start(self) -> None:
        hook = _death_signal_hook(os.getpid())
        for local in range(self.nprocs):
            self.procs.append(self._popen(local, self.cmd, hook))
            self.running.add(local)
        # Threads start after every fork: preexec_fn is only safe while we are single-threaded.
        for local, p in enumerate(self.procs):
            self._follow(local, p)

    def _popen(self, local: int, cmd: list[str], hook=None) -> subprocess.Popen:
        rank = self.first_rank + local
        env = dict(self.env, RANK=str(rank), LOCAL_RANK=str(local),
                   GOSSIP_INCARNATION=str(self.restarts[local]))
        pipe = subprocess.PIPE if self.prefix or self.log_dir else None
        # Own session: a terminal's Ctrl-C reaches only the launcher, which forwards it
        # once (otherwise peers would get it twice). That also takes peers off the
        # terminal, so stdin could not be read anyway: give them /dev/null.
        p = subprocess.Popen(cmd, env=env, stdin=subprocess.DEVNULL, stdout=pipe,
                             stderr=pipe, start_new_session=True, preexec_fn=hook)
        self.pids.append(p.pid)
        return p

    def _follow(self, local: int, p: subprocess.Popen) -> None:
        self._thread(self._wait_one, local, p)
        if self.prefix or self.log_dir:
            rank = self.first_rank + local
            tag = f"[rank {rank}] ".encode() if self.prefix else b""
            flush = partial(self.report.flush, rank)
            shown = self.tee[local]
            self.pumps[local] = [
                self._thread(_pump, p.stdout, sys.stdout if shown & 1 else None, tag,
                             self.lock, partial(self.report.feed, rank, 0), flush,
                             self._log(rank, "stdout")),
                self._thread(_pump, p.stderr, sys.stderr if shown & 2 else None, tag,
                             self.lock, partial(self.report.feed, rank, 1), flush,
                             self._log(rank, "stderr"))]

    def _log(self, rank: int, stream: str) -> IO[bytes] | None:
        """LOG_DIR/rank{R}.{stream}, appended to (a restart's lines after a marker)."""
        if not self.log_dir:
            return None
        f = open(os.path.join(self.log_dir, f"rank{rank}.{stream}"), "ab")
        start = self.restarts[rank - self.first_rank]
        if start:
            f.write(f"--- gossip run: rank {rank} started again (restart {start}) ---\n"
                    .encode())
        return f

    def _restart(self, local: int) -> None:
        self.restarts[local] += 1
        guarded = self.cmd
        if sys.platform.startswith("linux"):
            guarded = [sys.executable, "-c", _GUARD, str(os.getpid()), *self.cmd]
        p = self.procs[local] = self._popen(local, guarded)
        self.running.add(local)
        self._follow(local, p)

    def _thread(self, target: Callable, *args: object) -> threading.Thread:
        def body() -> None:
            if hasattr(signal, "pthread_sigmask"):
                signal.pthread_sigmask(signal.SIG_BLOCK, _HANDLED)  # see _POLL_S
            target(*args)
        t = threading.Thread(target=body, daemon=True)
        t.start()
        self.threads.append(t)
        return t

    def _why(self, local: int) -> str:
        """`` (ValueError: ...)``: the exception the failed peer's last traceback ended with
        (its output read to the end first, for at most a moment)."""
        deadline = time.monotonic() + _READER_JOIN_S
        for t in self.pumps.get(local, []):
            t.join(max(0.0, deadline - time.monotonic()))
        rank = self.first_rank + local
        exception = self.report.exception_of(rank)
        if not self.tee[local] & 2 and self.log_dir:   # not shown here: say where it is
            where = os.path.join(self.log_dir, f"rank{rank}.stderr")
            exception = f"{exception}; see {where}" if exception else f"see {where}"
        return f" ({exception})" if exception else ""

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
        ended: float | None = None   # the job ended here: when its late restarts are stopped
        while self.running:
            try:
                kind, who, code = self._next_event(ended)
            except queue.Empty:
                self._stop_late_restarts()
                return failed
            if kind == "signal" and who in _PASSED_ON:
                self._pass_on(who)
                continue
            if kind == "signal":
                self._say(f"got {_signal_name(who)}, stopping {len(self.running)} peer(s)")
                # SIGINT goes on as SIGINT, so Python peers raise KeyboardInterrupt and clean up.
                self._stop(who)
                return 128 + who
            self.running.discard(who)
            self.exits[who] = code
            if ended is None and self._ended_here():
                ended = time.monotonic() + self.grace
            if code != 0:
                rank = self.first_rank + who
                how = (f" (killed by {_signal_name(-code)})" if code < 0 else "")
                if self.restarts[who] < self.max_restarts and ended is None:
                    self._say(f"rank {rank} failed with exit code {_exit_code(code)}{how}"
                              f"{self._why(who)}; starting it again (restart {self.restarts[who] + 1} of "
                              f"{self.max_restarts}): it rejoins the running job")
                    self._restart(who)
                    continue
                if self.restarts[who] < self.max_restarts:   # the job ended here first
                    how += "; not started again: the job has ended here"
                if self.keep_going:
                    self._say(f"rank {rank} failed with exit code {_exit_code(code)}{how}"
                              f"{self._why(who)}; {len(self.running)} peer(s) go on "
                              "(--keep-going)")
                    failed = failed or _exit_code(code)
                    continue
                self._say(f"rank {rank} failed with exit code {_exit_code(code)}{how}"
                          f"{self._why(who)}; stopping the other peers")
                self._stop(signal.SIGTERM)
                return _exit_code(code)
        return failed

    def _ended_here(self) -> bool:
        """A peer of this node finished (exit code 0) and every one still running is a
        restart: the job has ended here (a restart still looking for the rendezvous would
        find nobody; one that rejoined ends at the others' step)."""
        return (any(code == 0 for code in self.exits.values())
                and all(self.restarts[local] for local in self.running))

    def _stop_late_restarts(self) -> None:
        """The job ended here ``grace`` seconds ago and restarts still run: stop them."""
        late = ", ".join(f"{self.first_rank + local} (restart {self.restarts[local]})"
                         for local in sorted(self.running))
        finished = ", ".join(str(self.first_rank + local) for local in sorted(self.exits)
                             if self.exits[local] == 0)
        self._say(f"the job ended here: rank(s) {finished} finished (exit code 0), and "
                  f"rank(s) {late} had not finished {self.grace:g} s later (a restart that "
                  "came back after the job had ended has no job to join); stopping it: the "
                  "job's result is the finished peers'")
        self._stop(signal.SIGTERM)

    def _signal(self, signum: int) -> None:
        for local in sorted(self.running):
            try:
                # The whole process group: a peer's own children (data loaders) go too.
                os.killpg(self.procs[local].pid, signum)
            except (ProcessLookupError, PermissionError):
                pass

    def _pass_on(self, signum: int) -> None:
        """Send ``signum`` to each running peer that catches it (the peer process only: its
        children may have no handler), and say which got it; one without a handler is left
        alone, since the signal would end it."""
        sent, skipped = [], []
        for local in sorted(self.running):
            pid = self.procs[local].pid
            rank = self.first_rank + local
            if catches_signal(pid, signum) is False:
                skipped.append(rank)
                continue
            try:
                os.kill(pid, signum)
                sent.append(rank)
            except (ProcessLookupError, PermissionError):
                pass
        name = _signal_name(signum)
        said = f"got {name}: passed on to rank(s) {', '.join(map(str, sent)) or 'none'}"
        if skipped:
            said += (f"; not to rank(s) {', '.join(map(str, skipped))}, which have no "
                     f"{name} handler yet (gossip.init() installs it) and would die of it")
        self._say(said)

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
            if kind == "signal" and who in _PASSED_ON:
                self._pass_on(who)
                continue
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
        self._remove_sockets()

    def _remove_sockets(self) -> None:
        """The ipc socket files of peers that died without closing."""
        remove_ipc_files(self.pids, self.env.get("TMPDIR"))
