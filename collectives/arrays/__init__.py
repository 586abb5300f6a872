"""Array adapters: the one vocabulary through which every algorithm and policy touches an array
(numpy, torch CPU and CUDA, cupy). ``interface`` declares it, ``numpy_arrays``, ``torch_arrays``
and ``cupy_arrays`` implement it, ``adapter.adapter_for`` picks one; torch and cupy adapters
are imported only when such an array shows up."""
from collectives.arrays.adapter import adapter_for
from collectives.arrays.interface import (REDUCE_OPS, Array, ArrayAdapter, check_reduce_op,
                                          segment)
from collectives.arrays.numpy_arrays import NumpyAdapter

__all__ = ["Array", "ArrayAdapter", "NumpyAdapter", "adapter_for", "REDUCE_OPS", "check_reduce_op",
           "segment"]
