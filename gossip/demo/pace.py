"""How many steps each peer takes when the peers count their own steps (asynchronous) beside a
straggler or a death: AD-PSGD's setting, where the group trains a budget of steps and fast
workers take more of it, all ending together.

    share = SpeedShare(peer, records_dir, "asynchronous", slot=1, slots=4, total=356,
                       steps_per_epoch=89)
    total = share.first(step, seconds)   # at the end of the first epoch: one allreduce
    total = share.again(step)            # every few steps after it: files, no waiting

``first`` splits the group's n x ``total`` steps by the step rates of the first epoch (one
allreduce: the fast peers wait for the slow one once). Rates drift after that (two cores
shared by four processes, the exchanges' waits), and a peer that ends early leaves the
others to train on without it. Measured 2026-12-05 (`gossip demo --policy
gossip,asynchronous --straggler 3@4 --dataset shifted-digits --epochs 4 --seed 0`, the first
share only): the last peer ended 0.35 s after the first (469 steps against 384); the two
neighbours that answered its exchanges meanwhile ended within 0.03 of it, the first peer
0.88 from all three, and that one peer made the consensus distance 4.5x gossip's. ``again``
re-estimates from each peer's progress as the others last wrote it (DIR/<policy>/
pace<slot>.json: step and wall time, written every loop.PACE_STEPS steps, read without
waiting on anyone): the group's steps left, over the peers' summed rates (each counted from
the first share), is the time left, and this peer takes its own rate's part of it. Until
every peer has written once, the share stays. With it, the straggler scenario's consensus
distance was 1.5-2.1x gossip's over four seeds, quiet and loaded (docs/results.md).

Under --kill (no allreduce: a peer may be dead at the first epoch's end) the killed peer's
last progress is extrapolated at its rate, as if it trained on, until its restarted process
writes its own: it goes on from the step it took with the state, so the group's count is
about what it would have been, and the peers end together with it.
"""
from __future__ import annotations

import json
import os
import time
from typing import Any

import numpy as np

__all__ = ["SpeedShare"]


class SpeedShare:
    """One peer's share of the group's steps (module docstring)."""

    def __init__(self, peer: Any, directory: str, policy: str, *, slot: int, slots: int,
                 total: int, steps_per_epoch: int, first_step: int = 0,
                 allreduce: bool = True, start: float | None = None) -> None:
        self._peer = peer
        self._dir = os.path.join(directory, policy)
        os.makedirs(self._dir, exist_ok=True)
        self._slot, self._slots = slot, slots
        self._budget = slots * total   # the group's steps
        self._spe = steps_per_epoch
        # (``start``: the wall time its steps count from, now by default.)
        self._start = time.time() if start is None else start
        self._first_step = first_step
        self._total = total
        self._allreduce = allreduce

    def first(self, step: int, seconds: float) -> int:
        """(End of the first epoch, at ``step``, ``seconds`` of training in it.) This peer's
        total steps, split by the step rates of the first epoch: one allreduce (none if made
        with ``allreduce=False``: a peer may be dead by then, under --kill). The rates
        ``again`` reads count from here: before it, the fast peers' steps waited for the
        slow one's."""
        if not self._allreduce:
            return self._total
        rates = np.array([self._spe / max(seconds, 1e-6)])
        mine = float(rates[0])
        self._peer.allreduce(rates)
        self._start, self._first_step = time.time(), step
        self._total = round(self._budget * mine / float(rates[0]))
        return self._total

    def again(self, step: int) -> int:
        """(Every few steps past the first epoch, at step ``step``.) Write this peer's
        progress and return its total re-estimated from every peer's (the share as it was
        while one has not written yet)."""
        now = time.time()
        self._write(step, now)
        paces = [self._read(slot) for slot in range(self._slots)]
        known = [p for p in paces if p is not None]
        if len(known) < self._slots:
            return self._total
        rates = [(p["step"] - p["first"]) / max(p["wall"] - p["start"], 1e-6) for p in known]
        done = sum(p["step"] + r * max(0.0, now - p["wall"]) for p, r in zip(known, rates))
        left_seconds = max(0.0, self._budget - done) / max(sum(rates), 1e-9)
        self._total = step + round(rates[self._slot] * left_seconds)
        return self._total

    def _path(self, slot: int) -> str:
        return os.path.join(self._dir, f"pace{slot}.json")

    def _write(self, step: int, now: float) -> None:
        tmp = self._path(self._slot) + ".tmp"
        with open(tmp, "w") as f:
            json.dump({"step": step, "wall": now, "start": self._start,
                       "first": self._first_step}, f)
        os.replace(tmp, self._path(self._slot))   # whole, for the readers

    def _read(self, slot: int) -> dict | None:
        try:
            with open(self._path(slot)) as f:
                return json.load(f)
        except (OSError, ValueError):
            return None
