"""Argument validation shared by every topology: integers, sizes, ranks, steps, weight names."""

from __future__ import annotations

import numbers

from topologies.errors import TopologyError

__all__ = ["check_int", "check_size", "check_rank", "check_step", "normalize_weights"]

# Accepted spellings of each weight scheme -> canonical name. The canonical names are what
# `Topology.weight_scheme` reports and what a spec string carries.
_WEIGHT_ALIASES = {
    "metropolis": "metropolis",
    "metropolis-hastings": "metropolis",
    "mh": "metropolis",
    "uniform": "uniform",
    "push": "push",
    "column": "push",
}


def check_int(value: object, what: str, *, minimum: int | None = None) -> int:
    """Return `value` as a Python int, or raise TopologyError saying what was expected.

    bool is rejected on purpose: `Ring(True)` is almost certainly a bug, not a ring of one.
    numpy integers are accepted because sizes often come out of numpy arithmetic.
    """
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise TopologyError(
            f"{what} must be an integer, got {value!r} ({type(value).__name__}); "
            f"pass a whole number such as {minimum if minimum is not None else 0}"
        )
    result = int(value)
    if minimum is not None and result < minimum:
        raise TopologyError(f"{what} must be at least {minimum}, got {result}")
    return result


def check_size(value: object, what: str = "size n") -> int:
    """A number of peers: an integer >= 1."""
    return check_int(value, what, minimum=1)


def check_rank(rank: object, size: int) -> int:
    """A peer index in 0..size-1; the message names both the rank and the size."""
    if isinstance(rank, bool) or not isinstance(rank, numbers.Integral):
        raise TopologyError(
            f"rank must be an integer in 0..{size - 1}, got {rank!r} ({type(rank).__name__})"
        )
    r = int(rank)
    if not 0 <= r < size:
        raise TopologyError(
            f"rank {r} is out of range for a topology of size {size}; ranks are 0..{size - 1}"
        )
    return r


def check_step(step: object) -> int:
    """A training step (gossip round) index: an integer >= 0."""
    return check_int(step, "step", minimum=0)


def normalize_weights(weights: object) -> str | None:
    """Canonical weight-scheme name for `weights`, or None for "the graph's default"."""
    if weights is None:
        return None
    if not isinstance(weights, str):
        raise TopologyError(
            f"weights must be a string, got {weights!r}; use one of "
            f"'metropolis', 'uniform', 'push' (or leave it unset for the default)"
        )
    key = weights.strip().lower().replace("_", "-")
    try:
        return _WEIGHT_ALIASES[key]
    except KeyError:
        raise TopologyError(
            f"unknown weight scheme {weights!r}; use one of 'metropolis' (symmetric, "
            f"doubly stochastic, undirected graphs only), 'uniform' (row-stochastic) or "
            f"'push' (column-stochastic)"
        ) from None
