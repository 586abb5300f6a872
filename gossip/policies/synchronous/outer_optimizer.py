"""The outer optimizer of LocalSGD's outer step (DiLoCo): SGD with momentum, optionally
Nesterov's, applied to the averaged pseudo-gradient, with the state (momentum buffers) kept
per bucket as policy state.

DiLoCo (Douillard et al. 2023, "DiLoCo: Distributed Low-Communication Training of Language
Models") uses Nesterov momentum with lr 0.7 and momentum 0.9 (``SGD.diloco()``, or
``outer_optimizer="diloco"``); ``SGD(lr=1)`` (no momentum) makes the outer step the plain
average of the parameters, i.e. plain LocalSGD.
"""
from __future__ import annotations

from typing import Any, TypedDict

import numpy as np

from collectives.arrays import adapter_for
from gossip.policies.base import check_number

__all__ = ["SGD", "SGDSettings", "DILOCO", "resolve_outer_optimizer"]


class SGDSettings(TypedDict):
    """SGD's constructor arguments, as one value."""

    lr: float
    momentum: float
    nesterov: bool


DILOCO: SGDSettings = {"lr": 0.7, "momentum": 0.9, "nesterov": True}
"""DiLoCo's outer optimizer settings (its paper's Table 5 and text: Nesterov, 0.7, 0.9)."""


class SGD:
    """p <- p - lr * u for the pseudo-gradient g, torch.optim.SGD's rule: the buffer
    b <- momentum * b + g, u = g + momentum * b (Nesterov) or u = b; without momentum u = g.

    The object holds settings only until a policy takes it: each policy works with its own
    copy (``fresh()``), so one SGD(...) may configure several policies."""

    def __init__(self, lr: float = 1.0, momentum: float = 0.0, nesterov: bool = False) -> None:
        self.lr = check_number("lr", lr, lambda v: v > 0, "a positive number")
        self.momentum = check_number("momentum", momentum, lambda v: 0 <= v < 1, "in [0, 1)")
        if nesterov and not momentum:
            raise ValueError("nesterov=True needs a momentum > 0")
        self.nesterov = bool(nesterov)
        self._buffers: dict[int, Any] = {}

    @classmethod
    def diloco(cls) -> "SGD":
        """DiLoCo's outer optimizer: Nesterov momentum 0.9, lr 0.7."""
        return cls(**DILOCO)

    def fresh(self) -> "SGD":
        """A copy of the settings with no state."""
        return SGD(self.lr, self.momentum, self.nesterov)

    def step(self, k: int, param: Any, grad: Any) -> None:
        """Bucket k: param -= lr * update(grad), in place (float32 arrays, one module);
        ``grad`` may be overwritten."""
        if self.momentum:
            buf = self._buffers.get(k)
            if buf is None:
                buf = self._buffers[k] = adapter_for(grad).clone(grad)   # torch's first step
            else:
                buf *= self.momentum
                buf += grad
            if self.nesterov:
                adapter_for(grad).axpy(grad, self.momentum, buf)
            else:
                grad = buf
        adapter_for(param).axpy(param, -self.lr, grad)

    def state(self) -> dict:
        return {"lr": self.lr, "momentum": self.momentum, "nesterov": self.nesterov,
                "buffers": {int(k): adapter_for(b).clone(b)
                            for k, b in sorted(self._buffers.items())}}

    def load(self, state: dict) -> None:
        mine = (self.lr, self.momentum, self.nesterov)
        theirs = (state.get("lr"), state.get("momentum"), state.get("nesterov"))
        if mine != theirs:
            raise ValueError(f"outer optimizer state of (lr, momentum, nesterov) {theirs} "
                             f"does not fit this one's {mine}")
        buffers = state.get("buffers", {})
        if not isinstance(buffers, dict) or not all(
                isinstance(k, (int, np.integer)) and getattr(b, "ndim", None) == 1
                for k, b in buffers.items()):
            raise ValueError("outer optimizer buffers must be flat arrays by bucket")
        self._buffers = {int(k): adapter_for(b).clone(b) for k, b in buffers.items()}

    def __repr__(self) -> str:
        return f"SGD(lr={self.lr}, momentum={self.momentum}, nesterov={self.nesterov})"


def resolve_outer_optimizer(value: SGD | str | None) -> SGD | None:
    """None, an SGD (copied), or "diloco"."""
    if value is None:
        return None
    if isinstance(value, SGD):
        return value.fresh()
    if value == "diloco":
        return SGD.diloco()
    raise TypeError(f"outer_optimizer must be None, 'diloco' or gossip.policies.SGD(...), "
                    f"got {value!r}")
