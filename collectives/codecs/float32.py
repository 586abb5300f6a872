"""Between the array families and the codecs' array-module code: a flat array of any family
as a float32 array of numpy's API (numpy itself, or cupy), and the result written back.

torch tensors on the CPU become numpy views of their memory (bfloat16 and float16 ones a
float32 copy); CUDA tensors go to cupy through DLPack (zero-copy; cupy required). The
family is told by the adapter (collectives.arrays), the one place that knows families.
"""
from __future__ import annotations

from typing import Any

import numpy as np

from collectives.arrays.interface import ArrayAdapter

__all__ = ["as_float32", "write_back", "zeros_float32", "FLOAT_DTYPES"]

FLOAT_DTYPES = ("float16", "bfloat16", "float32", "float64")
"""The floating dtypes the codecs take (each is turned into float32 to be encoded, and back)."""


def as_float32(adapter: ArrayAdapter, flat: Any, dtype: str) -> Any:
    """``flat`` as a float32 array of numpy's API: itself (or a view) when it is float32,
    else a converted copy (accumulation is in float32, whatever the parameters' dtype)."""
    if dtype not in FLOAT_DTYPES:
        raise TypeError(f"compression works on floating-point arrays, not {dtype}")
    if adapter.kind == "numpy" or adapter.kind == "cupy":
        return flat if dtype == "float32" else flat.astype("float32")
    if adapter.kind == "torch":
        return (flat if dtype == "float32" else flat.float()).detach().numpy()
    if adapter.kind == "torch-cuda":
        import cupy
        return cupy.from_dlpack((flat if dtype == "float32" else flat.float()).detach())
    raise TypeError(f"compression does not handle {adapter.kind} arrays")


def write_back(adapter: ArrayAdapter, flat: Any, values: Any) -> None:
    """flat[:] = values (float32, numpy's API), converted to flat's dtype; nothing to do when
    ``values`` is flat's own memory."""
    if adapter.kind in ("numpy", "cupy"):
        if values is not flat:
            flat[...] = values
        return
    import torch
    if adapter.kind == "torch":
        source = torch.from_numpy(np.asarray(values))
    else:
        source = torch.from_dlpack(values)
    if source.data_ptr() != flat.data_ptr():
        with torch.no_grad():
            flat.copy_(source)


def zeros_float32(adapter: ArrayAdapter, flat: Any) -> Any:
    """A zeroed float32 array of flat's size in the module as_float32 gives for it (an
    error-feedback residual, an anchor)."""
    if adapter.kind in ("cupy", "torch-cuda"):
        import cupy
        return cupy.zeros(adapter.size(flat), dtype="float32")
    return np.zeros(adapter.size(flat), dtype=np.float32)
