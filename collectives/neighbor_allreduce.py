"""The communicator's neighbour exchange (D-PSGD's and push-sum's round): only the peers a
call names take part, its pattern checked before the data is combined. A mixin of Communicator;
the plumbing it calls (_flat, _out_like, _next_seq, _execute, _take_buffers, _launch,
_seq_lock, _buffer_pool) is Communicator's."""
from __future__ import annotations

import time
from typing import Any

from collectives.algorithms.choice import neighbors_read_directly
from collectives.algorithms.neighbor import (UNCHECKED, check_pattern_arguments, incomplete,
                                            neighbor_exchange)
from collectives.algorithms.neighbor_direct import DIRECT_SIGNATURE, direct_exchange
from collectives.compressed import compressed_neighbor_allreduce
from collectives.staging import Staging
from collectives.transport import cma
from collectives.transport.wire import dtype_itemsize

__all__ = ["NeighborAllreduce"]


class NeighborAllreduce:
    """Communicator.neighbor_allreduce."""

    def neighbor_allreduce(self, x: Any, self_weight: float, src_weights: dict[int, float],
                           dst_ranks, *, dst_weights: dict[int, float] | None = None,
                           scratch: Any = None, out: Any = None, wait: bool = True,
                           timeout: float | None = None, partial: bool = False,
                           check_pattern: bool = True, compression: Any = None) -> Any:
        """x <- self_weight * x + sum_j src_weights[j] * x_j, sending x to ``dst_ranks``
        (each scaled by ``dst_weights[dst]`` if given). In place; returns x. With ``out`` (an
        array of x's size and dtype) the result goes there instead, x is only sent and stays
        as it was, and out is returned.

        Only the peers named take part, so a pattern may be directed or change every round;
        peers must agree on it (j in my src_weights iff I am in j's dst_ranks). With
        ``check_pattern`` (the default) that is checked before the data is combined: a pattern
        that does not pair is a ValueError on the peers involved, naming both ranks, instead of
        a wait for the timeout (algorithms/pattern.py). The plan rides in the data's header, so
        on a ring it costs nothing measurable; on a directed pattern a peer also waits for its
        destinations to begin, and peers it only hears from get one tiny message more.
        ``check_pattern=False`` skips the check; every peer of the exchange must pass the same
        value (a peer that checks meets a call of another signature: ProtocolError).

        ``partial=True``: a peer lost (or silent past the timeout) during the round is left
        out instead of failing it: the round completes over the others (with
        ``dst_weights``, a missing destination's share stays in ``self_weight``), nothing is
        aborted, and ExchangeIncomplete (a PeerLost) is raised afterwards naming the missing
        ranks, with the result in place (see algorithms/neighbor.py).

        ``compression``: the encodings travel instead (compressed.py; no dst_weights, partial).
        """
        if compression is not None:
            return compressed_neighbor_allreduce(
                self, x, self_weight, src_weights, dst_ranks, compression,
                dst_weights=dst_weights, out=out, wait=wait, timeout=timeout,
                partial=partial, check_pattern=check_pattern)
        stage = Staging()
        adapter, flat, dtype = stage.flat(x, written=out is None or out is x)
        src_weights, dst_ranks = check_pattern_arguments(self.rank, self.world_size, dtype,
                                                         src_weights, dst_ranks, dst_weights)
        out_flat = None
        if out is x:
            out = None   # in place, as without out (a separate out must not overlap x)
        if out is not None:
            out_flat = self._out_like(adapter, dtype, adapter.size(flat), out,
                                      "neighbor_allreduce", "like x", stage)
        elif scratch is None:
            scratch = adapter.empty(adapter.size(flat), dtype, flat)
        if scratch is not None:
            scratch = self._out_like(adapter, dtype, adapter.size(flat), scratch,
                                     "neighbor_allreduce", "scratch like x")
        seq = self._next_seq()
        peers = sorted(set(dst_ranks) | set(src_weights))
        nbytes = adapter.size(flat) * dtype_itemsize(dtype)

        def body() -> Any:
            # On one host, large arrays are read from the sources' memory instead of copied
            # (neighbor_direct.py); never for a partial round.
            deadline = time.monotonic() + (self.timeout if timeout is None else timeout)
            direct = not partial and neighbors_read_directly(
                self._on_host, seq, deadline, self.transport, peers, adapter, dtype, nbytes)
            signature = ("neighbor_allreduce" + (DIRECT_SIGNATURE if direct else "")
                         + ("" if check_pattern else UNCHECKED))
            # Push-sum scales a copy per destination every round: those buffers come from a
            # pool (an operation running concurrently gets its own), so rounds allocate none.
            key = (adapter.kind, dtype, adapter.size(flat), len(dst_ranks))
            pooled = dst_weights is not None and not direct
            buffers = self._take_buffers(key, adapter, flat) if pooled else None

            def exchange(call):
                if direct:
                    return direct_exchange(call, adapter, flat, float(self_weight), src_weights,
                                           dst_ranks, dst_weights, scratch, cma.Reader(),
                                           out_flat, check_pattern)
                return neighbor_exchange(call, adapter, flat, float(self_weight), src_weights,
                                         dst_ranks, dst_weights, scratch, buffers, out_flat,
                                         partial)
            try:
                missing = self._execute(seq, signature, dtype, tuple(x.shape), timeout, peers,
                                        exchange, neighbours=True)
            finally:
                if buffers is not None:
                    with self._seq_lock:
                        self._buffer_pool.setdefault(key, []).append(buffers)
            adapter.synchronize()
            if missing:
                # Raised after _execute: the round completed, so no peer is told to abort;
                # the result is in place, a non-contiguous x's too.
                stage.finish()
                raise incomplete(self.rank, seq, missing, dst_ranks)
            return x if out is None else out
        return self._launch(f"neighbor_allreduce seq {seq}", body, wait, stage)
