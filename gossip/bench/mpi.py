"""The OpenMPI comparison of ``gossip bench --vs mpi``: mpi4py under OpenMPI's mpirun on this
host, over its shared-memory transport (pml ob1, btl self,vader: what OpenMPI picks on one
host, named so that the figures do not depend on what else is installed). The ranks run
gossip.bench.mpi_rank; this side drives them like the other groups (gossip.bench.groups):
started and ready before anything is measured, then one size at a time, idle meanwhile.

    check_mpi()                              # ValueError (one line) without mpi4py / mpirun
    group = mpi_group("allreduce", 4, reduce_op="sum")
    group.start(); group.ready(60)
    per_rank = group.measure((nbytes, warmup, iters, 1), limit)
    group.close()                            # or close(abort=True)

The tasks and replies travel through mpirun's forwarding of stdin and stdout to and from
rank 0 (JSON lines, never pickle); mpirun runs in its own session, so Ctrl-C reaches only
``gossip bench``, which then stops it (mpirun passes SIGTERM on to its ranks).
"""
from __future__ import annotations

import importlib
import json
import os
import select
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from typing import IO, Any

from gossip.bench.groups import BenchError

__all__ = ["MARK", "MPIRUN_ARGS", "INSTALL_HINT", "check_mpi", "MpiGroup", "mpi_group"]

#: mpirun's options: root allowed (containers), more ranks than cores allowed (the peers share
#: the CPUs as ours do), no binding (as ours and Gloo), shared memory between the ranks.
MPIRUN_ARGS = ("--allow-run-as-root", "--oversubscribe", "--bind-to", "none",
               "--mca", "pml", "ob1", "--mca", "btl", "self,vader")
INSTALL_HINT = ("install it with `pip install mpi4py` (building it needs an MPI: on Debian "
                "`apt-get install libopenmpi-dev`), and OpenMPI's mpirun (`apt-get install "
                "openmpi-bin`)")
#: The prefix of rank 0's protocol lines on its stdout (mpirun may print its own lines there).
MARK = "@gossip-bench "
_STOP_GRACE = 10.0   # seconds mpirun gets to stop its ranks before it is killed


def check_mpi() -> None:
    """ValueError, in one line, when ``--vs mpi`` cannot run here: mpi4py not importable or
    no mpirun on PATH. (mpi4py.MPI is not imported: that would initialise MPI here.)"""
    try:
        importlib.import_module("mpi4py")
    except ImportError as exc:
        raise ValueError(f"--vs mpi needs mpi4py, which cannot be imported here ({exc}): "
                         f"{INSTALL_HINT}") from None
    if shutil.which("mpirun") is None:
        raise ValueError(f"--vs mpi needs OpenMPI's mpirun, which is not on PATH: "
                         f"{INSTALL_HINT}")


