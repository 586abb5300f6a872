"""Progress of a demo run, drawn in the launching process from the JSON-lines events the
reporting peer (and, under --kill, the killed peer and its new process) append to a file
(see gossip.demo.train): a tqdm bar per policy on a terminal, one plain line per policy
start and end otherwise (a log, a pipe, CI), so progress is always visible.

A file rather than a pipe or queue: the reader never blocks on a peer that died in the middle
of a write, and a torn last line is simply read again once complete.
"""
from __future__ import annotations

import json
import shutil
import sys
import threading
from typing import IO, Any

__all__ = ["ProgressDisplay"]

_POLL_S = 0.1


class ProgressDisplay:
    """Follows the progress file in a background thread while the peers train.

    ``bars``: None picks tqdm bars when ``stream`` is a terminal (and tqdm is installed),
    plain lines otherwise. Use as a context manager; ``current`` is the policy being trained
    (for error messages)."""

    def __init__(self, path: str, *, stream: IO[str] | None = None,
                 bars: bool | None = None, target: float = 0.95) -> None:
        self.path = path
        self.stream = stream if stream is not None else sys.stderr
        if bars is None:
            isatty = getattr(self.stream, "isatty", None)
            bars = bool(isatty and isatty())
        self._tqdm = None
        if bars:
            try:
                from tqdm import tqdm
                self._tqdm = tqdm
            except ImportError:
                pass
        self.target = target
        self.current: str | None = None
        self._bar: Any = None
        self._offset = 0
        self._partial = ""
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._follow, daemon=True,
                                        name="demo-progress")

    def __enter__(self) -> "ProgressDisplay":
        self._thread.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def close(self) -> None:
        """Read what is left, close the bar; prompt and idempotent."""
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(2.0)
        self._bar_close()

    # ------------------------------------------------------------------ reading
    def _follow(self) -> None:
        while True:
            stopping = self._stop.wait(_POLL_S)
            try:
                self._read()
            except Exception as exc:  # progress must never break the run
                self._line(f"(progress display stopped: {exc})")
                return
            if stopping:
                return

    def _read(self) -> None:
        try:
            with open(self.path) as f:
                f.seek(self._offset)
                chunk = f.read()
                self._offset = f.tell()
        except FileNotFoundError:
            return
        text = self._partial + chunk
        lines = text.split("\n")
        self._partial = lines.pop()  # an incomplete last line waits for its end
        for line in lines:
            if line.strip():
                try:
                    event = json.loads(line)
                except ValueError:
                    continue
                self._handle(event)

    # ------------------------------------------------------------------ drawing
    def _line(self, text: str) -> None:
        if self._bar is not None:
            self._bar.write(text, file=self.stream)
        else:
            print(text, file=self.stream, flush=True)

    def _bar_close(self) -> None:
        if self._bar is not None:
            self._bar.close()
            self._bar = None

    def _handle(self, event: dict) -> None:
        kind, name = event.get("event"), event.get("policy", "?")
        if kind == "prepare":
            self.current = name
        elif kind == "start":
            self._bar_close()
            self.current = name
            steps = int(event.get("steps", 0))
            if self._tqdm is not None:
                # The size once, with a fallback: a terminal that reports 0 x 0 (some ptys)
                # would otherwise get bars of no width, or none at all (tqdm hides bars
                # below the last row).
                size = shutil.get_terminal_size((100, 24))
                self._bar = self._tqdm(total=steps, desc=f"{name:>12}", unit="step",
                                       file=self.stream, leave=True,
                                       ncols=min(size.columns, 120), nrows=max(size.lines, 2))
            else:
                self._line(f"{name}: training ({steps} steps)...")
        elif kind == "step" and self._bar is not None:
            self._bar.update(int(event["step"]) - self._bar.n)
        elif kind == "epoch" and self._bar is not None:
            self._bar.update(int(event["step"]) - self._bar.n)
            self._bar.set_postfix(epoch=event.get("epoch"),
                                  acc=f"{100 * float(event.get('accuracy', 0)):.1f}%",
                                  refresh=False)
        elif kind == "killed":   # written by the peer itself, just before its SIGKILL
            self._line(f"{name}: peer {event.get('slot')} SIGKILLed itself after step "
                       f"{event.get('step')}; starting it again")
        elif kind == "rejoined":   # written by its new process, state taken
            self._line(f"{name}: peer {event.get('slot')} is back, training from step "
                       f"{event.get('step')}")
        elif kind == "done":
            accuracy = 100 * float(event.get("accuracy", 0))
            wall = float(event.get("wall", 0))
            if self._bar is not None:
                self._bar.set_postfix(acc=f"{accuracy:.1f}%", refresh=True)
                self._bar_close()
            else:
                self._line(f"{name}: done in {wall:.1f} s, test accuracy {accuracy:.1f}%")
