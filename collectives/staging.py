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

``flat_of`` and ``contiguous_flat`` are the two ways every call sees an array: flat as it is,
or flat through a stand-in.
"""
from __future__ import annotations

from typing import Any

import numpy as np

from collectives.arrays.adapter import ArrayAdapter, adapter_for
from collectives.arrays.interface import Array
from collectives.errors import UnsupportedDtype
from collectives.transport.wire import ALLOWED_DTYPES

__all__ = ["Staging", "flat_of", "contiguous_flat"]


def flat_of(x: Array, *, read_only: bool = False) -> tuple[ArrayAdapter, Array, str]:
    """An array's adapter, its flat view and its dtype's wire name. ``read_only``: the caller
    only reads it (a send), so a read-only numpy array (a snapshot's zero-copy bytes) will do;
    collectives refuse one, since they write their result in place. UnsupportedDtype (a
    GossipError and a TypeError, listing the allowed dtypes) for a dtype the wire does not
    carry: every call sees its arrays here, before it takes a sequence number."""
    adapter = adapter_for(x)
    if read_only and isinstance(x, np.ndarray) and not x.flags.writeable \
            and x.flags.c_contiguous:
        flat = x.reshape(-1)
    else:
        flat = adapter.flat(x)
    return _on_the_wire(adapter, flat)


def _on_the_wire(adapter: ArrayAdapter, flat: Array) -> tuple[ArrayAdapter, Array, str]:
    """(adapter, flat, its dtype's wire name); UnsupportedDtype if the wire does not carry it."""
    dtype = adapter.dtype_name(flat)
    if dtype not in ALLOWED_DTYPES:
        raise UnsupportedDtype(dtype, list(ALLOWED_DTYPES))
    return adapter, flat, dtype


def contiguous_flat(x: Array, *, read_only: bool = False
                    ) -> tuple[Array | None, ArrayAdapter, Array, str]:
    """(stand-in, adapter, flat view, dtype name): flat_of ``x`` itself (stand-in None), or of
    a contiguous copy of it when it is not contiguous, which the caller writes back into
    ``x`` if the call writes (Staging does) and keeps alive while it is read."""
    if type(x) is np.ndarray:   # (every call's array comes here: numpy's checked at once)
        flags = x.flags
        if flags.c_contiguous and flags.writeable:
            return (None, *_on_the_wire(adapter_for(x), x.reshape(-1)))
    stand_in = adapter_for(x).stand_in(x)
    return (stand_in, *flat_of(x if stand_in is None else stand_in, read_only=read_only))


class Staging:
    """One call's stand-ins and what to write back when it completes."""

    __slots__ = ("_written",)

    def __init__(self) -> None:
        self._written: list[tuple[ArrayAdapter, Array, Array]] = []   # (adapter, x, stand-in)

    def flat(self, x: Array, *, written: bool = True) -> tuple[ArrayAdapter, Array, str]:
        """``x``'s adapter, flat view and dtype name, as flat_of, through a contiguous
        stand-in when ``x`` is not contiguous; ``written``: the call's result lands in
        ``x``, so it is copied back by finish() (else ``x`` is only read)."""
        stand_in, adapter, flat, dtype = contiguous_flat(x)
        if stand_in is not None and written:
            self._written.append((adapter, x, stand_in))
        return adapter, flat, dtype

    def finish(self, result: Any = None) -> Any:
        """Copy each written stand-in back into its array; returns ``result`` (so a call's
        body can end with ``return stage.finish(result)``)."""
        for adapter, x, stand_in in self._written:
            adapter.write_back(x, stand_in)
        return result

    def __bool__(self) -> bool:
        return bool(self._written)
