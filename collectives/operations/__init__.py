"""The calls of a communicator that have a module of their own: each checks its arguments,
takes a sequence number and runs its data movement (an algorithm of collectives/algorithms/)
through the communicator's Engine (collectives/engine.py), never through the Communicator's
private state. ``neighbor_allreduce`` is the neighbour exchange of a NeighborPlan (copied,
read directly on one host, or as encodings); ``neighbor_allgather`` its gathering twin;
``allgatherv`` the allgather of parts of any size; ``rooted`` reduce, gather, scatter
and all-to-all; ``scan`` the prefix reductions
(MPI_Scan, MPI_Exscan); ``coalesced`` a list of arrays in one
allreduce; ``compressed_allreduce`` the allreduce with a codec; ``send_recv`` the
point-to-point messages of the communicator's second channel.

(The neighbour modules and ``scan`` are imported by name: their functions share the modules'
names.)"""
from collectives.operations.coalesced import coalesced_allreduce
from collectives.operations.compressed_allreduce import check_residual, compressed_allreduce
from collectives.operations.rooted import alltoall, gather, reduce, scatter
from collectives.operations.send_recv import PointToPoint, SendRequest

__all__ = ["PointToPoint", "SendRequest", "coalesced_allreduce", "compressed_allreduce",
           "check_residual", "reduce", "gather", "scatter", "alltoall"]
