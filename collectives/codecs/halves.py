"""float32 <-> IEEE half on numpy arrays by integer and float32 arithmetic, blockwise.

numpy's own float16 cast converts one element at a time (about 2 GB/s here, an eighth of a
memcpy), so a numpy-only peer runs these instead: a dozen vectorised passes over a block
that stays in L2, the same bytes as ``x.astype(np.float16)`` and ``h.astype(np.float32)``
for every input (tests/test_codecs.py compares them on all halves and on float32 ranges,
subnormals, ties, overflow, inf and NaN payloads included). Only for numpy arrays: cupy's
cast is vectorised already, and torch's when it is imported (fast.py).

Encoding, for |x| < 2^16 (larger, inf and NaN: numpy's cast, on those elements only): the
float32 sum S = x + sign(x) * 2^(E + 13), E = max(exponent of x, -14), is x rounded, by the
FPU, to nearest even on the grid of halves near x (2^(E - 10): 11 significant bits, or the
fixed 2^-24 of subnormal halves), and S's low mantissa bits hold the rounded significand.
The half is then the low 16 bits of S + (S >> 13) once constants in the bias's mantissa put
the exponent's offset and the sign there (see _bias). Decoding widens with the sign, moves
exponent and mantissa to float32's places and multiplies by 2^112 (exact: half subnormals
arrive as float32 subnormals and leave normalised); exponent 31 (inf, NaN) by numpy's cast.

These rely on float32 subnormals being honoured (no flush-to-zero), numpy's default; a
process that sets FTZ/DAZ has imported torch or similar, and then fast.py's path runs.
"""
from __future__ import annotations

import numpy as np

__all__ = ["encode_fp16", "decode_fp16", "HALF_WORK"]

#: Elements per block: one block's input, scratch and output stay in a 1 MiB L2 (encoding,
#: best of 9 here, % of memcpy: 32 Ki 21-22, 48 Ki 22, 64 Ki 23, 96-128 Ki 22-23, 256 Ki 21;
#: larger blocks spill, smaller ones pay Python's cost per pass more often).
HALF_WORK = 64 * 1024

_EXPONENT = 0x7F800000
_FLOOR = 113 << 23    # 2^-14, the smallest normal half: below it, one grid of 2^-24
_LARGE = 143 << 23    # 2^16: from here on (inf and NaN too) the elements take numpy's cast


def _bias() -> tuple[int, int]:
    # S's bits are sign << 31 | X << 23 | c + m, where X = E + 140 is S's exponent field,
    # m the rounded significand (< 2^12) and c the bias's own mantissa. The half we want is
    # sign << 15 | (E + 14) << 10 + m, and the low 16 bits of S + (S >> 13) are
    # c + m + X << 10 + (c + m) >> 13. With c = 2048 (c + m < 8192) that is
    # m + (E + 142) << 10 = m + (E + 14) << 10 mod 2^16; for a negative x the sign is added
    # as 32764 more in c (32768, less the 4 it then carries into (c + m) >> 13).
    positive = (13 << 23) + 2048
    negative = (1 << 31) + 32764   # added on top of positive when x < 0
    return positive, negative - (1 << 32)   # the second as an int32 mask


_BIAS, _NEGATIVE = _bias()


def encode_fp16(x: np.ndarray, out: np.ndarray, work: int = HALF_WORK) -> None:
    """out (uint16, x.size) = the bits of x.astype(np.float16), x flat float32."""
    count = x.size
    if count == 0:
        return
    step = min(work, count)
    full = count - count % step
    bias = np.empty(step, dtype=np.uint32)
    spare = np.empty(step, dtype=np.uint32)
    floor = np.full(step, _FLOOR, dtype=np.uint32)   # np.maximum with an array: its SIMD loop
    with np.errstate(over="ignore", invalid="ignore"):   # large blocks: numpy's cast decides
        for lo in range(0, full, step):
            _encode_block(x[lo:lo + step], out[lo:lo + step], bias, spare, floor)
        if full < count:
            tail = count - full
            _encode_block(x[full:], out[full:], bias[:tail], spare[:tail], floor[:tail])


def _encode_block(x: np.ndarray, out: np.ndarray, b: np.ndarray, t: np.ndarray,
                  floor: np.ndarray) -> None:
    u, i, ti = x.view(np.uint32), x.view(np.int32), t.view(np.int32)
    np.bitwise_and(u, _EXPONENT, b)
    large = np.maximum.reduce(b) >= _LARGE
    np.maximum(b, floor, out=b)
    # sign(x) 2^(E + 13) with the constants of _bias in its mantissa.
    np.right_shift(i, 31, ti)
    np.bitwise_and(ti, _NEGATIVE, ti)
    np.add(b, t, b)
    np.add(b, _BIAS, b)
    s = b.view(np.float32)
    np.add(s, x, s)   # the one rounding, to nearest even
    np.right_shift(b, 13, t)
    np.add(t, b, t)
    np.copyto(out, t, casting="unsafe")   # the low 16 bits
    if large:
        wide = np.bitwise_and(u, _EXPONENT) >= _LARGE
        out[wide] = x[wide].astype(np.float16).view(np.uint16)


def decode_fp16(data: np.ndarray, out: np.ndarray, work: int = HALF_WORK) -> None:
    """out (float32, data.size) = data (uint16 bits of halves) .view(np.float16) as float32."""
    count = out.size
    signed, wide = data.view(np.int16), out.view(np.int32)
    for lo in range(0, count, work):
        hi = min(lo + work, count)
        w, f = wide[lo:hi], out[lo:hi]
        np.copyto(w, signed[lo:hi])   # widened with the sign: bits 15..31 hold it
        np.left_shift(w, 13, out=w)   # exponent and mantissa to float32's places
        np.bitwise_and(w, np.int32(-0x70000001), out=w)   # 0x8FFFFFFF: the sign at 31 only
        np.multiply(f, np.float32(2.0 ** 112), out=f)   # exponent bias 15 -> 127, exact
        # Exponent 31 came out as |f| in [2^16, 2^17), or NaN: numpy's cast for those.
        if not (np.maximum.reduce(f) < 65536.0 and np.minimum.reduce(f) > -65536.0):
            h = data[lo:hi]
            special = np.bitwise_and(h, 0x7C00) == 0x7C00
            f[special] = h[special].view(np.float16).astype(np.float32)
