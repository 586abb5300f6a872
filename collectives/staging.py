"""Contiguous stand-ins for the non-contiguous arrays a call is given (a strided numpy view,
a transposed tensor, a column of a matrix), as torch.distributed's Gloo backend copies them
and mpi4py describes them with derived datatypes.

A call works on flat, contiguous memory (it is sent zero-copy and reduced in place). For a
non-contiguous array it works on a contiguous copy instead, and the arrays it writes (an
allreduce's ``x``, a gather's ``out``) take their values back from the copy when the call
completes: in the blocking call before it returns, in a non-blocking one before its Work is
done. A call that fails writes nothing back: the caller's array is left as it was, never
half reduced. The copy costs one pass over the array each way; contiguous arrays take none.

    stage = Staging()
    adapter, flat, dtype = stage.flat(x)             # x itself, or its stand-in
    ... run the call on flat ...
    stage.finish()                                   # x takes the result
"""
from __future__ import annotations

from typing import Any

from collectives.send_recv import contiguous_flat

__all__ = ["Staging"]


class Staging:
    """One call's stand-ins and what to write back when it completes."""

    __slots__ = ("_written",)

    def __init__(self) -> None:
        self._written: list[tuple[Any, Any, Any]] = []   # (adapter, array, stand-in)

    def flat(self, x: Any, *, written: bool = True) -> tuple[Any, Any, str]:
        """``x``'s adapter, flat view and dtype name, as flat_of, through a contiguous
        stand-in when ``x`` is not contiguous; ``written``: the call's result lands in
        ``x``, so it is copied back by finish() (else ``x`` is only read)."""
        stand_in, *view = contiguous_flat(x)
        if stand_in is not None and written:
            self._written.append((view[0], x, stand_in))
        return tuple(view)

    def finish(self, result: Any = None) -> Any:
        """Copy each written stand-in back into its array; returns ``result`` (so a call's
        body can end with ``return stage.finish(result)``)."""
        for adapter, x, stand_in in self._written:
            adapter.write_back(x, stand_in)
        return result

    def __bool__(self) -> bool:
        return bool(self._written)
