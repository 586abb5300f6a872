"""Sizes and plans of a benchmark run: parsing and printing sizes, iterations per size, how
many messages an iteration sends, and the wall limit of a run of peers.

    parse_sizes("4K,64M")            # [4096, 67108864]
    make_plan([4096], None, 3)       # [(4096, 3, 50)]: (bytes, warm-up, timed iterations)
"""
from __future__ import annotations

import re
from typing import Iterable, Sequence

__all__ = ["ITEMSIZE", "DEFAULT_SIZES", "parse_size", "parse_sizes", "format_size",
           "default_iters", "make_plan", "stream_count", "deadline_for", "check_memory",
           "BUFFERS_PER_PEER"]

#: Arrays of the largest size each peer holds at once (its array, the received chunks' and
#: the send buffers): the memory a run needs is about this times the size times n.
BUFFERS_PER_PEER = 3

DEFAULT_SIZES = ("4K", "256K", "4M", "64M")
ITEMSIZE = 4  # float32

_UNITS = {"": 1, "B": 1, "K": 1 << 10, "KB": 1 << 10, "KIB": 1 << 10, "M": 1 << 20,
          "MB": 1 << 20, "MIB": 1 << 20, "G": 1 << 30, "GB": 1 << 30, "GIB": 1 << 30}
_SIZE_RE = re.compile(r"^\s*(\d+(?:\.\d*)?|\.\d+)\s*([A-Za-z]*)\s*$")


def parse_size(text: str | int) -> int:
    """'4K' -> 4096, '64M' -> 67108864, '1000' -> 1000 (K/M/G are powers of 1024), rounded
    down to a whole number of float32 elements."""
    if isinstance(text, int) and not isinstance(text, bool):
        value = text
    else:
        m = _SIZE_RE.match(str(text))
        unit = m.group(2).upper() if m else None
        if m is None or unit not in _UNITS:
            raise ValueError(f"bad size {str(text)!r}: give bytes or a K/M/G suffix (powers of "
                             "1024), e.g. 4K,256K,4M,64M")
        value = int(float(m.group(1)) * _UNITS[unit])
    value -= value % ITEMSIZE
    if value < ITEMSIZE:
        raise ValueError(f"bad size {str(text)!r}: must be at least {ITEMSIZE} bytes "
                         "(one float32)")
    return value


def parse_sizes(spec: str | int | Iterable[str | int]) -> list[int]:
    """'4K,256K' (commas or spaces) or a list of sizes -> bytes."""
    if isinstance(spec, (str, int)):
        items = [s for s in re.split(r"[,\s]+", str(spec)) if s]
    else:
        items = list(spec)
    if not items:
        raise ValueError("no sizes given (e.g. --sizes 4K,256K,4M,64M)")
    return [parse_size(s) for s in items]


def format_size(nbytes: int) -> str:
    """``nbytes`` in the largest binary unit that divides it exactly ("4 KiB", "64 MiB"), else in
    bytes."""
    for unit, f in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if nbytes >= f and nbytes % f == 0:
            return f"{nbytes // f} {unit}"
    return f"{nbytes} B"


def default_iters(nbytes: int) -> int:
    """Timed iterations per size, as the baseline: 50 up to 256 KiB, 20 up to 4 MiB, then 10."""
    if nbytes <= 256 * 1024:
        return 50
    if nbytes <= 4 * 1024 * 1024:
        return 20
    return 10


def make_plan(sizes: Sequence[int], iters: int | None,
              warmup: int) -> list[tuple[int, int, int]]:
    """(bytes, warm-up iterations, timed iterations) for each size."""
    return [(nbytes, warmup, iters if iters else default_iters(nbytes)) for nbytes in sizes]


def stream_count(stream, nbytes: int) -> int:
    """Messages per iteration: ``stream`` is an int, a dict {nbytes: k}, or a callable."""
    if callable(stream):
        return int(stream(nbytes))
    if isinstance(stream, dict):
        return int(stream.get(nbytes, 1))
    return int(stream)


def deadline_for(plan, n: int, streamed=1) -> float:
    """A generous wall limit for one spawn: start-up plus a 50 MB/s floor on every iteration."""
    total = 60.0
    for nbytes, warmup, iters in plan:
        per_iter = 0.05 + nbytes * max(n, 2) / 5e7
        total += (warmup + iters) * stream_count(streamed, nbytes) * per_iter
    return total


def check_memory(n: int, sizes: Sequence[int], available: int | None = None) -> None:
    """ValueError, before any peer starts, when the largest size cannot fit n peers' buffers
    in the memory available (MemAvailable; a run that does not fit dies in the kernel's OOM
    killer or in allocation failures deep in n processes)."""
    if not sizes:
        return
    if available is None:
        available = _available_bytes()
        if available is None:
            return   # (not Linux: nothing to check against)
    need = BUFFERS_PER_PEER * max(sizes) * n
    if need > available:
        raise ValueError(f"--sizes {format_size(max(sizes))} with {n} peers needs about "
                         f"{need / 2**30:.1f} GiB ({BUFFERS_PER_PEER} arrays of that size per "
                         f"peer); this machine has {available / 2**30:.1f} GiB available")


def _available_bytes() -> int | None:
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        return None
    return None
