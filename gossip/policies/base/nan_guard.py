"""The nan guard of a policy (``nan_guard=True``): a step whose gradients or updated parameters
hold NaN or inf is skipped, and the parameters go back to the last good ones, so a peer never
sends non-finite values to its neighbours. See Policy for when each policy judges."""
from __future__ import annotations

import logging
import warnings
from typing import Any

from collectives.arrays import adapter_for

__all__ = ["NanGuard"]

log = logging.getLogger("gossip")


class NanGuard:
    """The last good parameters of one policy's buckets and the verdict of the step.
    ``who()`` gives (rank, step, policy name) for the warning."""

    def __init__(self, buckets: Any, *, gradients: bool, who: Any) -> None:
        self._buckets = buckets
        self._gradients = gradients   # the policy averages gradients: judge the buckets'
        self._who = who
        self._good: list | None = None   # the parameters after the last step
        self.skip_update = False         # the optimizer step must be skipped
        self.skipped_steps = 0

    def skip(self, what: str) -> None:
        """Mark the step skipped (once per step) and warn, naming rank and step."""
        if not self.skip_update:
            self.skipped_steps += 1
        self.skip_update = True
        rank, step, name = self._who()
        message = (f"rank {rank}: step {step}: non-finite {what} (NaN or inf); the update is "
                   f"skipped ({name}, nan_guard=True)")
        log.warning(message)
        warnings.warn(message, RuntimeWarning, stacklevel=3)

    def gradients_finite(self) -> bool:
        """Whether the gradients this step would apply are finite (torch only; numpy
        parameters have no gradients here). Gradient policies judge the averaged ones."""
        buckets = self._buckets
        if buckets.kind != "torch":
            return True
        if self._gradients:
            grads = [b.grad for b in buckets if getattr(b, "grad", None) is not None]
        else:
            grads = [p.grad for p in buckets.params if p.grad is not None]
        return all(adapter_for(g).all_finite(g) for g in grads)

    def restore_if_not_finite(self) -> bool:
        """Non-finite parameters go back to the last good ones (the step counts as skipped);
        True if they did. FloatingPointError if there are none to go back to."""
        buckets = self._buckets
        buckets.copy_in()
        if all(adapter_for(b.flat).all_finite(b.flat) for b in buckets):
            return False
        if self._good is None:
            rank, step, _ = self._who()
            raise FloatingPointError(f"rank {rank}: step {step}: non-finite parameters and no "
                                     "finite ones to go back to")
        self.skip("parameters")
        for b, good in zip(buckets, self._good):
            adapter_for(good).copy(b.flat, good)
        buckets.copy_out()
        return True

    def keep(self) -> None:
        """Remember the parameters as they are now (after a good step)."""
        buckets = self._buckets
        buckets.copy_in()
        if self._good is None:
            self._good = [b.new() for b in buckets]
        for b, good in zip(buckets, self._good):
            adapter_for(good).copy(good, b.flat)
