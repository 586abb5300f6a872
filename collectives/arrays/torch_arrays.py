"""The torch adapters: tensors reduced with torch ops (so bfloat16 works, which numpy lacks).
CPU tensors are sent zero-copy through a numpy view of the same memory; CUDA tensors are
reduced on their device and staged through pinned CPU tensors for the wire. Imported only
when a torch tensor is passed to a collective."""
from __future__ import annotations

from typing import Any, Callable

import numpy as np
import torch

from collectives.arrays.interface import ArrayAdapter, contiguous_error

__all__ = ["TorchCPUAdapter", "TorchCUDAAdapter", "torch_adapter_for", "TORCH_DTYPES", "CPU"]

TORCH_DTYPES: dict[str, torch.dtype] = {
    "bool": torch.bool, "int8": torch.int8, "uint8": torch.uint8, "int16": torch.int16,
    "int32": torch.int32, "int64": torch.int64, "float16": torch.float16,
    "bfloat16": torch.bfloat16, "float32": torch.float32, "float64": torch.float64,
    "complex64": torch.complex64, "complex128": torch.complex128,
}
# Unsigned types wider than 8 bits came in torch 2.3; before, no tensor has them.
TORCH_DTYPES.update({name: dtype for name in ("uint16", "uint32", "uint64")
                     if (dtype := getattr(torch, name, None)) is not None})
_NAMES = {v: k for k, v in TORCH_DTYPES.items()}
# torch (2.13) has no add, maximum, minimum or floor division on them: their reductions run on
# numpy views of the same memory.
_VIA_NUMPY = frozenset(TORCH_DTYPES[name] for name in ("uint16", "uint32", "uint64")
                       if name in TORCH_DTYPES)
_NUMPY_REDUCE: dict[str, Callable[..., Any]] = {
    "sum": np.add, "mean": np.add, "max": np.maximum, "min": np.minimum, "prod": np.multiply,
    "band": np.bitwise_and, "bor": np.bitwise_or, "bxor": np.bitwise_xor}

# bfloat16 has no numpy twin: its bytes travel through an int16 view of the same memory.
_BYTE_VIEW = {torch.bfloat16: torch.int16}


