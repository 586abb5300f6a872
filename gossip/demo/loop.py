"""The demo's training loop, shared by the policies and the one-process baseline: batches in a
seeded order, evaluations at fixed steps, progress events, a clock that pauses while
evaluating.

    loop = Loop("gossip", config, steps_per_epoch, batch, np.random.default_rng([seed, slot]),
                progress)
    record = loop.run(x, y, train_step, measure, lambda: opt.policy.step)

The loop is driven by the policy's step count, not a counter of its own (as Synchronous's
docstring asks): after an elastic recovery the step taken over is trained again on the same
batch, identically on every replica, and a process that joins the running job starts at the
step it took with the state. The batch of step s is fixed by s alone, so the joiner continues
the data order of the peer it replaces.

Evaluations are numbered (a point's ``index``): evals_per_epoch per epoch, at the same steps
on every peer. A run whose peers split the group's steps by speed (``share``, under a
straggler: AD-PSGD's setting, where fast workers take more steps) spreads the evaluations
after the first epoch evenly over each peer's own steps, so the k-th evaluations of all peers
fall at about the same time and are put together as one point (records.collect).
"""
from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any, Callable

import numpy as np

if TYPE_CHECKING:
    import torch

    from gossip.demo.pace import SpeedShare

__all__ = ["Loop", "BatchOrder", "PACE_STEPS"]

#: Under a speed share, the steps between two re-estimates of this peer's total (pace.py).
PACE_STEPS = 8


def _evaluation_steps(total: int, spe: int, evals: int, count: int) -> list[int]:
    """The steps after which evaluations 1..``count`` come: ``evals`` in the first epoch of
    ``spe`` steps, the rest evenly over the steps after it up to ``total``. With ``total``
    = epochs * spe and ``count`` = epochs * evals, that is ``evals`` per epoch at the same
    places in each; a peer's own total (share()) spreads the same count over its steps."""
    first = [round(k * spe / evals) for k in range(1, evals + 1)]
    rest = count - evals
    return first + [spe + round(k * (total - spe) / rest) for k in range(1, rest + 1)]


def _rescheduled(schedule: list[int], passed: int, step: int, total: int) -> list[int]:
    """``schedule`` with its first ``passed`` evaluations kept and the others spread evenly
    from the last one kept up to ``total``, none at or before ``step`` (the loop is there):
    every index still comes once, whatever the new total. (Spread from ``step`` instead,
    a re-estimate every few steps would push the next evaluation ahead each time.)"""
    left = len(schedule) - passed
    anchor = schedule[passed - 1] if passed else 0
    span = max(total - anchor, left)
    return schedule[:passed] + [max(anchor + round(k * span / left), step + k)
                                for k in range(1, left + 1)]


class BatchOrder:
    """One permutation of the shard per epoch, drawn in sequence from ``rng``; ``batch(step)``
    is the step's slice. A process that starts at a later epoch draws the epochs before it
    first (cheap), so its batches are those the peer it replaces would have taken."""

    def __init__(self, rng: np.random.Generator, samples: int, steps_per_epoch: int,
                 batch: int) -> None:
        self._rng, self._samples = rng, samples
        self._steps, self._batch = steps_per_epoch, batch
        self._epoch = -1
        self._perm: torch.Tensor | None = None   # this epoch's order

    def batch(self, step: int) -> Any:
        import torch

        epoch, s = divmod(step, self._steps)
        if epoch < self._epoch:
            raise ValueError(f"step {step} is in epoch {epoch}, before epoch {self._epoch}: "
                             "the order is drawn forward only")
        while self._epoch < epoch:
            self._perm = torch.from_numpy(self._rng.permutation(self._samples))
            self._epoch += 1
        if self._perm is None:
            raise ValueError(f"step {step}: steps count from 0")
        return self._perm[s * self._batch:(s + 1) * self._batch]


