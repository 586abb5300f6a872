"""Collective algorithms, written with the two point-to-point primitives of ``p2p`` (post a range
of an array to a peer, receive one): ring allreduce and reduce-scatter, recursive doubling for
small arrays, allgather, pipelined broadcast, dissemination barrier, neighbour exchange, and NCCL
for device arrays."""
