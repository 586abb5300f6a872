"""A policy's checkpoint: what state_dict() gives and load_state_dict() takes back (the step
count, the codec's residuals, the outer optimizer's state and each policy's own). A mixin of
Policy; the attributes it reads (_peer, _step, _compression, _outer, ...) are Policy's."""
from __future__ import annotations

import numpy as np

__all__ = ["PolicyState"]


class PolicyState:
    """Policy's checkpoint side; subclasses add theirs in _extra_state/_load_extra_state."""

    def state_dict(self) -> dict:
        """What the policy needs to resume (the parameters themselves live in the model's or
        the user's state): its name, the step count, and policy-specific state."""
        state = {"policy": self.name, "step": self._step}
        if self._peer is not None:
            state.update(self._extra_state())
            state.update(self._compression.state())
            if self._outer is not None:
                state["outer"] = self._outer.state()
        return state

    def load_state_dict(self, state: dict) -> None:
        """Restore what state_dict() returned (after attach)."""
        self._check_ready()
        if not isinstance(state, dict) or "step" not in state:
            raise ValueError("not a policy state dict: expected a dict with 'policy' and 'step'")
        if state.get("policy") != self.name:
            raise ValueError(f"state dict of policy {state.get('policy')!r} cannot be loaded "
                             f"into {self.name!r}")
        step = state["step"]
        if not isinstance(step, (int, np.integer)) or step < 0:
            raise ValueError(f"state dict step must be a non-negative int, got {step!r}")
        self._compression.load(state)
        if self._outer is not None:
            self._outer.load(state.get("outer"))
        self._load_extra_state(state)
        self._step = int(step)

    def _extra_state(self) -> dict:
        return {}

    def _load_extra_state(self, state: dict) -> None:
        pass
