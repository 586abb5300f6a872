"""One push of asynchronous gossip in flight: the messages of (m, w/2), one per bucket, posted
to one peer by the training thread (posting never blocks: the transport queues), and what
became of them. Whichever thread first sees it complete settles it: the training thread at
its next step without waiting (``complete()``), or the pushing thread, which waits for it
(``see_through()``) and so is the one to meet a neighbour that does not take it."""
from __future__ import annotations

from typing import Any

from gossip.policies.base.failures import PEER_FAILURES

__all__ = ["Push"]


class Push:
    """The push to ``dst`` that includes the steps up to ``included``."""

    __slots__ = ("dst", "included", "requests", "error")

    def __init__(self, comm: Any, dst: int, included: int, messages: list,
                 timeout: float) -> None:
        self.dst, self.included = dst, included
        self.requests: list = []
        self.error: BaseException | None = None
        try:
            for message in messages:
                self.requests.append(comm.isend(dst, message, timeout=timeout))
        except PEER_FAILURES as exc:   # (lost already, or this transport closed)
            self.error = exc

    def complete(self) -> bool:
        """Every message taken (never blocks; a failure is see_through's to report)."""
        try:
            return self.error is None and all(r.test() for r in self.requests)
        except PEER_FAILURES:
            return False

    def see_through(self, delivered: list[int]) -> None:
        """Wait for each message in turn, counting in ``delivered[0]`` those taken; raise the
        failure of the first that was not (PeerLost, OperationTimeout)."""
        for request in self.requests:
            request.wait()
            delivered[0] += 1
        if self.error is not None:
            raise self.error
