"""The demo's ``RANK@VALUE`` options (``--kill 2@0.33``, ``--straggler 3@4``): parsing them,
and checking the rank against the run's peers, with the one-line errors both give."""
from __future__ import annotations

__all__ = ["parse_rank_at", "check_rank"]


def parse_rank_at(text: str, option: str, form: str, example: str,
                  meaning: str) -> tuple[int, float]:
    """``text`` as (rank, value); ValueError naming ``option``, the ``form`` expected and
    an ``example`` with its ``meaning`` otherwise."""
    rank, at, value = str(text).strip().partition("@")
    try:
        parsed = int(rank), float(value)
    except ValueError:
        raise ValueError(f"{option} {text!r}: expected {form}, e.g. {example} "
                         f"({meaning})") from None
    if not at:
        raise ValueError(f"{option} {text!r}: expected {form}, e.g. {example}")
    return parsed


def check_rank(option: str, spec: object, rank: int, peers: int) -> None:
    """ValueError unless ``rank`` is one of ``peers``."""
    if not 0 <= rank < peers:
        raise ValueError(f"{option} {spec}: rank {rank} is not one of the {peers} peers "
                         f"(0 to {peers - 1})")
