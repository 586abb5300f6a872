"""The array-adapter interface: every operation an algorithm or a policy performs on an array,
as abstract methods, so the ring allreduce and the averaging policies run unchanged on numpy
arrays, torch tensors (CPU and CUDA) and cupy arrays.

An adapter works on *flat* views (one dimension, same memory as the caller's array). An
adapter class that misses an operation cannot be instantiated (``abc``): it fails when it is
first chosen, not with an AttributeError in the middle of training. This module imports no
array library but numpy; the families live in numpy_arrays, torch_arrays and cupy_arrays,
and adapter.adapter_for picks one.
"""
from __future__ import annotations

import abc
from typing import Any, TypeAlias

__all__ = ["Array", "ArrayAdapter", "REDUCE_OPS", "BITWISE_OPS", "check_reduce_op",
           "contiguous_error", "segment"]

Array: TypeAlias = Any
"""An array a collective or a policy takes: a numpy ndarray, a torch Tensor (CPU or CUDA) or a cupy
ndarray, in any dtype the wire carries (transport/wire.py). torch and cupy are optional and
recognised by duck typing (adapter.adapter_for), and no one static type covers the three
families, so the alias is ``Any``: it marks where an array goes, and adapter_for checks the
family at run time (TypeError for anything else)."""

REDUCE_OPS = ("sum", "mean", "max", "min", "prod", "band", "bor", "bxor")
"""The reductions a collective takes as ``op=`` (the bitwise ones: BITWISE_OPS)."""
#: Bitwise and, or, exclusive or: integer and bool arrays only (MPI_BAND/BOR/BXOR,
#: torch.distributed's ReduceOp.BAND/BOR/BXOR).
BITWISE_OPS = ("band", "bor", "bxor")


def check_reduce_op(op: str, dtype_name: str) -> None:
    """ValueError for an unknown reduce op, TypeError for one the dtype does not have."""
    if op not in REDUCE_OPS:
        raise ValueError(f"unknown reduce op {op!r}; choose one of {', '.join(REDUCE_OPS)}")
    if op in ("max", "min") and dtype_name.startswith("complex"):
        raise TypeError(f"op {op!r} is not defined for {dtype_name}: complex numbers have no order")
    if op in BITWISE_OPS and not (dtype_name == "bool" or dtype_name.startswith(("int", "uint"))):
        raise TypeError(f"op {op!r} is bitwise: it takes integer or bool arrays, not "
                        f"{dtype_name}")
    if op == "mean" and dtype_name == "bool":
        raise TypeError("op 'mean' is not defined for bool arrays; use 'sum' (logical or) "
                        "or cast to a number type")


def contiguous_error(x: Any) -> TypeError:
    """The error for an array that cannot be viewed flat without a copy."""
    return TypeError(f"a {type(x).__name__} of shape {tuple(x.shape)} is not contiguous; pass a "
                     "contiguous array (e.g. np.ascontiguousarray(x) or x.contiguous()) so the "
                     "operation can work in place")


def segment(count: int, rank: int, n: int) -> tuple[int, int]:
    """Elements [lo, hi) of a flat buffer of ``count`` that ``rank`` of ``n`` owns: the split
    of reduce_scatter (rank r owns [count*r//n, count*(r+1)//n)), also the sharded EASGD
    centre's."""
    return count * rank // n, count * (rank + 1) // n


