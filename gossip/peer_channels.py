"""The registry of ``peer.channel(number)`` numbers: which independent communicator each part
of gossip uses.

A policy whose threads communicate beside the training loop (or beside each other) needs its
own sequence numbers, so its messages never meet the main thread's in one mailbox: it takes a
communicator of its own through ``peer.channel(number)``, and every peer must use the same
number for the same purpose. Number 0 is the peer's own communicator (``peer.allreduce`` and
the other collectives). On the wire, communicator ``number`` uses the channel pair
``collectives.transport.channel_pair(number)``.

Two policies that run at once in one group need different numbers: the policies take
``channel=`` for that, defaulting to the numbers below.
"""
from __future__ import annotations

import enum

__all__ = ["PeerChannel"]


class PeerChannel(enum.IntEnum):
    #: The peer's own communicator: the collectives of Peer, the blocking policies.
    PEER = 0
    #: Asynchronous: pushes, or pairwise exchanges' requests, from the sending thread to the
    #: receiving threads (this number), quiesce()'s counts of them (the next one: a count must
    #: never be taken for a push, nor meet a send of the user's own on the peer's
    #: communicator), and the answers to requests (the one after: the requester's sending
    #: thread waits for them while its receiving thread answers others).
    ASYNCHRONOUS = 1
    ASYNCHRONOUS_COUNTS = 2
    ASYNCHRONOUS_ANSWERS = 3
    #: ElasticAveraging: requests to the centre's owners (this number) and their replies
    #: (the next one).
    ELASTIC_REQUESTS = 4
    ELASTIC_REPLIES = 5
    #: ElasticAveraging (sharded, elastic=True): each owner's centre updates, forwarded to
    #: the backup of its shard (requests + 3: the next free number).
    ELASTIC_BACKUPS = 7
    #: Healing: proposals of new edges around a lost neighbour (Gossip, PushSum).
    HEALING = 6
    #: Membership: a member's state sent to the members that take it after a view change
    #: (gossip/membership/state_transfer.py).
    MEMBERSHIP = 8
    #: Membership: a planned leaver's push-sum mass, handed to a member on the view's
    #: transport it leaves (gossip/policies/push_sum/push_sum.py, and the sharded EASGD
    #: centre's shards: gossip/policies/easgd/easgd.py).
    HANDOFF = 9
