"""The numpy adapter: host arrays, sent zero-copy from their own memory. numpy has no fused
multiply-add, so the two-step operations go through cache-sized blocks."""
from __future__ import annotations

from typing import Any

import numpy as np

from collectives.arrays.interface import ArrayAdapter, contiguous_error

__all__ = ["NumpyAdapter", "BLOCK"]

_DTYPE_NAMES: dict[np.dtype, str] = {}
BLOCK = 32 * 1024  # elements per block of a two-pass numpy operation (fits in L2)


def _blocks(dst: np.ndarray, src: np.ndarray):
    """Matching blocks of ``dst`` and ``src``, BLOCK elements at most: done block by block,
    a two-step operation reads in its second step what the first left in cache (a
    whole-array temporary would cost two more passes)."""
    for lo in range(0, dst.size, BLOCK):
        yield dst[lo:lo + BLOCK], src[lo:lo + BLOCK]


class NumpyAdapter(ArrayAdapter):
    """numpy arrays (any dtype numpy has; no bfloat16)."""

    kind = "numpy"

    _reduce = {"sum": np.add, "mean": np.add, "max": np.maximum, "min": np.minimum,
               "prod": np.multiply, "band": np.bitwise_and, "bor": np.bitwise_or,
               "bxor": np.bitwise_xor}

    def flat(self, x: np.ndarray) -> np.ndarray:
        if not x.flags.c_contiguous:
            raise contiguous_error(x)
        if not x.flags.writeable:
            raise ValueError("the array is read-only; collectives work in place")
        return x.reshape(-1)

    def stand_in(self, x: np.ndarray) -> np.ndarray | None:
        return None if x.flags.c_contiguous else np.ascontiguousarray(x)

    def write_back(self, x: np.ndarray, stand_in: np.ndarray) -> None:
        np.copyto(x, stand_in)

    def dtype_name(self, flat: np.ndarray) -> str:
        dtype = flat.dtype
        name = _DTYPE_NAMES.get(dtype)
        if name is None:  # dtype.name is slow enough to show in a 4 KiB allreduce
            name = _DTYPE_NAMES[dtype] = dtype.name
        return name

    def size(self, flat: np.ndarray) -> int:
        return flat.size

    def send_buffer(self, flat: np.ndarray, start: int, stop: int) -> memoryview:
        # uint8 view: memoryview of float16/complex arrays is fine too, but a byte view is the
        # most portable buffer for libzmq and costs nothing.
        return flat[start:stop].view(np.uint8).data

    def from_frame(self, frame: Any, dtype_name: str, count: int) -> np.ndarray:
        return np.frombuffer(frame, dtype=dtype_name, count=count)

    def empty(self, count: int, dtype_name: str, like: Any = None) -> np.ndarray:
        return np.empty(count, dtype=dtype_name)

    def zeros(self, count: int, like: np.ndarray) -> np.ndarray:
        return np.zeros(count, dtype=like.dtype)

    def clone(self, flat: np.ndarray) -> np.ndarray:
        return flat.copy()

    def reduce(self, op: str, dst: np.ndarray, src: np.ndarray) -> None:
        if dst.dtype == np.bool_ and op in ("sum", "mean"):
            np.logical_or(dst, src, out=dst)
        else:
            self._reduce[op](dst, src, out=dst)

    def reduce_into(self, op: str, dst: np.ndarray, a: np.ndarray, b: np.ndarray) -> None:
        if dst.dtype == np.bool_ and op in ("sum", "mean"):
            np.logical_or(a, b, out=dst)
        else:
            self._reduce[op](a, b, out=dst)

    def copy(self, dst: np.ndarray, src: np.ndarray) -> None:
        np.copyto(dst, src)

    def divide(self, flat: np.ndarray, n: int) -> None:
        if flat.dtype.kind in "iu":
            np.floor_divide(flat, n, out=flat)  # integer mean: floor of the exact mean
        else:
            np.divide(flat, n, out=flat)

    def divide_into(self, dst: np.ndarray, src: np.ndarray, divisor: float) -> None:
        np.divide(src, divisor, out=dst)

    def scale(self, flat: np.ndarray, weight: float) -> None:
        np.multiply(flat, weight, out=flat)

    def axpy(self, dst: np.ndarray, weight: float, src: np.ndarray) -> None:
        if weight == 1.0:
            np.add(dst, src, out=dst)
            return
        tmp = np.empty(min(BLOCK, dst.size), dtype=dst.dtype)
        for d, s in _blocks(dst, src):
            t = tmp[:d.size]
            np.multiply(s, weight, out=t)
            np.add(d, t, out=d)

    def scaled_copy(self, dst: np.ndarray, weight: float, src: np.ndarray) -> None:
        np.multiply(src, weight, out=dst)

    def scale_add(self, dst: np.ndarray, weight: float, src: np.ndarray) -> None:
        for d, s in _blocks(dst, src):
            np.multiply(d, weight, out=d)
            np.add(d, s, out=d)

    def lerp(self, dst: np.ndarray, src: np.ndarray, weight: float) -> None:
        tmp = np.empty(min(BLOCK, dst.size), dtype=dst.dtype)
        for d, s in _blocks(dst, src):
            t = tmp[:d.size]
            np.subtract(s, d, out=t)
            np.multiply(t, weight, out=t)
            np.add(d, t, out=d)

    def all_finite(self, flat: np.ndarray) -> bool:
        return bool(np.isfinite(flat).all())
