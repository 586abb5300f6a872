"""Collective algorithms, written with the point-to-point primitives of ``p2p`` (post a range of
an array to a peer, receive one, wait for the send): ring allreduce and reduce-scatter,
recursive doubling for small arrays, allgather, pipelined broadcast, dissemination barrier,
neighbour exchange, and NCCL for device arrays. Callers import the module of the algorithm they
use; nothing is re-exported here (NCCL must stay a lazy import)."""

__all__: list[str] = []
