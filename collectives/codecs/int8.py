"""int8 blockwise: each block of BLOCK elements is sent as one float32 scale (its absolute
maximum / 127) and BLOCK int8 values round(x / scale); decoding multiplies back in float32.

Layout of ``count`` elements: ceil(count / BLOCK) float32 scales, then ``count`` int8 values
(the last block may be short): 1 + 4 / BLOCK bytes per element, 3.94x less than float32.

A block that holds a NaN or an infinity keeps them to their own elements: its scale is sent
negated (its finite elements' absolute maximum / 126, or 1 when they are all zero), its
finite elements round into [-126, 126], and the three values no finite element takes mark
NaN (-128), +inf (127) and -inf (-127). Every other block's bytes are as above.
"""
from __future__ import annotations

import contextlib
from typing import Any, Callable

import numpy as np

from collectives.arrays.interface import Array
from collectives.codecs.codec import WORK_ELEMENTS, Codec, array_module
from collectives.codecs.fast import torch_views

__all__ = ["Int8Block", "BLOCK"]

BLOCK = 256
"""Elements per scale. 256 keeps the scales at 1.6% of the payload while a block is small enough
that one large value costs the precision of only 255 neighbours (bitsandbytes' blockwise
quantisation uses 64..4096; 256 is its usual setting for optimizer state)."""
# Elements per slice on numpy's path: a slice's input, scratch and int8 output stay in L2
# (best of 9 here, % of memcpy: 64 Ki elements 31-32, 128 Ki 33-34, 256 Ki 35-37; smaller
# slices pay Python's cost per pass more often).
NUMPY_WORK = 128 * 1024
# Elements per slice on torch's path: its calls cost ~10 us each, so slices are larger than
# numpy's (measured, 64 MiB: 4 GB/s at 64 Ki elements, 15 at 1 Mi, 11 at 4 Mi).
TORCH_WORK = 1 << 20


#: The int8 values of a block with non-finite elements (its scale negated) that stand for them.
NAN_MARK, POS_INF_MARK, NEG_INF_MARK = -128, 127, -127
_FINITE_STEPS = 126.0   # such a block's finite elements round into [-126, 126]


def _quiet(xp: Any):
    # Non-finite input gives a non-finite scale, which encode() then mends block by block
    # (_confine); numpy's "invalid value in cast" warning on the way says nothing new.
    return np.errstate(invalid="ignore", divide="ignore") if xp is np else \
        contextlib.nullcontext()


