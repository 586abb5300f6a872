"""Array adapters: the one interface through which every algorithm touches an array, so the same
ring allreduce runs on numpy arrays, torch tensors (CPU and CUDA) and cupy arrays.

An adapter works on *flat* views (one dimension, same memory as the caller's array) and knows
how to: expose a slice as a host buffer for a zero-copy send, turn a received frame into an
array of its kind, reduce and copy in place, and allocate. torch and cupy are recognised by duck
typing and imported only when such an array shows up, so numpy-only peers never import them.
"""
from __future__ import annotations

import sys
from typing import Any

import numpy as np

__all__ = ["ArrayAdapter", "NumpyAdapter", "adapter_for", "REDUCE_OPS", "check_reduce_op"]

REDUCE_OPS = ("sum", "mean", "max", "min", "prod")


def check_reduce_op(op: str, dtype_name: str) -> None:
    if op not in REDUCE_OPS:
        raise ValueError(f"unknown reduce op {op!r}; choose one of {', '.join(REDUCE_OPS)}")
    if op in ("max", "min") and dtype_name.startswith("complex"):
        raise TypeError(f"op {op!r} is not defined for {dtype_name}: complex numbers have no order")
    if op == "mean" and dtype_name == "bool":
        raise TypeError("op 'mean' is not defined for bool arrays; use 'sum' (logical or) "
                        "or cast to a number type")


class ArrayAdapter:
    """Operations on flat, contiguous arrays of one family. Subclasses implement them."""

    kind = "abstract"
    on_host = True  # False: frames must be staged between host and device

    def flat(self, x: Any) -> Any: ...
    def dtype_name(self, flat: Any) -> str: ...
    def size(self, flat: Any) -> int: ...
    def send_buffer(self, flat: Any, start: int, stop: int) -> Any: ...
    def from_frame(self, frame: Any, dtype_name: str, count: int) -> Any: ...
    def reduce(self, op: str, dst: Any, src: Any) -> None: ...
    def copy(self, dst: Any, src: Any) -> None: ...
    def divide(self, flat: Any, n: int) -> None: ...
    def scale(self, flat: Any, weight: float) -> None: ...
    def axpy(self, dst: Any, weight: float, src: Any) -> None:
        """dst += weight * src, in place."""
    def scaled_copy(self, dst: Any, weight: float, src: Any) -> None:
        """dst = weight * src (one pass: no copy-then-scale)."""
    def scale_add(self, dst: Any, weight: float, src: Any) -> None:
        """dst = weight * dst + src, in place."""
    def lerp(self, dst: Any, src: Any, weight: float) -> None:
        """dst += weight * (src - dst), in place: the weighted average of the two."""
    def empty(self, count: int, dtype_name: str, like: Any) -> Any: ...
    def slice(self, flat: Any, start: int, stop: int) -> Any:
        return flat[start:stop]

    def synchronize(self) -> None:
        """Wait for queued device work (GPU adapters); a no-op on the host."""


def _contiguous_error(x: Any) -> TypeError:
    return TypeError(f"a {type(x).__name__} of shape {tuple(x.shape)} is not contiguous; pass a "
                     "contiguous array (e.g. np.ascontiguousarray(x) or x.contiguous()) so the "
                     "operation can work in place")


_DTYPE_NAMES: dict[np.dtype, str] = {}
_BLOCK = 32 * 1024  # elements per block of a two-pass numpy operation (fits in L2)


def _blocks(dst: np.ndarray, src: np.ndarray):
    """Matching blocks of ``dst`` and ``src``, _BLOCK elements at most: numpy has no fused
    multiply-add, so a two-step operation done block by block reads in its second step what
    the first left in cache (a whole-array temporary would cost two more passes)."""
    for lo in range(0, dst.size, _BLOCK):
        yield dst[lo:lo + _BLOCK], src[lo:lo + _BLOCK]


class NumpyAdapter(ArrayAdapter):
    kind = "numpy"

    _reduce = {"sum": np.add, "mean": np.add, "max": np.maximum, "min": np.minimum,
               "prod": np.multiply}

    def flat(self, x: np.ndarray) -> np.ndarray:
        if not x.flags.c_contiguous:
            raise _contiguous_error(x)
        if not x.flags.writeable:
            raise ValueError("the array is read-only; collectives work in place")
        return x.reshape(-1)

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
        return memoryview(flat[start:stop].view(np.uint8))

    def from_frame(self, frame: Any, dtype_name: str, count: int) -> np.ndarray:
        return np.frombuffer(frame, dtype=dtype_name, count=count)

    def reduce(self, op: str, dst: np.ndarray, src: np.ndarray) -> None:
        if dst.dtype == np.bool_ and op in ("sum", "mean"):
            np.logical_or(dst, src, out=dst)
        else:
            self._reduce[op](dst, src, out=dst)

    def copy(self, dst: np.ndarray, src: np.ndarray) -> None:
        np.copyto(dst, src)

    def divide(self, flat: np.ndarray, n: int) -> None:
        if flat.dtype.kind in "iu":
            np.floor_divide(flat, n, out=flat)  # integer mean: floor of the exact mean
        else:
            np.divide(flat, n, out=flat)

    def scale(self, flat: np.ndarray, weight: float) -> None:
        np.multiply(flat, weight, out=flat)

    def axpy(self, dst: np.ndarray, weight: float, src: np.ndarray) -> None:
        if weight == 1.0:
            np.add(dst, src, out=dst)
            return
        tmp = np.empty(min(_BLOCK, dst.size), dtype=dst.dtype)
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
        tmp = np.empty(min(_BLOCK, dst.size), dtype=dst.dtype)
        for d, s in _blocks(dst, src):
            t = tmp[:d.size]
            np.subtract(s, d, out=t)
            np.multiply(t, weight, out=t)
            np.add(d, t, out=d)

    def empty(self, count: int, dtype_name: str, like: Any = None) -> np.ndarray:
        return np.empty(count, dtype=dtype_name)


_NUMPY = NumpyAdapter()
_cache: dict[type, ArrayAdapter] = {}


def adapter_for(x: Any) -> ArrayAdapter:
    """The adapter for ``x``'s family, recognised without importing torch or cupy unless the
    object's own module already did."""
    if isinstance(x, np.ndarray):
        return _NUMPY
    cls = type(x)
    found = _cache.get(cls)
    if found is not None:
        return found
    module = cls.__module__.split(".")[0]
    if module == "torch" and "torch" in sys.modules:
        from collectives.arrays.torch_arrays import torch_adapter_for
        found = torch_adapter_for(x)
        if found.kind == "torch-cuda":
            return found  # per-device; not cached by class
    elif module == "cupy" and "cupy" in sys.modules:
        from collectives.arrays.gpu_arrays import CupyAdapter
        found = CupyAdapter()
    else:
        raise TypeError(f"collectives take numpy arrays, torch tensors or cupy arrays, not "
                        f"{cls.__module__}.{cls.__qualname__}")
    _cache[cls] = found
    return found
