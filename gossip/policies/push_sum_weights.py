"""Push-sum weights in checkpoints: the one check of the weights a state dict carries, for the
two push-sum policies (PushSum, Asynchronous), whose models are de-biased so the weights are
all the state they need."""
from __future__ import annotations

import numpy as np

__all__ = ["weights_from_state"]


def weights_from_state(state: dict, count: int, policy: str) -> list[float]:
    """``state["weights"]`` as floats, checked: one per bucket (``count``), each finite and
    positive; ValueError naming ``policy`` otherwise."""
    weights = state.get("weights")
    if not isinstance(weights, (list, tuple)) or len(weights) != count:
        raise ValueError(f"{policy} state needs {count} weights (one per bucket), got "
                         f"{weights!r}")
    if not all(np.isfinite(w) and w > 0 for w in weights):
        raise ValueError(f"{policy} weights must be positive, got {weights!r}")
    return [float(w) for w in weights]
