"""The failure rule of a gossip step: an exchange that fails because a peer died or went silent
(PeerLost, OperationTimeout) is abandoned where it stopped and the step goes on; the policy
decides what the failure costs (Policy._exchange_failed: a skipped round, or a dropped
partner). Every other error propagates. The allreduce policies do not use it: for them a
lost peer fails the step."""
from __future__ import annotations

import contextlib
from typing import Callable, Iterator

from gossip.errors import OperationTimeout, PeerLost

__all__ = ["PEER_FAILURES", "Attempt", "tolerate"]

#: What a gossip exchange survives: a peer died, or went silent past the timeout.
PEER_FAILURES = (PeerLost, OperationTimeout)


class Attempt:
    """What tolerate() yields: ``error`` is the failure that ended the exchange inside the
    block, None while it has not failed."""

    __slots__ = ("error",)

    def __init__(self) -> None:
        self.error: BaseException | None = None

    @property
    def failed(self) -> bool:
        """True if the exchange was abandoned."""
        return self.error is not None


@contextlib.contextmanager
def tolerate(on_failure: Callable[[BaseException], None]) -> Iterator[Attempt]:
    """Run the block; a PEER_FAILURES error in it is handed to ``on_failure`` and
    suppressed (the Attempt records it)."""
    attempt = Attempt()
    try:
        yield attempt
    except PEER_FAILURES as exc:
        attempt.error = exc
        on_failure(exc)
