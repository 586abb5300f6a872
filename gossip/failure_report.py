"""What the launcher shows when peers fail: the first failure's traceback in full, the
others' consequences in one line each, and the exception the closing line names.

When one rank raises, every other rank's next collective raises PeerLost naming it: with
four peers that is four tracebacks, the real one somewhere among them, and the launcher's
last line said only "rank 2 failed with exit code 1". Here the peers' output lines pass
through ``feed``: a traceback is held until its exception line, then printed whole if it is
the first one of the run, or if it is not a consequence of another rank's failure (PeerLost,
OperationTimeout, ExchangeIncomplete, ViewChanging, KeyboardInterrupt, and RendezvousError:
the others' rendezvous fails when rank 0's does); a consequence after
a first failure is reduced to its exception line, marked as such.
"""
from __future__ import annotations

import re
import threading

__all__ = ["FailureReport", "CONSEQUENCES"]

#: Exceptions a peer raises because another one failed (or the launcher stopped it).
CONSEQUENCES = frozenset({"PeerLost", "OperationTimeout", "ExchangeIncomplete",
                          "ViewChanging", "KeyboardInterrupt", "RendezvousError"})
_START = b"Traceback (most recent call last):"
_EXCEPTION = re.compile(rb"^([A-Za-z_][\w.]*)(?::\s?(.*))?$")
_MAX_HELD = 2000   # lines of one traceback held at most (a runaway one is let through)


class FailureReport:
    """Per-rank traceback state of one launcher (thread-safe: one pump thread per pipe)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._held: dict[tuple[int, int], list[bytes]] = {}   # (rank, stream) -> lines
        self._first: tuple[int, str] | None = None            # (rank, exception line)
        self._exceptions: dict[int, str] = {}

    def feed(self, rank: int, stream: int, line: bytes) -> list[bytes]:
        """The lines to print now for ``line`` of ``rank``'s ``stream`` (0 stdout, 1 stderr)."""
        key = (rank, stream)
        with self._lock:
            held = self._held.get(key)
            if held is None:
                if line.rstrip() == _START:
                    self._held[key] = [line]
                    return []
                return [line]
            held.append(line)
            text = line.rstrip(b"\r\n")
            if len(held) > _MAX_HELD:
                del self._held[key]
                return held
            if not text or text[:1] in (b" ", b"\t") or text == _START:
                return []
            match = _EXCEPTION.match(text)
            if match is None or text.startswith((b"During handling", b"The above exception")):
                return []   # chained tracebacks go on until the last exception line
            del self._held[key]
            name = match.group(1).decode(errors="replace").rsplit(".", 1)[-1]
            shown = text.decode(errors="replace")
            self._exceptions[rank] = shown
            if self._first is None:
                self._first = (rank, shown)
                return held
            if name in CONSEQUENCES and self._first[0] != rank:
                return [f"{shown}  (traceback left out: a consequence of rank "
                        f"{self._first[0]}'s failure)\n".encode()]
            return held

    def flush(self, rank: int) -> list[bytes]:
        """Whatever ``rank`` left held (its pipe closed mid-traceback)."""
        with self._lock:
            out: list[bytes] = []
            for stream in (0, 1):
                out += self._held.pop((rank, stream), [])
            return out

    def exception_of(self, rank: int) -> str | None:
        """The exception line of ``rank``'s last traceback, if it printed one."""
        with self._lock:
            return self._exceptions.get(rank)
