"""Starting peer processes on this machine: ``gossip run`` (launcher.py: the options, the
torchrun variables each peer gets, the job id; local_peers.py: the processes of one node,
started, watched, stopped and reaped; failure_report.py: what their output shows of a
failure) and the one local process supervisor that runs Python functions in N processes
(supervisor.py: gossip.testing.spawn, the bench and the demo start their peers through it).
``python -m gossip.run`` is the launcher's module entry point; ``gossip.init()`` and the
settings it reads from a launcher's variables are the user API (gossip/runtime.py,
gossip/settings.py)."""
from gossip.launch.failure_report import FailureReport
from gossip.launch.launcher import DEFAULT_GRACE, launch, parse_nnodes, parse_tee
from gossip.launch.local_peers import LocalPeers
from gossip.launch.supervisor import (GRACE, SKIP_CODE, PeerOutcome, after_report,
                                      first_failure, free_port, supervise)

__all__ = ["launch", "parse_nnodes", "parse_tee", "DEFAULT_GRACE", "LocalPeers",
           "FailureReport", "supervise", "PeerOutcome", "first_failure", "after_report",
           "free_port", "GRACE", "SKIP_CODE"]
