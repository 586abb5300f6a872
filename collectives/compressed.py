"""The communicator's compressed calls: ``allreduce(..., compression=)`` and
``neighbor_allreduce(..., compression=)`` land here (algorithms/compressed.py has the
schemes and their error bounds). Local checks run before a sequence number is taken, as
for every call; the codec is part of the signature and of the header's dtype, so peers
that pass different codecs (or one none) get a ProtocolError, and a receiver refuses a
payload whose codec or size does not fit its header (transport/wire.py)."""
from __future__ import annotations

from typing import Any

from collectives.algorithms.compressed import (compressed_exchange, gather_allreduce,
                                               padded_count, ring_allreduce_compressed)
from collectives.algorithms.neighbor import UNCHECKED, check_pattern_arguments
from collectives.codecs.arrays import as_float32, write_back
from collectives.codecs.base import array_module
from collectives.codecs.registry import parse, wire_dtype

__all__ = ["compressed_allreduce", "compressed_neighbor_allreduce", "check_residual"]


def check_residual(residual: Any, x32: Any) -> None:
    """An error-feedback buffer must be a float32 array of x's module and size."""
    if residual is None:
        return
    if array_module(residual) is not array_module(x32) or residual.dtype != x32.dtype or \
            residual.size != x32.size:
        raise ValueError(f"residual must be a float32 array of {x32.size} elements of the "
                         "array's own module (numpy for numpy and torch CPU arrays)")


def compressed_allreduce(comm: Any, x: Any, op: str, compression: Any, *, wait: bool,
                         timeout: float | None, residual: Any = None,
                         small_bytes: int = 0) -> Any:
    """Communicator.allreduce with a codec (ops sum and mean; floating-point arrays). Arrays
    of at most ``small_bytes`` (as float32) gather every encoding straight from its owner, in
    one latency, whatever the codec; larger ones take the ring on encodings (dense codecs) or
    gather around the ring (top-k)."""
    codec = parse(compression)
    adapter, flat, dtype = comm._flat(x)
    if op not in ("sum", "mean"):
        raise ValueError(f"allreduce with compression sums: op must be 'sum' or 'mean', "
                         f"not {op!r}")
    x32 = as_float32(adapter, flat, dtype)
    if residual is not None and codec.dense:
        raise ValueError(f"error feedback (residual=) is for top-k; {codec.name} is summed "
                         "on the ring, re-encoded at every hop")
    check_residual(residual, x32)
    n, count = comm.world_size, x32.size
    seq = comm._next_seq()
    signature = f"allreduce({op},{codec.name})"
    small = count * 4 <= small_bytes   # the same on every peer: x's size is in the signature
    if codec.dense and not small:   # the ring on encodings (algorithms/compressed.py)
        shape = (n, padded_count(count, n))

        def run(call: Any) -> Any:
            return ring_allreduce_compressed(call, codec, x32, op, comm.codec_stats)
    else:             # one encoding per peer, gathered (straight from each, if small)
        shape = (n, count)

        def run(call: Any) -> Any:
            return gather_allreduce(call, codec, x32, op, comm.codec_stats, residual,
                                    direct=small)

    def body() -> Any:
        # x32 may be x's own memory (float32): the encoding happens inside, before any
        # result is written, so the caller must not touch x until then (as any collective).
        comm._execute(seq, signature, wire_dtype(codec), shape, timeout, comm._all_peers(),
                      run)
        write_back(adapter, flat, x32)
        adapter.synchronize()
        return x
    return comm._launch(f"{signature} seq {seq}", body, wait)


def compressed_neighbor_allreduce(comm: Any, x: Any, self_weight: float,
                                  src_weights: dict[int, float], dst_ranks, compression: Any,
                                  *, dst_weights: Any, out: Any, wait: bool,
                                  timeout: float | None, partial: bool,
                                  check_pattern: bool) -> Any:
    """Communicator.neighbor_allreduce with a codec: ``x <- w_self D(E(x)) + sum_j w_j
    D(E(x_j))`` (into ``out`` if given: then ``x`` is left holding D(E(x)), the value its
    neighbours received), summed in float32 (float64 for float64 arrays). No ``dst_weights`` (push-sum's per-destination scaling) and no
    ``partial`` rounds with a codec."""
    codec = parse(compression)
    if dst_weights is not None or partial:
        raise ValueError("neighbor_allreduce with compression takes neither dst_weights nor "
                         "partial=True")
    adapter, flat, dtype = comm._flat(x)
    src_weights, dst_ranks = check_pattern_arguments(comm.rank, comm.world_size, dtype,
                                                     src_weights, dst_ranks, None)
    out_flat = None
    if out is not None and out is not x:
        out_flat = comm._out_like(adapter, dtype, adapter.size(flat), out,
                                  "neighbor_allreduce", "like x")
    x32 = as_float32(adapter, flat, dtype)
    accumulate = "float64" if dtype == "float64" else "float32"   # the sum, not the wire
    seq = comm._next_seq()
    peers = sorted(set(dst_ranks) | set(src_weights))
    signature = f"neighbor_allreduce({codec.name})" + ("" if check_pattern else UNCHECKED)

    def body() -> Any:
        result = comm._execute(
            seq, signature, wire_dtype(codec), (x32.size,), timeout, peers,
            lambda call: compressed_exchange(call, codec, x32, float(self_weight),
                                             src_weights, dst_ranks, comm.codec_stats,
                                             accumulate),
            neighbours=True)
        if out_flat is not None:
            write_back(adapter, flat, x32)       # x: what the neighbours received of it
            write_back(adapter, out_flat, result)
        else:
            write_back(adapter, flat, result)
        adapter.synchronize()
        return x if out_flat is None else out
    return comm._launch(f"neighbor_allreduce({codec.name}) seq {seq}", body, wait)
