"""The cupy adapter: cupy arrays reduced on the GPU, staged through pinned host buffers for the
wire (torch CUDA tensors have theirs in torch_arrays). The ring, broadcast and neighbour
algorithms run unchanged: they only see the ArrayAdapter interface, the same one the numpy
tests exercise.

Staging: ``send_buffer`` copies a device slice into a freshly taken pinned host buffer (from
cupy's or torch's pinned pool, so steady state allocates nothing) and hands its bytes to the
transport, which keeps the buffer alive until it is sent. ``from_frame`` copies received bytes
to a device buffer, where the reduction runs. Imported only when such an array is passed.
"""
from __future__ import annotations

from typing import Any

import numpy as np

from collectives.arrays.interface import ArrayAdapter, contiguous_error

__all__ = ["CupyAdapter"]


class CupyAdapter(ArrayAdapter):
    """cupy arrays on the current device."""

    kind = "cupy"
    on_host = False

    def __init__(self) -> None:
        import cupy
        self._cp = cupy
        self._reduce = {"sum": cupy.add, "mean": cupy.add, "max": cupy.maximum,
                        "min": cupy.minimum, "prod": cupy.multiply, "band": cupy.bitwise_and,
                        "bor": cupy.bitwise_or, "bxor": cupy.bitwise_xor}

    def flat(self, x: Any) -> Any:
        if not x.flags.c_contiguous:
            raise contiguous_error(x)
        return x.reshape(-1)

    def stand_in(self, x: Any) -> Any:
        return None if x.flags.c_contiguous else self._cp.ascontiguousarray(x)

    def write_back(self, x: Any, stand_in: Any) -> None:
        x[...] = stand_in

    def dtype_name(self, flat: Any) -> str:
        return flat.dtype.name

    def size(self, flat: Any) -> int:
        return int(flat.size)

    def send_buffer(self, flat: Any, start: int, stop: int) -> memoryview:
        part = flat[start:stop]
        nbytes = part.nbytes
        pinned = self._cp.cuda.alloc_pinned_memory(max(nbytes, 1))
        host = np.frombuffer(pinned, dtype=np.uint8, count=nbytes)  # keeps `pinned` alive
        part.view(self._cp.uint8).get(out=host)  # synchronous device-to-host copy
        return host.data

    def from_frame(self, frame: Any, dtype_name: str, count: int) -> Any:
        host = np.frombuffer(frame, dtype=dtype_name, count=count)
        device = self._cp.empty(count, dtype=dtype_name)
        device.set(host)
        return device

    def zeros(self, count: int, like: Any) -> Any:
        with like.device:
            return self._cp.zeros(count, dtype=like.dtype)

    def clone(self, flat: Any) -> Any:
        return flat.copy()

    def reduce(self, op: str, dst: Any, src: Any) -> None:
        if dst.dtype == np.bool_ and op in ("sum", "mean"):
            self._cp.logical_or(dst, src, out=dst)
        else:
            self._reduce[op](dst, src, out=dst)

    def reduce_into(self, op: str, dst: Any, a: Any, b: Any) -> None:
        if dst.dtype == np.bool_ and op in ("sum", "mean"):
            self._cp.logical_or(a, b, out=dst)
        else:
            self._reduce[op](a, b, out=dst)

    def copy(self, dst: Any, src: Any) -> None:
        dst[...] = src

    def divide(self, flat: Any, n: int) -> None:
        if flat.dtype.kind in "iu":
            self._cp.floor_divide(flat, n, out=flat)
        else:
            self._cp.divide(flat, n, out=flat)

    def divide_into(self, dst: Any, src: Any, divisor: float) -> None:
        self._cp.divide(src, divisor, out=dst)

    def scale(self, flat: Any, weight: float) -> None:
        self._cp.multiply(flat, weight, out=flat)

    def axpy(self, dst: Any, weight: float, src: Any) -> None:
        dst += src * weight

    def scaled_copy(self, dst: Any, weight: float, src: Any) -> None:
        self._cp.multiply(src, weight, out=dst)

    def scale_add(self, dst: Any, weight: float, src: Any) -> None:
        dst *= weight
        dst += src

    def lerp(self, dst: Any, src: Any, weight: float) -> None:
        dst += (src - dst) * weight

    def empty(self, count: int, dtype_name: str, like: Any = None) -> Any:
        return self._cp.empty(count, dtype=dtype_name)

    def all_finite(self, flat: Any) -> bool:
        return bool(self._cp.isfinite(flat).all())

    def synchronize(self) -> None:
        self._cp.cuda.get_current_stream().synchronize()
