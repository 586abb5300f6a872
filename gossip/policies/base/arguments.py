"""The policies' argument checks: one wording and one rule (bools are not numbers, NaN is no
number in any range) for every constructor, so each check is one line where it is used.
A bad value is a ValueError naming the argument, what it must be and what it got."""
from __future__ import annotations

import math
from typing import Callable, Literal, overload

__all__ = ["check_int", "check_number"]


@overload
def check_int(name: str, value: object, low: int = 1, *, optional: Literal[False] = False,
              note: str = "") -> int: ...


@overload
def check_int(name: str, value: object, low: int = 1, *, optional: bool,
              note: str = "") -> int | None: ...


def check_int(name: str, value: object, low: int = 1, *, optional: bool = False,
              note: str = "") -> int | None:
    """``value`` if it is an int >= ``low`` (or None when ``optional``)."""
    if value is None and optional:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < low:
        raise ValueError(f"{name} must be {'None or ' if optional else ''}an int >= {low}"
                         f"{note}, got {value!r}")
    return value


@overload
def check_number(name: str, value: object, within: Callable[[float], bool], what: str, *,
                 optional: Literal[False] = False, note: str = "") -> float: ...


@overload
def check_number(name: str, value: object, within: Callable[[float], bool], what: str, *,
                 optional: bool, note: str = "") -> float | None: ...


def check_number(name: str, value: object, within: Callable[[float], bool], what: str, *,
                 optional: bool = False, note: str = "") -> float | None:
    """``value`` as a float if it is a finite real number for which ``within`` holds (or
    None when ``optional``); ``what`` words the rule ("in (0, 1]")."""
    if value is None and optional:
        return None
    if (isinstance(value, bool) or not isinstance(value, (int, float))
            or not math.isfinite(value) or not within(value)):
        raise ValueError(f"{name} must be {'None or ' if optional else ''}{what}, got "
                         f"{value!r}{note}")
    return float(value)