class Loop:
    """Train ``config.epochs`` epochs of ``steps_per_epoch`` steps (see run())."""

    def __init__(self, name: str, config: Any, steps_per_epoch: int, batch: int,
                 rng: np.random.Generator, progress: Any) -> None:
        self.name, self.config, self.progress = name, config, progress
        self.steps_per_epoch, self.batch, self.rng = steps_per_epoch, batch, rng
        self.samples = 0                      # trained by this process
        self.last_accuracy = float("nan")
        self.last_point: dict | None = None   # the last evaluation's point, as measured

    def run(self, x: Any, y: Any, train_step: Callable[[Any, Any], float],
            measure: Callable[[dict], dict], step_now: Callable[[], int],
            after_step: Callable[[int], Any] | None = None,
            share: SpeedShare | None = None) -> dict:
        """Train from step ``step_now()`` to the last: ``train_step(xb, yb)`` returns the
        batch's loss, ``measure(point)`` evaluates (point: time, step, epoch, index,
        train_loss; it adds accuracy and test_loss), ``after_step(step)`` runs after each
        step the count advanced by. ``share``, if given, sets this peer's total steps: at the
        end of the first epoch (``first``, with its seconds of training), then every
        PACE_STEPS steps (``again``), the evaluations left spread evenly up to the new total
        (module docstring; pace.py). The clock starts here and pauses while evaluating:
        points' times and ``train_seconds`` are seconds of training; ``wall_seconds`` also
        counts the evaluations (diagnostics, which would otherwise favour policies that
        train fast per evaluation)."""
        config, spe = self.config, self.steps_per_epoch
        total = config.epochs * spe
        every = max(1, spe // max(1, config.progress_every))
        evals = min(max(1, config.evals_per_epoch), spe)
        count = config.epochs * evals
        schedule = _evaluation_steps(total, spe, evals, count)
        order = BatchOrder(self.rng, len(y), spe, self.batch)
        step = first = step_now()
        passed = sum(1 for at in schedule if at <= step)   # evaluations behind us
        if step == 0:
            self._evaluate(measure, {"time": 0.0, "step": 0, "epoch": 0.0, "index": 0,
                                     "train_loss": float("nan")})
        self.progress.emit(event="start", policy=self.name, steps=total)
        eval_seconds, loss_sum, losses = 0.0, 0.0, 0
        start = time.perf_counter()
        # A step the count does not advance by (a recovery took it over) is trained again;
        # a policy whose count never advanced would loop for ever: bounded, with a message.
        bound, trained = 2 * (total - first) + 100, 0
        while step < total:
            if trained >= bound:
                raise RuntimeError(f"{self.name}: the policy's step count stayed at {step} "
                                   f"of {total} through {bound} training steps")
            trained += 1
            idx = order.batch(step)
            loss_sum += train_step(x[idx], y[idx])
            losses += 1
            self.samples += len(idx)
            new = step_now()
            if new == step:
                continue
            before, step = step, new
            if step // every > before // every:
                self.progress.emit(event="step", policy=self.name, step=step)
            if share is not None and before < spe <= step and first < spe:
                total = max(step + count - evals,   # (a step for each evaluation left)
                            share.first(step, time.perf_counter() - start - eval_seconds))
                schedule = _evaluation_steps(total, spe, evals, count)
                bound = 2 * (total - first) + 100
            if (share is not None and step > spe and passed < count
                    and step // PACE_STEPS > before // PACE_STEPS):
                total = max(step + count - passed, share.again(step))
                schedule = _rescheduled(schedule, passed, step, total)
                bound = 2 * (total - first) + 100
            due = passed
            while due < len(schedule) and schedule[due] <= step:
                due += 1
            if due > passed:   # (several at once: the last one's index)
                passed = due
                paused = time.perf_counter()
                self._evaluate(measure, {"time": paused - start - eval_seconds, "step": step,
                                         "epoch": step / spe, "index": due,
                                         "train_loss": loss_sum / max(1, losses)})
                eval_seconds += time.perf_counter() - paused
                loss_sum, losses = 0.0, 0
            if step // spe > before // spe:
                self.progress.emit(event="epoch", policy=self.name, epoch=step // spe,
                                   step=step, accuracy=self.last_accuracy)
            if after_step is not None:
                after_step(step)
        wall = time.perf_counter() - start
        return {"steps": step, "first_step": first, "samples": self.samples,
                "wall_seconds": wall, "train_seconds": wall - eval_seconds}

    def _evaluate(self, measure: Callable[[dict], dict], point: dict) -> None:
        self.last_point = dict(point)
        self.last_accuracy = measure(point)["accuracy"]
