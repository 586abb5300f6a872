"""Cross-memory attach: read another process's memory in one copy (Linux process_vm_readv),
as OpenMPI's vader, UCX and tensorpipe do between processes on one host. The on-host
allreduce (algorithms/shm_allreduce.py) uses it to reduce straight out of its peers' own
arrays: no arena to copy into, no arena in memory.

The kernel allows it where ptrace would be: same user (or CAP_SYS_PTRACE), and, under the
Yama security module's ptrace_scope 1, only from an ancestor or a process the reader's
target declared. ``allow_readers`` makes that declaration (PR_SET_PTRACER_ANY, what UCX and
tensorpipe do): any process of this user may then read this one, which is what the
same-user rule of shared memory already trusts. Where it still fails (ptrace_scope 2 or 3,
seccomp, another user), ``Reader.probe`` says so and the peers keep the arenas.
"""
from __future__ import annotations

import ctypes
import errno
import os
import sys
from typing import Any

__all__ = ["Reader", "available", "allow_readers"]

_PR_SET_PTRACER = 0x59616D61
_PR_SET_PTRACER_ANY = ctypes.c_ulong(-1).value


class _Iovec(ctypes.Structure):
    _fields_ = [("base", ctypes.c_void_p), ("len", ctypes.c_size_t)]


def _libc():
    if not sys.platform.startswith("linux"):
        return None
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        fn = libc.process_vm_readv
    except (OSError, AttributeError):
        return None
    fn.argtypes = [ctypes.c_int, ctypes.POINTER(_Iovec), ctypes.c_ulong,
                   ctypes.POINTER(_Iovec), ctypes.c_ulong, ctypes.c_ulong]
    fn.restype = ctypes.c_ssize_t
    try:
        put = libc.process_vm_writev
    except AttributeError:
        return None
    put.argtypes, put.restype = fn.argtypes, fn.restype
    return libc


_LIBC = _libc()
_allowed = False


def available() -> bool:
    """This system has process_vm_readv (Linux, glibc or musl)."""
    return _LIBC is not None


def allow_readers() -> None:
    """Let other processes of this user read this one under Yama's ptrace_scope 1 (once per
    process; nothing to do without Yama)."""
    global _allowed
    if _allowed or _LIBC is None:
        return
    _allowed = True
    if os.path.exists("/proc/sys/kernel/yama/ptrace_scope"):
        _LIBC.prctl(_PR_SET_PTRACER, ctypes.c_ulong(_PR_SET_PTRACER_ANY), 0, 0, 0)


class Reader:
    """process_vm_readv and process_vm_writev with their two iovecs made once (a call is a
    few microseconds). The kernel allows a write wherever it allows a read (the same ptrace
    access check), so ``probe``'s answer covers both."""

    def __init__(self) -> None:
        self._local, self._remote = _Iovec(), _Iovec()
        self._fn = _LIBC.process_vm_readv if _LIBC is not None else None
        self._put = _LIBC.process_vm_writev if _LIBC is not None else None

    def read(self, pid: int, remote: int, local: int, nbytes: int) -> None:
        """Copy ``nbytes`` at address ``remote`` of process ``pid`` to ``local`` here; OSError
        (with the errno: ESRCH, the process is gone; EPERM, not allowed; EFAULT, not mapped;
        ENOSYS, no process_vm_readv here)."""
        self._move(self._fn, "process_vm_readv from", pid, remote, local, nbytes)

    def write(self, pid: int, remote: int, local: int, nbytes: int) -> None:
        """Copy ``nbytes`` at ``local`` here to address ``remote`` of process ``pid``; OSError
        as ``read``'s (process_vm_writev)."""
        self._move(self._put, "process_vm_writev to", pid, remote, local, nbytes)

    def _move(self, fn: Any, what: str, pid: int, remote: int, local: int,
              nbytes: int) -> None:
        if fn is None:
            raise OSError(errno.ENOSYS, f"{what.split()[0]} is not available here")
        done = 0
        while done < nbytes:
            self._local.base, self._local.len = local + done, nbytes - done
            self._remote.base, self._remote.len = remote + done, nbytes - done
            got = fn(pid, ctypes.byref(self._local), 1, ctypes.byref(self._remote), 1, 0)
            if got <= 0:
                err = ctypes.get_errno() if got < 0 else 14   # (EFAULT: nothing was moved)
                raise OSError(err, f"{what} process {pid} at {remote + done:#x}"
                                   f": {os.strerror(err)}")
            done += got

    def probe(self, pid: int, remote: int) -> bool:
        """Whether 8 bytes at ``remote`` of process ``pid`` can be read."""
        if self._fn is None:
            return False
        probe = ctypes.c_int64()
        try:
            self.read(pid, remote, ctypes.addressof(probe), 8)
        except OSError:
            return False
        return True
