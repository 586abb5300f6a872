"""bf16: the upper 16 bits of float32, rounded to nearest even, done with integer arithmetic
on the bits (numpy has no bfloat16 type), so numpy and cupy share it."""
from __future__ import annotations

from typing import Any

from collectives.codecs.codec import WORK_ELEMENTS, Codec, array_module
from collectives.codecs.fast import torch_views

__all__ = ["BFloat16"]

_QUIET_NAN = 0x7FC0


def _torch_bf16() -> Any:
    import torch   # only called once torch_views found it imported
    return torch.bfloat16


class BFloat16(Codec):
    """2 bytes per element, float32's range: |e| <= 2^-8 |x| for normal values (8 bits of
    mantissa, round to nearest even; values past bf16's largest round to inf as float32's
    would); NaN stays NaN."""

    family = "bf16"

    @property
    def name(self) -> str:
        return "bf16"

    def encoded_nbytes(self, count: int) -> int:
        return 2 * count

    def encode(self, x: Any, out: Any) -> None:
        xp = array_module(x)
        fast = torch_views(x, out.view(xp.int16))
        if fast is not None:   # torch's cast: the same bytes, but for a NaN's payload
            fast[1].view(_torch_bf16()).copy_(fast[0])
            return
        bits = x.view(xp.uint32)
        dst = out.view(xp.uint16)
        work = xp.empty(min(WORK_ELEMENTS, bits.size), dtype=xp.uint32)
        for lo in range(0, bits.size, WORK_ELEMENTS):
            u = bits[lo:lo + WORK_ELEMENTS]
            t = work[:u.size]
            # Round to nearest even: add 0x7FFF plus the lowest kept bit, then truncate.
            xp.right_shift(u, 16, out=t)
            xp.bitwise_and(t, 1, out=t)
            t += 0x7FFF
            t += u
            xp.right_shift(t, 16, out=t)
            d = dst[lo:lo + WORK_ELEMENTS]
            xp.copyto(d, t, casting="unsafe")
            # A NaN whose payload sits in the low bits would round to inf: keep it a NaN.
            # Looked for by one reduction (max is NaN if any is), not a mask and any().
            if xp.isnan(x[lo:lo + WORK_ELEMENTS].max()):
                nan = xp.bitwise_and(u, 0x7FFFFFFF) > 0x7F800000
                d[nan] = _QUIET_NAN

    def decode(self, data: Any, out: Any) -> None:
        xp = array_module(out)
        fast = torch_views(data.view(xp.int16), out)
        if fast is not None:
            fast[1].copy_(fast[0].view(_torch_bf16()))
            return
        bits = out.view(xp.uint32)
        xp.copyto(bits, data.view(xp.uint16))   # widened first: a uint16 shift would lose it
        xp.left_shift(bits, 16, out=bits)

    def error_bound(self, x: Any) -> Any:
        xp = array_module(x)
        return xp.maximum(xp.abs(x) * 2.0 ** -8, 2.0 ** -133).astype(xp.float32)
