"""How a wait on a mailbox can end other than with a message: its source is Lost (dead,
closed, refused), or an error was posted to the mailbox (an ABORT, a malformed message, a
chunk of another call). collectives/transport/wait_errors.py words them as exceptions."""
from __future__ import annotations

from dataclasses import dataclass

__all__ = ["Lost", "MailboxError"]


@dataclass
class Lost:
    """Why a source cannot deliver any more: it died, closed, or failed authentication.
    ``cause``: the rank whose loss made the source give up, when it closed right after an
    operation of its own failed for that loss (its goodbye says so): that rank is the one to
    blame, not the source, which was only the first to leave."""
    reason: str
    kind: str = "lost"  # "lost" | "closed" | "auth"
    cause: int | None = None


@dataclass
class MailboxError:
    """An error posted to one mailbox: a malformed message or an ABORT from the source.
    ``lost_rank`` is set when the source abandoned the operation because that rank was lost,
    so the error can travel on as PeerLost naming the dead peer."""
    message: str
    lost_rank: int | None = None
    late_rank: int | None = None  # the source timed out and found this rank missing
    local: bool = False  # this peer's own finding (a chunk of another call), not the source's
    view_change: bool = False  # the source was ended by a change of the group's view
