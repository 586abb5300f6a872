"""Array adapters: the one vocabulary through which every algorithm and policy touches an array
(numpy, torch CPU and CUDA, cupy). torch and cupy adapters are imported only when such an array
shows up."""
from collectives.arrays.adapter import (REDUCE_OPS, ArrayAdapter, NumpyAdapter, adapter_for,
                                        check_reduce_op)

__all__ = ["ArrayAdapter", "NumpyAdapter", "adapter_for", "REDUCE_OPS", "check_reduce_op"]