class MpiGroup:
    """n mpi4py ranks under one mpirun, doing ``op``; a gossip.bench.groups.MeasuringGroup
    (start, ready, measure, close, hello)."""

    def __init__(self, op: str, n: int, reduce_op: str) -> None:
        self.name, self.n = "mpi", n
        self.hello: list[Any] = []
        self._op, self._reduce_op = op, reduce_op
        self._proc: subprocess.Popen | None = None
        self._log = tempfile.TemporaryFile(mode="w+", prefix="gossip-bench-mpi-")
        self._buffer = b""
        self._other: list[str] = []    # stdout lines that were not ours (mpirun's notes)
        self._pidfds: list[int] = []
        self._busy = False
        self._closed = False

    @property
    def command(self) -> list[str]:
        # argv[0] "mpirun", not a path: OpenMPI takes a path as --prefix (/bin/mpirun: "/")
        return ["mpirun", *MPIRUN_ARGS, "-np", str(self.n),
                sys.executable, "-m", "gossip.bench.mpi_rank", self._op, self._reduce_op]

    def start(self) -> None:
        """Start mpirun and its ranks (they import mpi4py and connect, then say so)."""
        env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1")
        self._proc = subprocess.Popen(self.command, stdin=subprocess.PIPE,
                                      stdout=subprocess.PIPE, stderr=self._log, env=env,
                                      start_new_session=True)

    def ready(self, limit: float) -> None:
        """Wait for the ranks' hello (their pids and the MPI library)."""
        hello = self._reply(limit, "start")
        self.hello = [{"library": hello.get("library", "?")}]
        for pid in hello.get("pids", []):
            try:
                self._pidfds.append(os.pidfd_open(int(pid)))
            except (OSError, AttributeError):
                pass

    def measure(self, task: tuple, limit: float) -> list[Any]:
        """Every rank's ``{"times": [...]}`` for ``task`` (bytes, warm-up, iterations, k)."""
        self._busy = True
        self._send(list(task))
        result = self._reply(limit, f"{task[0]} bytes")["result"]
        self._busy = False
        return result

    def _pipes(self) -> tuple[subprocess.Popen, IO[bytes], IO[bytes]]:
        """mpirun and the pipes to rank 0's stdin and from its stdout (made by start)."""
        proc = self._proc
        if proc is None or proc.stdin is None or proc.stdout is None:
            raise BenchError(f"mpi: mpirun -np {self.n} was not started")
        return proc, proc.stdin, proc.stdout

    def _send(self, message: Any) -> None:
        _, stdin, _ = self._pipes()
        try:
            stdin.write((json.dumps(message) + "\n").encode())
            stdin.flush()
        except (BrokenPipeError, OSError):
            pass   # mpirun is gone: _reply says why

    def _reply(self, limit: float, what: str) -> dict:
        """Rank 0's next protocol line, within ``limit`` seconds; BenchError if mpirun ends or
        the time runs out first."""
        deadline = time.monotonic() + limit
        fd = self._pipes()[2].fileno()
        while True:
            while b"\n" in self._buffer:
                line, self._buffer = self._buffer.split(b"\n", 1)
                text = line.decode(errors="replace")
                if text.startswith(MARK):
                    return json.loads(text[len(MARK):])
                self._other = (self._other + [text])[-20:]
            left = deadline - time.monotonic()
            if left <= 0:
                raise BenchError(f"mpi: mpirun -np {self.n} did not finish ({what}) within "
                                 f"{limit:g}s")
            ready, _, _ = select.select([fd], [], [], left)
            if ready:
                chunk = os.read(fd, 65536)
                if not chunk:
                    raise self._failure(what)
                self._buffer += chunk

    def _failure(self, what: str) -> BenchError:
        code: int | None
        try:
            code = self._pipes()[0].wait(_STOP_GRACE)
        except subprocess.TimeoutExpired:
            code = None
        self._log.seek(0)
        output = "\n".join([*self._other, *self._log.read().strip().splitlines()[-30:]])
        ended = "ended" if code is None else f"exited with code {code}"
        return BenchError(f"mpi: mpirun -np {self.n} {ended} before finishing ({what})"
                          + (f"; its output:\n{output.strip()}" if output.strip() else ""))

    def close(self, abort: bool = False) -> None:
        """Stop the ranks: tell them (normally, or when aborting while they are idle), else
        stop mpirun with SIGTERM and, past _STOP_GRACE, kill it and every rank. BenchError
        when a normal stop fails; aborting never raises."""
        if self._closed:
            return
        self._closed = True
        proc = self._proc
        try:
            if proc is None:
                return
            idle = bool(self.hello) and not self._busy
            if not abort or idle:
                self._send(None)
            try:
                if proc.stdin is not None:
                    proc.stdin.close()
            except OSError:
                pass
            code: int | None
            try:
                code = proc.wait(_STOP_GRACE if not abort else (2.0 if idle else 0.0))
            except subprocess.TimeoutExpired:
                code = self._stop(proc)
            if code != 0 and not abort:
                raise self._failure("stop")
        finally:
            if proc is not None and proc.stdout is not None:
                proc.stdout.close()
            for fd in self._pidfds:
                os.close(fd)
            self._pidfds = []
            self._log.close()

    def _stop(self, proc: subprocess.Popen) -> int | None:
        proc.terminate()   # mpirun passes it on to the ranks and cleans up
        try:
            return proc.wait(_STOP_GRACE)
        except subprocess.TimeoutExpired:
            pass
        proc.kill()
        for fd in self._pidfds:   # the ranks outlive a killed mpirun
            try:
                signal.pidfd_send_signal(fd, signal.SIGKILL)
            except OSError:
                pass
        return proc.wait()


def mpi_group(op: str, n: int, *, reduce_op: str) -> MpiGroup:
    """mpi4py under OpenMPI's mpirun doing ``op`` in n ranks, not started."""
    return MpiGroup(op, n, reduce_op)
