"""``gossip status``'s client: ask a running job how it is, from any machine that reaches
its doors, with the job's key where it has one.

It asks the door at the address given (the rendezvous address: the member that holds it
answers there, whoever died since the start) for its status and the view's members, then
asks every other member's door at once (their answers come in parallel, each with its own
deadline), and merges them: who waits on whom (waits.py) and who the straggler is. Nothing
here joins the job or takes part in its collectives: a status request is answered by a
member's door thread, beside its training loop.
"""
from __future__ import annotations

import os
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from collectives.config import TransportConfig
from collectives.group.door import request
from collectives.security import ClusterKey, load_cluster_key
from gossip.status.waits import WaitGraph, straggler, waits_for

__all__ = ["JobStatus", "job_status", "door_address"]


@dataclass
class JobStatus:
    """What a job said: each member's answer (rank -> dict; None: it did not answer, with
    ``errors[rank]`` saying why), the waits-for graph, the straggler, and when and how long
    it took."""
    address: str
    members: dict[int, dict[str, Any] | None]
    view: int | None
    waits: WaitGraph
    straggler: dict[str, Any] | None
    seconds: float
    time: float = field(default_factory=time.time)
    errors: dict[int, str] = field(default_factory=dict)

    def as_dict(self) -> dict[str, Any]:
        """Plain data (``gossip status --json``)."""
        return {"address": self.address, "view": self.view, "time": self.time,
                "seconds": self.seconds,
                "members": {str(r): m for r, m in sorted(self.members.items())},
                "errors": {str(r): e for r, e in self.errors.items()},
                "waits": self.waits.as_dict(), "straggler": self.straggler}


def door_address(address: str) -> str:
    """``host:port`` or ``tcp://host:port`` as a door address (``tcp://host:port``)."""
    address = address.strip()
    if "://" not in address:
        address = f"tcp://{address}"
    if not address.startswith("tcp://") or ":" not in address[len("tcp://"):]:
        raise ValueError(f"gossip status: {address!r} is not an address of the form "
                         f"host:port (the rendezvous address `gossip run` prints)")
    return address


def job_status(address: str, *, job_id: str | None = None,
               key: str | os.PathLike | ClusterKey | None = None, timeout: float = 2.0,
               stacks: bool = False, last: int = 32) -> JobStatus:
    """Ask the job whose door is at ``address`` (its rendezvous address) how it is.
    ``job_id`` (default GOSSIP_JOB_ID) and ``key`` (a key file; default GOSSIP_KEY) must be
    the job's; ``stacks`` adds each member's thread stacks; ``last`` its last calls.
    Raises TimeoutError when the first door does not answer within ``timeout`` seconds and
    RuntimeError when it refuses (another job: the refusal names the job it belongs to)."""
    started = time.monotonic()
    address = door_address(address)
    if job_id is None:
        job_id = os.environ.get("GOSSIP_JOB_ID", "")
    if key is None and os.environ.get("GOSSIP_KEY"):
        key = os.environ["GOSSIP_KEY"]
    if key is not None and not isinstance(key, ClusterKey):
        key = load_cluster_key(key)
    config = TransportConfig(key=key, job_id=job_id)
    fields = {"stacks": bool(stacks), "last": int(last)}
    first = request(config, address, "status", timeout, members=True, **fields)
    _refused(first, address)
    members: dict[int, dict[str, Any] | None] = {}
    errors: dict[int, str] = {}
    listed = first.pop("members", None) or []
    members[int(first["rank"])] = first
    others = [(int(m["rank"]), str(m["door"])) for m in listed
              if int(m["rank"]) != int(first["rank"])]

    def ask(door: str) -> dict[str, Any]:
        return request(config, door, "status", timeout, **fields)

    with ThreadPoolExecutor(max_workers=max(1, min(32, len(others)))) as pool:
        futures = {rank: pool.submit(ask, door) for rank, door in others}
        for rank, future in futures.items():
            try:
                answer = future.result()
                _refused(answer, dict(others)[rank])
                members[rank] = answer
            except (TimeoutError, RuntimeError) as exc:
                members[rank] = None
                errors[rank] = str(exc)
    graph = waits_for(members)
    return JobStatus(address=address, members=members, view=first.get("view"),
                     waits=graph, straggler=straggler(members, graph),
                     seconds=time.monotonic() - started, errors=errors)


def _refused(answer: dict[str, Any], address: str) -> None:
    if "refused" in answer:
        raise RuntimeError(f"the door at {address} refused: {answer['refused']} (set "
                           f"GOSSIP_JOB_ID or --job to the job's id)")
    if "error" in answer:
        raise RuntimeError(f"the door at {address} failed to answer: {answer['error']}")
