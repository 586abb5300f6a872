"""fp16: float32 cast to IEEE half precision, round to nearest even (numpy's and cupy's cast;
on numpy arrays without torch, the same bytes by vectorised arithmetic: halves.py)."""
from __future__ import annotations

from typing import Any

import numpy as np

from collectives.codecs.codec import Codec, array_module
from collectives.codecs.fast import torch_views
from collectives.codecs.halves import decode_fp16, encode_fp16

__all__ = ["Float16", "FP16_MAX"]

FP16_MAX = 65504.0


class Float16(Codec):
    """2 bytes per element. Error: |e| <= 2^-11 |x| for |x| >= 2^-14 (normal halves), |e| <=
    2^-25 below (subnormals); |x| > 65504 overflows to inf (as torch's fp16 hooks, scale
    first if values can be that large)."""

    family = "fp16"
    # Values below 2^-25 decode as 0: no contraction near zero, where CHOCO's differences
    # end up (measured: consensus stalls at ~4e-8 with fp16, goes on to 1e-13 with bf16).
    contractive = False

    @property
    def name(self) -> str:
        return "fp16"

    def encoded_nbytes(self, count: int) -> int:
        return 2 * count

    def encode(self, x: Any, out: Any) -> None:
        xp = array_module(x)
        fast = torch_views(x, out.view(xp.float16))
        if fast is not None:
            fast[1].copy_(fast[0])   # the same rounding (to nearest even), vectorised
            return
        if xp is np:   # numpy's cast runs one element at a time: 8x slower than halves.py
            encode_fp16(x, out.view(np.uint16))
            return
        with np.errstate(over="ignore"):   # overflow to inf is the documented result
            xp.copyto(out.view(xp.float16), x, casting="same_kind")

    def decode(self, data: Any, out: Any) -> None:
        xp = array_module(out)
        fast = torch_views(data.view(xp.float16), out)
        if fast is not None:
            fast[1].copy_(fast[0])
            return
        if xp is np:
            decode_fp16(data.view(np.uint16), out)
            return
        xp.copyto(out, data.view(xp.float16))

    def error_bound(self, x: Any) -> Any:
        xp = array_module(x)
        return xp.maximum(xp.abs(x) * 2.0 ** -11, 2.0 ** -25).astype(xp.float32)
