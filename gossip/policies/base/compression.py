"""A policy's compression: its codec (``compression=`` of every policy) and, for codecs that
are not dense (top-k), the error-feedback residual of each bucket, which is policy state:
state_dict() carries it, so a checkpoint restores it. A peer that takes another's state (a
joiner, a survivor of a recovery) starts without one: a residual is its own peer's unsent
error, which would otherwise reach the average twice (Policy.took_state).

The policy passes ``kwargs(k, flat)`` to the collective that sends bucket k; the residual
is allocated on first use (float32, one per bucket, the size of what is sent).
"""
from __future__ import annotations

from typing import Any

import numpy as np

from collectives.arrays import adapter_for
from collectives.codecs import Codec, parse, zeros_float32
from collectives.codecs import CodecSpec

__all__ = ["Compression"]


class Compression:
    """The codec of one policy and its residuals (None codec: every method is a no-op)."""

    def __init__(self, compression: CodecSpec) -> None:
        self.codec: Codec | None = parse(compression)
        self._residuals: dict[int, Any] = {}

    @property
    def name(self) -> str | None:
        """The codec's name, None without one."""
        return None if self.codec is None else self.codec.name

    @property
    def feedback(self) -> bool:
        """True if the codec keeps residuals (error feedback: top-k)."""
        return self.codec is not None and not self.codec.dense

    def residual(self, k: int, flat: Any) -> Any:
        """Bucket k's residual (None without error feedback)."""
        if not self.feedback:
            return None
        res = self._residuals.get(k)
        if res is None:
            adapter = adapter_for(flat)
            res = self._residuals[k] = zeros_float32(adapter, adapter.flat(flat))
        return res

    def kwargs(self, k: int, flat: Any) -> dict:
        """The compression arguments of a collective on bucket k's ``flat``."""
        if self.codec is None:
            return {}
        return {"compression": self.codec, "residual": self.residual(k, flat)}

    def require_dense(self, policy: str, instead: str) -> None:
        """ValueError for a codec that cannot stand for parameters (top-k) in ``policy``."""
        if self.codec is not None and not self.codec.dense:
            raise ValueError(f"{policy} sends the parameters themselves: {self.codec.name} "
                             f"would zero most of them; use fp16, bf16 or int8, or {instead}")

    def forget_residuals(self) -> None:
        """Start error feedback afresh (a peer that took another's state: a joiner, or a
        survivor of a recovery; checkpoints restore a peer's own residuals instead)."""
        self._residuals.clear()

    # ------------------------------------------------------------------ state
    def state(self) -> dict:
        """{"codec": name, "residuals": {bucket: array}} (empty without a codec)."""
        if self.codec is None:
            return {}
        return {"codec": self.codec.name,
                "residuals": {int(k): adapter_for(r).clone(r) for k, r in
                              sorted(self._residuals.items())}}

    def load(self, state: dict) -> None:
        """Restore state(); ValueError if it was saved with another codec."""
        saved = state.get("codec")
        if saved != self.name:
            raise ValueError(f"state dict was saved with compression {saved!r}, this policy "
                             f"has {self.name!r}")
        if self.codec is None:
            return
        residuals = state.get("residuals", {})
        if not isinstance(residuals, dict):
            raise ValueError("state dict residuals must be a dict of arrays by bucket")
        self._residuals = {}
        for k, r in residuals.items():
            if not isinstance(k, (int, np.integer)) or getattr(r, "ndim", None) != 1 or \
                    str(r.dtype) != "float32":
                raise ValueError(f"residual of bucket {k!r} is not a flat float32 array")
            self._residuals[int(k)] = adapter_for(r).clone(r)

    def stats(self) -> dict:
        """What the policy's stats() add: the codec's name."""
        return {"compression": self.name}
