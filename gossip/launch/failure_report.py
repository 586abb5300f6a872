"""What the launcher shows when peers fail: the first failure's traceback in full, the
others' consequences in one line each, set-up errors in one line, and the exception the
closing line names.

When one rank raises, every other rank's next collective raises PeerLost naming it: with
four peers that is four tracebacks, the real one somewhere among them, and the launcher's
last line said only "rank 2 failed with exit code 1". Here the peers' output lines pass
through ``feed``: a traceback is held until its exception line, then

- reduced to that line, marked as such, when it is a consequence of another rank's failure
  (CONSEQUENCES: PeerLost, OperationTimeout, ... raised after another rank's traceback);
- reduced to that line when it is a set-up error (SETUP: RendezvousError, AuthenticationError):
  its message names the rank, the address and the operation, and its traceback only leads
  into gossip.init() or the call that met the foreign key, the same on every rank (a port
  held by another program, a rank 0 that never came, peers of mismatched settings);
- printed whole otherwise: the first failure, or one that is no consequence.

``verbose`` (the launcher's GOSSIP_LOG_LEVEL is DEBUG) prints every traceback whole.
``left_out`` counts the tracebacks reduced, for the launcher's closing hint.
"""
from __future__ import annotations

import re
import threading

__all__ = ["FailureReport", "CONSEQUENCES", "SETUP"]

#: Exceptions a peer raises because another one failed (or the launcher stopped it).
CONSEQUENCES = frozenset({"PeerLost", "OperationTimeout", "ExchangeIncomplete",
                          "ViewChanging", "KeyboardInterrupt"})
#: Exceptions whose one line says all (no causal claim: every rank may raise its own).
SETUP = frozenset({"RendezvousError", "AuthenticationError"})
_START = b"Traceback (most recent call last):"
_EXCEPTION = re.compile(rb"^([A-Za-z_][\w.]*)(?::\s?(.*))?$")
_MAX_HELD = 2000   # lines of one traceback held at most (a runaway one is let through)


class FailureReport:
    """Per-rank traceback state of one launcher (thread-safe: one pump thread per pipe)."""

    def __init__(self, verbose: bool = False) -> None:
        self._lock = threading.Lock()
        self._verbose = verbose
        self._held: dict[tuple[int, int], list[bytes]] = {}   # (rank, stream) -> lines
        self._first: tuple[int, str] | None = None            # (rank, exception line)
        self._exceptions: dict[int, str] = {}
        self.left_out = 0

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
            qualified = match.group(1).decode(errors="replace")
            name = qualified.rsplit(".", 1)[-1]
            # "collectives.errors.RendezvousError: ..." -> "RendezvousError: ...".
            shown = name + text.decode(errors="replace")[len(qualified):]
            self._exceptions[rank] = shown
            first = self._first
            if first is None:
                self._first = (rank, shown)
            if self._verbose:
                return held
            if name in CONSEQUENCES and first is not None and first[0] != rank:
                self.left_out += 1
                return [f"{shown}  (traceback left out: a consequence of rank "
                        f"{first[0]}'s failure)\n".encode()]
            if name in SETUP:
                self.left_out += 1
                return [f"{shown}\n".encode()]
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