class Int8Block(Codec):
    """Blockwise absmax int8. Error: |e| <= absmax(block) / 254 per element (half a step of
    the block's scale), so relative to the block's largest value, not to the element."""

    family = "int8"

    @property
    def name(self) -> str:
        return "int8"

    def encoded_nbytes(self, count: int) -> int:
        return 4 * (-(-count // BLOCK)) + count

    def _split(self, data: Any, count: int) -> tuple[Any, Any]:
        xp = array_module(data)
        blocks = -(-count // BLOCK)
        return data[:4 * blocks].view(xp.float32), data[4 * blocks:].view(xp.int8)

    def encode(self, x: Any, out: Any) -> None:
        xp = array_module(x)
        count = x.size
        scales, q = self._split(out, count)
        given = (x, scales, q)   # (the torch path below names torch views of them alike)
        full = count // BLOCK * BLOCK
        fast = torch_views(x, scales, q)
        step = WORK_ELEMENTS if fast is None else TORCH_WORK
        blocks: Callable[[Any, Array, int, Array, Array, Array], None] = self._encode_blocks
        if fast is None and xp is np:
            step, blocks = NUMPY_WORK, self._numpy_blocks
        work = xp.empty(min(step, max(count, 1)), dtype=xp.float32)
        if fast is not None:
            import torch  # already imported: torch_views found it
            (x, scales, q), work = fast, torch.from_numpy(work)
            blocks = self._torch_blocks
        with _quiet(xp):
            for lo in range(0, full, step):
                hi = min(lo + step, full)
                blocks(xp, x[lo:hi], BLOCK, scales[lo // BLOCK:hi // BLOCK], q[lo:hi],
                       work[:hi - lo])
            if full < count:
                tail = count - full
                blocks(xp, x[full:], tail, scales[-1:], q[full:], work[:tail])
        x, scales, q = given
        if count and not bool(xp.isfinite(scales).all()):   # a NaN or inf: rare
            self._confine(xp, x, scales, q)

    @staticmethod
    def _confine(xp: Any, x: Any, scales: Any, q: Any) -> None:
        """Re-encode the blocks whose scale came out non-finite (they hold a NaN or an inf)
        so that only those elements decode non-finite (the module docstring's marks)."""
        count = x.size
        with _quiet(xp):
            for b in xp.nonzero(~xp.isfinite(scales))[0].tolist():
                lo, hi = b * BLOCK, min((b + 1) * BLOCK, count)
                block = x[lo:hi].astype(xp.float32)
                finite = xp.isfinite(block)
                absmax = float(xp.abs(block[finite]).max()) if bool(finite.any()) else 0.0
                scale = xp.float32(absmax / _FINITE_STEPS if absmax > 0 else 1.0)
                values = xp.rint(xp.where(finite, block, 0) / scale)
                values = xp.clip(values, -_FINITE_STEPS, _FINITE_STEPS)
                values[xp.isnan(block)] = NAN_MARK
                values[block == xp.inf] = POS_INF_MARK
                values[block == -xp.inf] = NEG_INF_MARK
                q[lo:hi] = values.astype(xp.int8)
                scales[b] = -scale

    @staticmethod
    def _restore_marks(xp: Any, scales: Any, q: Any, out: Any) -> None:
        """decode's mend of the blocks sent with a negated scale (_confine's)."""
        count = out.size
        for b in xp.nonzero(scales < 0)[0].tolist():
            lo, hi = b * BLOCK, min((b + 1) * BLOCK, count)
            block = q[lo:hi]
            values = block.astype(xp.float32) * -scales[b]
            values[block == NAN_MARK] = xp.nan
            values[block == POS_INF_MARK] = xp.inf
            values[block == NEG_INF_MARK] = -xp.inf
            out[lo:hi] = values

    @staticmethod
    def _torch_blocks(_: Any, x: Any, width: int, scales: Any, q: Any, work: Any) -> None:
        # _encode_blocks in torch's spelling (fast.py), operation for operation, so the
        # bytes are the same: float32 throughout, rint and round both to nearest even.
        import torch
        blocks = x.view(-1, width)
        tmp = work.view(-1, width)
        torch.abs(blocks, out=tmp)
        torch.amax(tmp, dim=1, out=scales)
        scales /= 127.0
        inverse = torch.where(scales > 0, 1.0 / scales, 0.0)
        torch.mul(blocks, inverse[:, None], out=tmp)
        torch.round(tmp, out=tmp)
        q.view(-1, width).copy_(tmp)

    @classmethod
    def _numpy_blocks(cls, _: Any, x: Any, width: int, scales: Any, q: Any, work: Any) -> None:
        # _encode_blocks with numpy's faster spellings, the same float32 operations so the
        # same bytes: the absolute maximum by reduceat on the bits (a non-negative float32's
        # bits order as it does, and reduceat skips the per-row cost of max(axis=1): 0.06
        # against 0.3 ns an element here), and no where() in the common case.
        np.abs(x, out=work)
        starts = np.arange(0, x.size, width)
        np.maximum.reduceat(work.view(np.int32), starts, out=scales.view(np.int32))
        scales /= 127.0
        if not (0 < scales.min() and scales.max() < np.inf):
            # A zero, inf or NaN scale (a NaN's bits are not its order): the general spelling.
            cls._encode_blocks(np, x, width, scales, q, work)
            return
        inverse = np.divide(1.0, scales)
        np.multiply(x.reshape(-1, width), inverse[:, None], out=work.reshape(-1, width))
        np.rint(work, out=work)
        np.copyto(q, work, casting="unsafe")

    @staticmethod
    def _encode_blocks(xp: Any, x: Any, width: int, scales: Any, q: Any, work: Any) -> None:
        blocks = x.reshape(-1, width)
        tmp = work.reshape(-1, width)
        xp.abs(blocks, out=tmp)
        xp.max(tmp, axis=1, out=scales)
        scales /= 127.0
        inverse = xp.where(scales > 0, 1.0 / scales, 0.0).astype(xp.float32)
        xp.multiply(blocks, inverse[:, None], out=tmp)
        xp.rint(tmp, out=tmp)
        xp.copyto(q.reshape(-1, width), tmp, casting="unsafe")

    def decode(self, data: Any, out: Any) -> None:
        xp = array_module(out)
        count = out.size
        scales, q = self._split(data, count)
        self._decode_all(xp, scales, q, out)
        if count and bool((scales < 0).any()):   # blocks with non-finite elements: rare
            self._restore_marks(xp, scales, q, out)

    @staticmethod
    def _decode_all(xp: Any, scales: Any, q: Any, out: Any) -> None:
        count = out.size
        full = count // BLOCK * BLOCK
        fast = torch_views(q, scales, out)
        if fast is not None:
            q, scales, out = fast
            # Widen, then scale in place, by slices: torch's mixed int8 x float32 multiply
            # is 6x slower (measured).
            step = TORCH_WORK // 4
            for lo in range(0, full, step):
                hi = min(lo + step, full)
                part = out[lo:hi]
                part.copy_(q[lo:hi])
                part.view(-1, BLOCK).mul_(scales[lo // BLOCK:hi // BLOCK, None])
            if full < count:
                out[full:].copy_(q[full:])
                out[full:].mul_(scales[-1])
            return
        if full:
            xp.multiply(q[:full].reshape(-1, BLOCK), scales[:full // BLOCK, None],
                        out=out[:full].reshape(-1, BLOCK))
        if full < count:
            xp.multiply(q[full:], scales[-1], out=out[full:])

    def error_bound(self, x: Any) -> Any:
        xp = array_module(x)
        count = x.size
        padded = xp.zeros(-(-count // BLOCK) * BLOCK, dtype=xp.float32)
        padded[:count] = xp.abs(x)
        absmax = padded.reshape(-1, BLOCK).max(axis=1)
        # Half a step, plus float32's rounding of x / scale and of q * scale.
        bound = absmax / 254.0 * (1 + 2.0 ** -16) + absmax * 2.0 ** -22
        return xp.repeat(bound, BLOCK)[:count].astype(xp.float32)
