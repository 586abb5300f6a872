"""Topology spec strings: "ring", "torus:4x4", "random:p=0.3,seed=1", ... -> Topology."""

from __future__ import annotations

import math
import re

from topologies._checks import check_size
from topologies.base import Topology
from topologies.errors import TopologyError
from topologies.random_graph import RandomGraph
from topologies.static import Complete, Exponential, Ring, Torus
from topologies.timevarying import OnePeerExponential

__all__ = ["parse", "KNOWN_TOPOLOGIES", "square_factors"]

KNOWN_TOPOLOGIES: dict[str, tuple[str, ...]] = {
    "ring": (),
    "torus": ("ROWSxCOLS",),
    "random": ("p", "degree", "seed"),
    "exponential": (),
    "one-peer-exponential": (),
    "complete": (),
}
"""Names a spec may start with, and the options each accepts besides `weights`."""

_EXAMPLES = "ring, torus:4x4, random:p=0.3,seed=1, random:degree=3, exponential, complete"
_TORUS_SIZE = re.compile(r"^(\d+)x(\d+)$")


def square_factors(n: int) -> tuple[int, int]:
    """The most square rows x cols = n with rows <= cols (1 x n when n is prime)."""
    n = check_size(n)
    rows = max(d for d in range(1, math.isqrt(n) + 1) if n % d == 0)
    return rows, n // rows


def parse(spec: str | Topology, n: int | None = None) -> Topology:
    """Build a topology from a spec string; `n` is the number of peers where the spec has none.

    Grammar: ``NAME[:OPTION[,OPTION...]]`` (a comma may replace the colon), case-insensitive,
    whitespace ignored. Names: ring, torus, random, exponential, one-peer-exponential,
    complete. Options: ``ROWSxCOLS`` for torus; ``p=``, ``degree=``, ``seed=`` for random;
    ``weights=metropolis|uniform|push`` for all. Plain ``torus`` with n picks the most
    square grid. A Topology passes through unchanged (after checking n agrees), so callers
    can accept either. ``parse(t.spec, t.size) == t`` for every named topology.
    """
    if isinstance(spec, Topology):
        if n is not None and check_size(n, "n") != spec.size:
            raise TopologyError(
                f"{spec!r} has {spec.size} peers but n={n}; pass a topology of size {n}"
            )
        return spec
    if not isinstance(spec, str):
        raise TopologyError(
            f"a topology spec must be a string such as 'ring' or 'torus:4x4', "
            f"got {type(spec).__name__}"
        )
    size = None if n is None else check_size(n, "n")
    text = "".join(spec.split()).lower()
    cut = min((i for i in (text.find(":"), text.find(",")) if i >= 0), default=len(text))
    name, rest = text[:cut].replace("_", "-"), text[cut + 1 :]
    if name not in KNOWN_TOPOLOGIES:
        raise TopologyError(
            f"unknown topology {name or spec!r} in spec {spec!r}; known topologies: "
            f"{', '.join(KNOWN_TOPOLOGIES)} (e.g. {_EXAMPLES})"
        )
    options, bare = _options(spec, rest)
    weights = options.pop("weights", None)
    allowed = [k for k in KNOWN_TOPOLOGIES[name] if k != "ROWSxCOLS"] + ["weights"]
    unknown = sorted(set(options) - set(allowed))
    if unknown:
        raise TopologyError(
            f"{name} does not take option {unknown[0]!r} (in {spec!r}); it accepts "
            f"{', '.join(a + '=' for a in allowed)}"
        )
    if name == "torus":
        return _torus(spec, bare, size, weights)
    if bare:
        raise TopologyError(
            f"unexpected {bare[0]!r} in spec {spec!r}; options are KEY=VALUE, and {name} "
            f"accepts {', '.join(a + '=' for a in allowed)}"
        )
    if size is None:
        raise TopologyError(
            f"topology {name!r} needs a number of peers: pass n, e.g. parse({spec!r}, n=8) "
            f"(on the command line: -n 8)"
        )
    if name == "random":
        return RandomGraph(
            size,
            p=_number(spec, options, "p", float),
            degree=_number(spec, options, "degree", int),
            seed=_number(spec, options, "seed", int, default=0),
            weights=weights,
        )
    families: dict[str, type[Ring] | type[Exponential] | type[OnePeerExponential] | type[Complete]]
    families = {
        "ring": Ring,
        "exponential": Exponential,
        "one-peer-exponential": OnePeerExponential,
        "complete": Complete,
    }
    return families[name](size, weights=weights)


def _options(spec: str, rest: str) -> tuple[dict[str, str], list[str]]:
    """KEY=VALUE options as a dict, and bare words (a torus size) in order."""
    options: dict[str, str] = {}
    bare: list[str] = []
    if not rest:
        return options, bare
    for item in rest.split(","):
        if "=" not in item:
            if not item:
                raise TopologyError(
                    f"empty option in spec {spec!r}; separate options with single commas, "
                    f"e.g. random:p=0.3,seed=1"
                )
            bare.append(item)
            continue
        key, value = item.split("=", 1)
        if not key or not value or "=" in value:
            raise TopologyError(
                f"malformed option {item!r} in spec {spec!r}; write KEY=VALUE, "
                f"e.g. random:p=0.3,seed=1"
            )
        if key in options:
            raise TopologyError(f"option {key!r} appears twice in spec {spec!r}; give it once")
        options[key] = value
    return options, bare


def _number(spec: str, options: dict[str, str], key: str, kind: type, default=None):
    if key not in options:
        return default
    try:
        return kind(options[key])
    except ValueError:
        what = "an integer" if kind is int else "a number"
        raise TopologyError(
            f"option {key}={options[key]!r} in spec {spec!r} is not {what}; "
            f"e.g. random:p=0.3,seed=1 or random:degree=3,seed=2"
        ) from None


def _torus(spec: str, bare: list[str], size: int | None, weights: str | None) -> Torus:
    if len(bare) > 1:
        raise TopologyError(
            f"spec {spec!r} gives the torus size twice ({', '.join(bare)}); give ROWSxCOLS once"
        )
    if bare:
        match = _TORUS_SIZE.match(bare[0])
        if not match:
            raise TopologyError(
                f"bad torus size {bare[0]!r} in spec {spec!r}; write ROWSxCOLS, e.g. torus:4x4"
            )
        rows, cols = int(match.group(1)), int(match.group(2))
        if rows < 1 or cols < 1:
            raise TopologyError(
                f"torus size {rows}x{cols} in spec {spec!r} has an empty side; "
                f"rows and cols must be at least 1"
            )
        if size is not None and rows * cols != size:
            raise TopologyError(
                f"spec {spec!r} describes {rows * cols} peers ({rows}x{cols}) but n={size}; "
                f"make them agree, or leave out n or the size in the spec"
            )
        return Torus(rows, cols, weights=weights)
    if size is None:
        raise TopologyError(
            f"spec {spec!r} gives no torus size; write torus:ROWSxCOLS (e.g. torus:4x4) "
            f"or pass n to pick the most square grid"
        )
    rows, cols = square_factors(size)
    return Torus(rows, cols, weights=weights)
