"""Handles for non-blocking operations and the executor that runs them in order.

A non-blocking call returns a Work handle at once; the operation runs on the communicator's
worker thread, one after another in call order (every peer assigned sequence numbers in the
same order, so their mailboxes match). ``wait(timeout)`` and ``done()`` are the
blocking/non-blocking twins of the call.
"""
from __future__ import annotations

import logging
import queue
import threading
from typing import Any, Callable

from collectives import defaults
from collectives.errors import OperationTimeout

__all__ = ["Work", "Executor"]

log = logging.getLogger("collectives")


class Work:
    """The handle of one operation in flight."""

    __slots__ = ("description", "_event", "_result", "_error", "_callbacks", "_lock")

    def __init__(self, description: str) -> None:
        self.description = description
        self._event = threading.Event()
        self._result: Any = None
        self._error: BaseException | None = None
        self._callbacks: list[Callable[["Work"], None]] = []
        self._lock = threading.Lock()

    def done(self) -> bool:
        """True once the operation finished (successfully or not); never blocks."""
        return self._event.is_set()

    def wait(self, timeout: float | None = None) -> Any:
        """Block until the operation finished and return its result (the array, in place), or
        raise its error. ``timeout`` bounds this wait only; the operation's own deadline (the
        peer's timeout) still applies inside it."""
        if not self._event.wait(timeout):
            raise OperationTimeout(f"{self.description} did not finish within {timeout:g}s "
                                   "(it is still running; wait again or raise the timeout)")
        if self._error is not None:
            raise self._error
        return self._result

    def join(self, timeout: float | None = None) -> bool:
        """Block until the operation finished, whatever its outcome (its result or error stays
        for ``wait``); False if ``timeout`` seconds passed first."""
        return self._event.wait(timeout)

    def add_done_callback(self, fn: Callable[["Work"], None]) -> None:
        """Call ``fn(work)`` once the operation finished (at once if it has), in the thread
        that finished it: keep it short (it delays the next operation). An error it raises is
        logged, not propagated."""
        with self._lock:
            if not self._event.is_set():
                self._callbacks.append(fn)
                return
        _call(fn, self)

    def finish(self, result: Any = None, error: BaseException | None = None) -> None:
        """Complete the operation with ``result`` or ``error`` (whoever ran it: the executor,
        a call that completed synchronously, a torch handle's settling) and run the done
        callbacks, in this thread."""
        with self._lock:
            self._result, self._error = result, error
            self._event.set()
            callbacks, self._callbacks = self._callbacks, []
        for fn in callbacks:
            _call(fn, self)

    def __repr__(self) -> str:
        state = "done" if self.done() else "pending"
        return f"<Work {self.description} {state}>"


def _call(fn: Callable[[Work], None], work: Work) -> None:
    try:
        fn(work)
    except Exception:  # a callback's bug must not end the worker thread
        log.exception("%s: a done callback raised", work.description)


class Executor:
    """One worker thread that runs submitted operations in submission order."""

    def __init__(self, name: str) -> None:
        self._name = name
        self._queue: queue.SimpleQueue = queue.SimpleQueue()
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()
        self._closed = False
        self._last: Work | None = None

    def submit(self, fn: Callable[[], Any], work: Work) -> Work:
        """Queue ``fn`` to run after every earlier submission and finish ``work`` with its result or
        error; returns ``work``. RuntimeError after close(). The thread starts on the first submit,
        so a communicator used only blocking never has one."""
        with self._lock:
            if self._closed:
                raise RuntimeError(f"{self._name}: submit after close()")
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name=self._name, daemon=True)
                self._thread.start()
            self._last = work
            self._queue.put((fn, work))
        return work

    def last(self) -> Work | None:
        """The most recently submitted operation (it finishes after all earlier ones)."""
        return self._last

    def _run(self) -> None:
        while True:
            item = self._queue.get()
            if item is None:
                return
            fn, work = item
            try:
                work.finish(fn())
            except BaseException as exc:  # handed to whoever waits on the handle
                work.finish(error=exc)

    def close(self, timeout: float = defaults.CLOSE_TIMEOUT) -> None:
        """Refuse new submissions and let the thread run what is queued, waiting up to ``timeout``
        (a warning if it is still running then). Idempotent."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            thread = self._thread
        if thread is not None:
            self._queue.put(None)
            thread.join(timeout)
            if thread.is_alive():
                log.warning("%s: an operation was still running at close()", self._name)
