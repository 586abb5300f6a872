"""c10d Work objects over gossip's handles (collectives.work.Work), for the torch.distributed
backend (process_group.py): what ``dist.all_reduce(..., async_op=True)`` returns, and the
future DDP's communication hooks chain on."""
from __future__ import annotations

import datetime
import functools
import threading
from typing import Any, Callable

import torch
import torch.distributed as dist

from collectives.work import Work as OurWork

__all__ = ["GossipWork", "joined", "seconds"]


def seconds(timeout: Any) -> float | None:
    """A c10d timeout (timedelta; zero or absent: none) in seconds."""
    if timeout is None:
        return None
    value = timeout.total_seconds() if isinstance(timeout, datetime.timedelta) \
        else float(timeout)
    return value if value > 0 else None


class GossipWork(dist.Work):
    """A c10d Work over gossip handles: done when all of them are, failed with the first
    error; its future's value is ``result`` (the call's tensors)."""

    def __init__(self, handles: list[OurWork], result: Any,
                 finish: Callable[[], None] | None = None) -> None:
        super().__init__()
        self._handles = handles
        self._result = result
        self._finish = finish   # copies back into the caller's tensors, once all succeeded
        self._future: torch.futures.Future = torch.futures.Future()
        self._error: BaseException | None = None
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
        try:
            for handle in self._handles:
                handle.wait(0)   # (done: raises its error, if any)
            if self._finish is not None:
                self._finish()
        except BaseException as exc:
            self._error = exc
            self._future.set_exception(exc)
            return
        self._future.set_result(self._result)

    def wait(self, timeout: Any = None) -> bool:
        limit = seconds(timeout)
        for handle in self._handles:
            handle.wait(limit)   # raises the operation's error (PeerLost, ...)
        self._future.wait()        # the copy back, if any, has run
        if self._error is not None:
            raise self._error
        return True

    def result(self) -> list:
        """The call's tensors (c10d's Work.result(): its outputs, flat), once it completed."""
        return _flat_tensors(self._result)

    def is_completed(self) -> bool:
        return self._future.done()

    def is_success(self) -> bool:
        return self._future.done() and self._error is None

    def exception(self) -> Any:
        return self._error

    def get_future(self) -> torch.futures.Future:
        return self._future


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


