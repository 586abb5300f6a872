"""The communicator's compressed allreduce: ``allreduce(..., compression=)`` lands here
(algorithms/compressed.py has the schemes and their error bounds; the neighbour exchange with
a codec is neighbor_allreduce.py's). Local checks run before a sequence number is taken, as
for every call; the codec is part of the signature and of the header's dtype, so peers
that pass different codecs (or one none) get a ProtocolError, and a receiver refuses a
payload whose codec or size does not fit its header (transport/wire.py)."""
from __future__ import annotations

from typing import Any

from collectives.algorithms.compressed import (CodecStats, gather_allreduce, padded_count,
                                               ring_allreduce_compressed)
from collectives.codecs.float32 import as_float32, write_back
from collectives.codecs.codec import Codec, array_module
from collectives.codecs.catalog import wire_dtype
from collectives.engine import Engine
from collectives.staging import flat_of

__all__ = ["compressed_allreduce", "compressed_input", "check_residual"]


def check_residual(residual: Any, x32: Any) -> None:
    """An error-feedback buffer must be a float32 array of x's module and size."""
    if residual is None:
        return
    if array_module(residual) is not array_module(x32) or residual.dtype != x32.dtype or \
            residual.size != x32.size:
        raise ValueError(f"residual must be a float32 array of {x32.size} elements of the "
                         "array's own module (numpy for numpy and torch CPU arrays)")


def compressed_input(x: Any, op: str, codec: Codec, residual: Any) -> tuple[Any, Any, str, Any]:
    """``x``'s adapter, flat view and dtype, and the float32 array the codec encodes (x's own
    memory when it is float32), once the call is checked: op sum or mean, a residual only for
    a codec that is not dense (top-k), a float32 array of x's module and size."""
    adapter, flat, dtype = flat_of(x)
    if op not in ("sum", "mean"):
        raise ValueError(f"allreduce with compression sums: op must be 'sum' or 'mean', "
                         f"not {op!r}")
    x32 = as_float32(adapter, flat, dtype)
    if residual is not None and codec.dense:
        raise ValueError(f"error feedback (residual=) is for top-k; {codec.name} is summed "
                         "on the ring, re-encoded at every hop")
    check_residual(residual, x32)
    return adapter, flat, dtype, x32


def compressed_allreduce(engine: Engine, x: Any, op: str, codec: Codec, *, wait: bool,
                         timeout: float | None, stats: CodecStats, residual: Any = None,
                         small_bytes: int = 0, layout: str = "") -> Any:
    """Communicator.allreduce with ``codec`` (ops sum and mean; floating-point arrays). Arrays
    of at most ``small_bytes`` (as float32) gather every encoding straight from its owner, in
    one latency, whatever the codec; larger ones take the ring on encodings (dense codecs) or
    gather around the ring (top-k). ``stats`` counts what was encoded. ``layout``: a list's
    sizes as coalesced.py packed them, part of the call's signature."""
    adapter, flat, _, x32 = compressed_input(x, op, codec, residual)
    n, count = engine.world_size, x32.size
    seq = engine.next_seq()
    signature = f"allreduce({op},{codec.name}{layout})"
    small = count * 4 <= small_bytes   # the same on every peer: x's size is in the signature
    if codec.dense and not small:   # the ring on encodings (algorithms/compressed.py)
        shape = (n, padded_count(count, n))

        def run(call: Any) -> Any:
            return ring_allreduce_compressed(call, codec, x32, op, stats)
    else:             # one encoding per peer, gathered (straight from each, if small)
        shape = (n, count)

        def run(call: Any) -> Any:
            return gather_allreduce(call, codec, x32, op, stats, residual,
                                    direct=small)

    def body() -> Any:
        # x32 may be x's own memory (float32): the encoding happens inside, before any
        # result is written, so the caller must not touch x until then (as any collective).
        engine.execute(seq, signature, wire_dtype(codec), shape, timeout, engine.peers, run)
        write_back(adapter, flat, x32)
        adapter.synchronize()
        return x
    return engine.launch(f"{signature} seq {seq}", body, wait)
