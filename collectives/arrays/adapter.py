"""Which adapter serves an array: ``adapter_for(x)``, the one place that dispatches on the
array's family. torch and cupy are recognised by duck typing and their adapters imported
only when such an array shows up, so numpy-only peers never import them. Dependencies go
one way: this module imports the families, they import only collectives.arrays.interface.

The interface itself (ArrayAdapter, check_reduce_op, REDUCE_OPS) is re-exported here for
the algorithms that import it with adapter_for.
"""
from __future__ import annotations

import importlib
import sys
from typing import Any, Callable

import numpy as np

from collectives.arrays.interface import REDUCE_OPS, ArrayAdapter, check_reduce_op
from collectives.arrays.numpy_arrays import NumpyAdapter

__all__ = ["ArrayAdapter", "NumpyAdapter", "adapter_for", "REDUCE_OPS", "check_reduce_op"]

_NUMPY = NumpyAdapter()
# array class -> the function that picks the adapter of one of its arrays (torch: by device)
_choosers: dict[type, Callable[[Any], ArrayAdapter]] = {}


def _chooser(cls: type) -> Callable[[Any], ArrayAdapter]:
    module = cls.__module__.split(".")[0]
    if module == "torch" and "torch" in sys.modules:
        return importlib.import_module("collectives.arrays.torch_arrays").torch_adapter_for
    if module == "cupy" and "cupy" in sys.modules:
        cupy_adapter = importlib.import_module("collectives.arrays.cupy_arrays").CupyAdapter()
        return lambda x: cupy_adapter
    raise TypeError(f"collectives take numpy arrays, torch tensors or cupy arrays, not "
                    f"{cls.__module__}.{cls.__qualname__}")


def adapter_for(x: Any) -> ArrayAdapter:
    """The adapter for ``x``'s family (numpy array, torch CPU or CUDA tensor, cupy array);
    TypeError for anything else, or a torch device other than CPU and CUDA."""
    if isinstance(x, np.ndarray):
        return _NUMPY
    cls = type(x)
    choose = _choosers.get(cls)
    if choose is None:
        choose = _choosers[cls] = _chooser(cls)
    return choose(x)
