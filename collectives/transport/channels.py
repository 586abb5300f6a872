"""The channel registry: which channel numbers mean what on the wire.

A message names its operation by ``(channel, seq)``; concurrent streams of operations use
different channels so their sequence numbers never meet in one mailbox. A communicator takes a
pair: an even channel for its collectives and the next odd one for its point-to-point messages.
The peer's own communicator has the first pair; independent ones (a policy's background thread,
numbered 1, 2, ... through ``peer.channel(number)``) take the pair of their number.
"""
from __future__ import annotations

import enum

__all__ = ["Channel", "channel_pair"]


class Channel(enum.IntEnum):
    # The peer's main communicator: its collectives...
    COLLECTIVE = 0
    # ...and its point-to-point send/recv.
    P2P = 1
    # Link-level control messages (SHM_OPEN, SHM_MAPPED, STARVED, CREDIT, BYE) concern a
    # connection, not an operation: their kind says everything and they never reach a mailbox,
    # so they carry the first channel (an alias of COLLECTIVE, seq 0).
    LINK = 0


def channel_pair(number: int) -> tuple[int, int]:
    """The (collective, point-to-point) channels of communicator ``number`` (0: the peer's
    own, COLLECTIVE and P2P)."""
    return Channel.COLLECTIVE + 2 * number, Channel.P2P + 2 * number
