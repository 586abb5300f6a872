"""torch's vectorised kernels for numpy arrays on the host, when torch is already imported.

numpy's float32 <-> float16 cast runs one element at a time (2-3 GB/s measured here, against
about 25 GB/s for torch's on the same arrays, benchmarks/compression.py), and its reductions
along an axis are slower than torch's too. So the host codecs run torch on zero-copy views
of the same numpy memory when torch is in sys.modules (a torch user's process); a numpy-only
peer never imports torch and takes the array-module path, which gives the same bytes.
"""
from __future__ import annotations

import sys
from typing import Any

import numpy as np

__all__ = ["torch_views"]


def torch_views(*arrays: Any) -> tuple[Any, ...] | None:
    """torch tensors over the same memory as ``arrays`` (numpy arrays), or None when torch
    is not imported or an array is not a numpy array."""
    torch = sys.modules.get("torch")
    if torch is None or not all(isinstance(a, np.ndarray) for a in arrays):
        return None
    return tuple(torch.from_numpy(a) for a in arrays)
