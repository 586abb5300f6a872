"""c10d Work objects over gossip's handles (collectives.work.Work), for the torch.distributed
backend (process_group.py): what ``dist.all_reduce(..., async_op=True)`` returns, and the
future DDP's communication hooks chain on."""
from __future__ import annotations

import datetime
import functools
import logging
import queue
import threading
from typing import Any, Callable

import torch
import torch.distributed as dist

from collectives.errors import GossipError
from collectives.work import Work as OurWork

__all__ = ["GossipWork", "joined", "seconds", "as_c10d_error"]

log = logging.getLogger("gossip")


def seconds(timeout: Any) -> float | None:
    """A c10d timeout (timedelta; zero or absent: none) in seconds."""
    if timeout is None:
        return None
    value = timeout.total_seconds() if isinstance(timeout, datetime.timedelta) \
        else float(timeout)
    return value if value > 0 else None


_C10D_CLASSES: dict[type, type] = {}


def as_c10d_error(exc: BaseException) -> BaseException:
    """A gossip error as torch.distributed's backends raise theirs: the same object, its class
    made a subclass of both its own (``except gossip.PeerLost`` still catches it) and
    ``torch.distributed.DistBackendError`` (a RuntimeError, what torch's own tests and
    callers catch). Anything else is returned as it is."""
    if not isinstance(exc, GossipError) or isinstance(exc, dist.DistBackendError):
        return exc
    cls = type(exc)
    both = _C10D_CLASSES.get(cls)
    if both is None:
        def __reduce__(self: BaseException) -> Any:   # pickled as its own class
            return (cls, self.args, self.__dict__ or None)
        both = _C10D_CLASSES[cls] = type(cls.__name__, (cls, dist.DistBackendError), {
            "__module__": cls.__module__, "__doc__": cls.__doc__, "__reduce__": __reduce__})
    try:
        exc.__class__ = both
    except TypeError:   # (a layout that cannot take it: left as it is)
        pass
    return exc


class _Completer:
    """The threads that complete c10d futures, so that their callbacks (which torch runs in
    the thread that completes the future) never run on the thread that executes gossip's
    collectives: a callback that starts another collective and waits for it (PowerSGD's,
    DDP's ``fut.then(...)``) would wait for that thread forever. A thread is added whenever
    none is idle (a callback may wait on a later future, which then needs another thread);
    they are few: as many as callbacks wait at once, and one idle for IDLE_EXIT seconds
    ends."""

    IDLE_EXIT = 10.0

    def __init__(self) -> None:
        self._queue: queue.SimpleQueue = queue.SimpleQueue()
        self._lock = threading.Lock()
        self._idle = 0   # threads waiting for a task and not yet promised one

    def submit(self, fn: Callable[[], None]) -> None:
        with self._lock:
            promised = self._idle > 0
            if promised:
                self._idle -= 1
        if promised:
            self._queue.put(fn)
        else:
            threading.Thread(target=self._serve, args=(fn,), daemon=True,
                             name="gossip-c10d futures").start()

    def _serve(self, fn: Callable[[], None]) -> None:
        while True:
            try:
                fn()
            except BaseException:   # (set_result itself: torch keeps a callback's errors)
                log.exception("completing a torch.distributed future failed")
            with self._lock:
                self._idle += 1
            while True:
                try:
                    fn = self._queue.get(timeout=self.IDLE_EXIT)
                    break
                except queue.Empty:
                    with self._lock:
                        # Waiting threads are the idle ones and those promised a task: one
                        # idle may go, and every promised task still finds a thread.
                        if self._idle > 0:
                            self._idle -= 1
                            return


_COMPLETER = _Completer()


class GossipWork(dist.Work):
    """A c10d Work over gossip handles: done when all of them are, failed with the first
    error; its future's value is ``result`` (the call's tensors).

    The future is made when first asked for (a blocking call never asks: it waits on the
    Work, with no thread hand-off); one asked for before the Work is done is completed by
    the completer's threads, never by the thread that executes the collectives."""

    def __init__(self, handles: list[OurWork], result: Any,
                 finish: Callable[[], None] | None = None, *,
                 source: Callable[[], int] | None = None) -> None:
        super().__init__()
        self._handles = handles
        self._result = result
        self._finish = finish   # copies back into the caller's tensors, once all succeeded
        self._source = source   # a receive from any source: the rank it received from
        self._future: torch.futures.Future | None = None
        self._error: BaseException | None = None
        self._done = threading.Event()   # the copy back ran (or the call failed)
        self._left = len(handles)
        self._lock = threading.Lock()
        if not handles:
            self._complete()
        for handle in handles:
            handle.add_done_callback(self._one_done)

    def _one_done(self, handle: OurWork) -> None:
        # A handle done already calls back in the caller's thread, the others in the worker's.
        with self._lock:
            self._left -= 1
            last = self._left == 0
        if last:
            self._complete()

    def _complete(self) -> None:
        error = None
        try:
            for handle in self._handles:
                handle.wait(0)   # (done: raises its error, if any)
            if self._finish is not None:
                self._finish()
        except BaseException as exc:
            error = as_c10d_error(exc)
        with self._lock:
            self._error = error
            self._done.set()
            future = self._future
        if future is not None:
            _COMPLETER.submit(functools.partial(self._settle, future))

    def _settle(self, future: torch.futures.Future) -> None:
        if self._error is not None:
            future.set_exception(self._error)
        else:
            future.set_result(self._result)

    def wait(self, timeout: Any = None) -> bool:
        limit = seconds(timeout)
        try:
            for handle in self._handles:
                handle.wait(limit)   # raises the operation's error (PeerLost, ...)
        except GossipError as exc:
            raise as_c10d_error(exc)
        self._done.wait()   # the copy back, if any, has run (the handles are done: it is short)
        if self._error is not None:
            raise self._error
        return True

    def _source_rank(self) -> int:
        """The rank a receive from any source received from, once it completed
        (dist.recv(src=None) asks after wait())."""
        if self._source is None:
            raise RuntimeError("_source_rank: this Work is no receive from any source")
        self.wait()
        return self._source()

    def result(self) -> list:
        """The call's tensors (c10d's Work.result(): its outputs, flat), once it completed."""
        return _flat_tensors(self._result)

    def is_completed(self) -> bool:
        return self._done.is_set()

    def is_success(self) -> bool:
        return self._done.is_set() and self._error is None

    def exception(self) -> Any:
        return self._error

    def get_future(self) -> torch.futures.Future:
        with self._lock:
            future = self._future
            made = future is None
            if future is None:
                future = self._future = torch.futures.Future()
            done = self._done.is_set()
        if made and done:   # (done before: completed here, in the caller's thread)
            self._settle(future)
        return future


def _flat_tensors(value: Any) -> list:
    if isinstance(value, torch.Tensor):
        return [value]
    if isinstance(value, (list, tuple)):
        return [t for item in value for t in _flat_tensors(item)]
    return []


def joined(works: list[GossipWork], result: Any) -> GossipWork:
    """One Work for several: done once each has finished (its copies back included)."""
    handles = []
    for w in works:
        handle = OurWork("coalesced part")
        w.get_future().add_done_callback(functools.partial(_settle, handle))
        handles.append(handle)
    return GossipWork(handles, result)


def _settle(handle: OurWork, future: Any) -> None:
    try:
        future.value()
    except BaseException as exc:
        handle.finish(error=exc)
    else:
        handle.finish()