class ArrayAdapter(abc.ABC):
    """Operations on flat, contiguous arrays of one family. Element-wise operations work in
    place, in one pass over memory where the library allows it, and allocate nothing (the
    numpy adapter's two-step ones go block by block through a cache-sized scratch)."""

    kind = "abstract"
    on_host = True  # False: frames must be staged between host and device

    # ------------------------------------------------------------------ shape and wire
    @abc.abstractmethod
    def flat(self, x: Any) -> Any:
        """A one-dimensional view of ``x`` (TypeError if that would need a copy)."""

    def stand_in(self, x: Any) -> Any:
        """A contiguous copy of ``x`` for a call to work on, or None when ``x`` is contiguous
        (``flat`` takes it as it is): collectives/staging.py."""
        return None

    def write_back(self, x: Any, stand_in: Any) -> None:
        """x[...] = stand_in: a non-contiguous array takes the result its stand-in holds."""
        raise NotImplementedError

    @abc.abstractmethod
    def dtype_name(self, flat: Any) -> str:
        """The dtype's wire name (numpy's spelling; "bfloat16" for torch's)."""

    @abc.abstractmethod
    def size(self, flat: Any) -> int:
        """Number of elements."""

    @abc.abstractmethod
    def send_buffer(self, flat: Any, start: int, stop: int) -> Any:
        """Elements [start, stop) as a host buffer the transport can send (zero-copy on the
        host; a staged copy from a device)."""

    @abc.abstractmethod
    def from_frame(self, frame: Any, dtype_name: str, count: int) -> Any:
        """A received frame as an array of this family (on the device, for GPU adapters)."""

    def slice(self, flat: Any, start: int, stop: int) -> Any:
        """Elements [start, stop), a view."""
        return flat[start:stop]

    # ------------------------------------------------------------------ allocation
    @abc.abstractmethod
    def empty(self, count: int, dtype_name: str, like: Any = None) -> Any:
        """An uninitialised flat array of ``count`` elements (on ``like``'s device)."""

    @abc.abstractmethod
    def zeros(self, count: int, like: Any) -> Any:
        """A zeroed flat array of ``count`` elements of ``like``'s dtype and device."""

    @abc.abstractmethod
    def clone(self, flat: Any) -> Any:
        """A copy of ``flat`` (same family, dtype and device; detached from autograd)."""

    # ------------------------------------------------------------------ element-wise
    @abc.abstractmethod
    def reduce(self, op: str, dst: Any, src: Any) -> None:
        """dst = op(dst, src), in place (sum and mean of bools: logical or)."""

    @abc.abstractmethod
    def reduce_into(self, op: str, dst: Any, a: Any, b: Any) -> None:
        """dst = op(a, b), one pass (sum and mean of bools: logical or); ``dst`` may be ``a``
        or ``b``. The same bytes as ``reduce(op, c, b)`` on a copy ``c`` of ``a``: the
        operands in the same order (with fused multiply-add, a complex product is not
        commutative bit for bit)."""

    @abc.abstractmethod
    def copy(self, dst: Any, src: Any) -> None:
        """dst = src, in place."""

    @abc.abstractmethod
    def divide(self, flat: Any, n: int) -> None:
        """flat /= n, in place (integers: floor division)."""

    @abc.abstractmethod
    def divide_into(self, dst: Any, src: Any, divisor: float) -> None:
        """dst = src / divisor (one pass: no copy-then-divide)."""

    @abc.abstractmethod
    def scale(self, flat: Any, weight: float) -> None:
        """flat *= weight, in place."""

    @abc.abstractmethod
    def axpy(self, dst: Any, weight: float, src: Any) -> None:
        """dst += weight * src, in place."""

    @abc.abstractmethod
    def scaled_copy(self, dst: Any, weight: float, src: Any) -> None:
        """dst = weight * src (one pass: no copy-then-scale)."""

    @abc.abstractmethod
    def scale_add(self, dst: Any, weight: float, src: Any) -> None:
        """dst = weight * dst + src, in place."""

    @abc.abstractmethod
    def lerp(self, dst: Any, src: Any, weight: float) -> None:
        """dst += weight * (src - dst), in place: the weighted average of the two."""

    @abc.abstractmethod
    def all_finite(self, flat: Any) -> bool:
        """True if no element is NaN or infinite."""

    def synchronize(self) -> None:
        """Wait for queued device work (GPU adapters); a no-op on the host."""