class TorchCPUAdapter(ArrayAdapter):
    """torch CPU tensors. Every operation runs under no_grad, as an optimizer's would."""

    kind = "torch"

    _reduce: dict[str, Callable[..., torch.Tensor]] = {
        "sum": torch.add, "mean": torch.add, "max": torch.maximum, "min": torch.minimum,
        "prod": torch.mul, "band": torch.bitwise_and, "bor": torch.bitwise_or,
        "bxor": torch.bitwise_xor}

    def flat(self, x: torch.Tensor) -> torch.Tensor:
        if not x.is_contiguous():
            raise contiguous_error(x)
        if x.requires_grad and x.is_leaf:
            # In-place communication on a leaf that autograd tracks is what optimizers do
            # under no_grad; do the same instead of failing.
            x = x.detach()
        return x.view(-1)

    def stand_in(self, x: torch.Tensor) -> torch.Tensor | None:
        return None if x.is_contiguous() else x.detach().contiguous()

    def write_back(self, x: torch.Tensor, stand_in: torch.Tensor) -> None:
        with torch.no_grad():
            x.copy_(stand_in)

    def dtype_name(self, flat: torch.Tensor) -> str:
        try:
            return _NAMES[flat.dtype]
        except KeyError:   # (a quantized or float8 tensor): flat_of's refusal, named there
            return str(flat.dtype).replace("torch.", "")

    def size(self, flat: torch.Tensor) -> int:
        return flat.numel()

    def send_buffer(self, flat: torch.Tensor, start: int, stop: int) -> memoryview:
        part = flat[start:stop]
        view = _BYTE_VIEW.get(part.dtype)
        arr = (part.view(view) if view is not None else part).numpy()
        return arr.view(np.uint8).data

    def from_frame(self, frame: Any, dtype_name: str, count: int) -> torch.Tensor:
        if count == 0:
            return torch.empty(0, dtype=TORCH_DTYPES[dtype_name])
        return torch.frombuffer(frame, dtype=TORCH_DTYPES[dtype_name], count=count)

    def empty(self, count: int, dtype_name: str, like: Any = None) -> torch.Tensor:
        return torch.empty(count, dtype=TORCH_DTYPES[dtype_name])

    def zeros(self, count: int, like: torch.Tensor) -> torch.Tensor:
        return torch.zeros(count, dtype=like.dtype, device=like.device)

    def clone(self, flat: torch.Tensor) -> torch.Tensor:
        return flat.detach().clone()

    def reduce(self, op: str, dst: torch.Tensor, src: torch.Tensor) -> None:
        with torch.no_grad():
            if dst.dtype == torch.bool and op in ("sum", "mean"):
                torch.logical_or(dst, src, out=dst)
            elif dst.dtype in _VIA_NUMPY:
                into = dst.numpy()
                _NUMPY_REDUCE[op](into, src.numpy(), out=into)
            else:
                self._reduce[op](dst, src, out=dst)

    def reduce_into(self, op: str, dst: torch.Tensor, a: torch.Tensor,
                    b: torch.Tensor) -> None:
        with torch.no_grad():
            if dst.dtype == torch.bool and op in ("sum", "mean"):
                torch.logical_or(a, b, out=dst)
            elif dst.dtype in _VIA_NUMPY:
                _NUMPY_REDUCE[op](a.numpy(), b.numpy(), out=dst.numpy())
            else:
                self._reduce[op](a, b, out=dst)

    def copy(self, dst: torch.Tensor, src: torch.Tensor) -> None:
        with torch.no_grad():
            dst.copy_(src)

    def divide(self, flat: torch.Tensor, n: int) -> None:
        with torch.no_grad():
            if flat.dtype.is_floating_point or flat.dtype.is_complex:
                flat.div_(n)
            elif flat.dtype in _VIA_NUMPY:
                into = flat.numpy()
                np.floor_divide(into, n, out=into)
            else:
                torch.floor_divide(flat, n, out=flat)

    def divide_into(self, dst: torch.Tensor, src: torch.Tensor, divisor: float) -> None:
        with torch.no_grad():
            torch.div(src, divisor, out=dst)

    def scale(self, flat: torch.Tensor, weight: float) -> None:
        with torch.no_grad():
            flat.mul_(weight)

    def axpy(self, dst: torch.Tensor, weight: float, src: torch.Tensor) -> None:
        with torch.no_grad():
            dst.add_(src, alpha=weight)

    def scaled_copy(self, dst: torch.Tensor, weight: float, src: torch.Tensor) -> None:
        with torch.no_grad():
            torch.mul(src, weight, out=dst)

    def scale_add(self, dst: torch.Tensor, weight: float, src: torch.Tensor) -> None:
        with torch.no_grad():
            torch.add(src, dst, alpha=weight, out=dst)  # src + weight * dst, one pass

    def lerp(self, dst: torch.Tensor, src: torch.Tensor, weight: float) -> None:
        with torch.no_grad():
            dst.lerp_(src, weight)   # one fused pass

    def all_finite(self, flat: torch.Tensor) -> bool:
        return bool(torch.isfinite(flat).all())


class TorchCUDAAdapter(TorchCPUAdapter):
    """torch CUDA tensors: the same torch operations, run on the tensors' device (bfloat16
    included, which cupy lacks); only the wire differs: frames are staged through pinned CPU
    tensors."""

    kind = "torch-cuda"
    on_host = False

    def __init__(self, device: Any) -> None:
        self._device = device

    def send_buffer(self, flat: torch.Tensor, start: int, stop: int) -> memoryview:
        part = flat[start:stop]
        host = torch.empty(part.shape, dtype=part.dtype, pin_memory=True)
        host.copy_(part)  # synchronous: the buffer is complete when handed to the transport
        return super().send_buffer(host, 0, host.numel())

    def from_frame(self, frame: Any, dtype_name: str, count: int) -> torch.Tensor:
        return super().from_frame(frame, dtype_name, count).to(self._device)

    def empty(self, count: int, dtype_name: str, like: Any = None) -> torch.Tensor:
        return torch.empty(count, dtype=TORCH_DTYPES[dtype_name], device=self._device)

    def synchronize(self) -> None:
        torch.cuda.synchronize(self._device)


#: The CPU adapter (stateless: one for every CPU tensor).
CPU = TorchCPUAdapter()


def torch_adapter_for(x: torch.Tensor) -> ArrayAdapter:
    """The adapter for a tensor on its device: CPU, or CUDA (one adapter per call: it
    carries the device); TypeError for other devices."""
    if x.device.type == "cpu":
        return CPU
    if x.device.type == "cuda":
        return TorchCUDAAdapter(x.device)
    raise TypeError(f"tensors on device {x.device} are not supported; use CPU or CUDA tensors")
