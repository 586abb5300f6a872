"""See into a running job: ``gossip status`` (job_status.py: ask every member's door; waits.py:
who waits on whom and the straggler; render.py: the text) and what a member answers
(reporter.py)."""
from gossip.status.job_status import JobStatus, door_address, job_status
from gossip.status.waits import WaitGraph, straggler, waits_for

__all__ = ["JobStatus", "job_status", "door_address", "WaitGraph", "waits_for", "straggler"]
