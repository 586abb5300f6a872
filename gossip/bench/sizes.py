"""Sizes and plans of a benchmark run: parsing and printing sizes, nccl-tests' size sweep,
iterations per size, how many messages an iteration sends, the wall limits, and the memory
available.

    parse_sizes("4K,64M")            # [4096, 67108864]
    sweep_sizes("4K", "64K", 4)      # [4096, 16384, 65536] (-b 4K -e 64K -f 4)
    make_plan([4096], None, 3)       # [(4096, 3, 50)]: (bytes, warm-up, timed iterations)
"""
from __future__ import annotations

import re
from typing import Iterable, Sequence

__all__ = ["ITEMSIZE", "DEFAULT_SIZES", "STARTUP_LIMIT", "parse_size", "parse_sizes",
           "format_size", "default_iters", "make_plan", "stream_count", "size_limit",
           "deadline_for", "sweep_sizes", "available_memory", "BUFFERS_PER_PEER"]

#: Arrays of the largest size each peer holds at once (its array, the received chunks' and
#: the send buffers): the memory a run needs is about this times the size times n.
BUFFERS_PER_PEER = 3

DEFAULT_SIZES = ("4K", "256K", "4M", "64M")
ITEMSIZE = 4  # float32
#: Seconds a run's processes get to start (Gloo's import torch on a loaded machine is seconds).
STARTUP_LIMIT = 60.0

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


def size_limit(entry: tuple[int, int, int], n: int, streamed=1) -> float:
    """A generous wall limit for measuring one size (bytes, warm-up, iterations) once the
    processes have started: 10 s plus a 50 MB/s floor on every iteration."""
    nbytes, warmup, iters = entry
    per_iter = 0.05 + nbytes * max(n, 2) / 5e7
    return 10.0 + (warmup + iters) * stream_count(streamed, nbytes) * per_iter


def deadline_for(plan, n: int, streamed=1) -> float:
    """A generous wall limit for one run of processes over the whole plan: STARTUP_LIMIT
    plus every size's size_limit."""
    return STARTUP_LIMIT + sum(size_limit(entry, n, streamed) for entry in plan)


def sweep_sizes(minbytes: str | int | None = None, maxbytes: str | int | None = None,
                stepfactor: str | int | None = None) -> list[int]:
    """nccl-tests' size sweep (-b/-e/-f): minbytes, minbytes*f, minbytes*f^2, ... up to
    maxbytes (K/M/G suffixes as parse_size). Either bound alone is a single size; the factor
    is an integer of at least 2 (default 2; nccl-tests' additive -i step is not offered)."""
    low = minbytes if minbytes is not None else maxbytes
    high = maxbytes if maxbytes is not None else minbytes
    if low is None or high is None:   # neither bound given
        raise ValueError("-f/--stepfactor needs -b/--minbytes and/or -e/--maxbytes")
    lo, hi = parse_size(low), parse_size(high)
    if lo > hi:
        raise ValueError(f"-b/--minbytes {format_size(lo)} is larger than -e/--maxbytes "
                         f"{format_size(hi)}")
    factor = 2
    if stepfactor is not None:
        try:
            factor = int(str(stepfactor).strip())
        except ValueError:
            raise ValueError(f"-f/--stepfactor must be an integer, got {stepfactor!r}") from None
        if factor < 2:
            raise ValueError(f"-f/--stepfactor must be at least 2, got {factor}")
    sizes, size = [], lo
    while size <= hi:
        sizes.append(size)
        size *= factor
    return sizes


def available_memory() -> int | None:
    """MemAvailable in bytes, or None where there is no /proc/meminfo."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        return None
    return None
