"""A harness for multi-process tests on one machine: real peer processes, real sockets on
127.0.0.1, a global deadline, and every peer's traceback when anything goes wrong.

    from gossip.testing import spawn

    def check(peer, size):
        x = np.full(size, peer.rank, dtype=np.float64)
        return peer.allreduce(x).tolist()

    results = spawn(check, n=4, timeout=60, args=(10,))   # one result per rank

The processes are gossip.launch.supervisor's (forked from multiprocessing's fork server, which has
imported numpy, pyzmq and gossip once: a peer starts in milliseconds, with the caller's
environment and directory of the moment): the first peer to fail (an exception or a non-zero
exit) stops the others, each asked to dump its threads' stacks (faulthandler), then
terminated, then killed. The SpawnError raised carries every rank's outcome, traceback and
output. A peer whose function calls pytest.skip
makes the whole spawn skip, so a skip is never mistaken for a pass.

The group is encrypted and authenticated (CURVE) as ``gossip run``'s is: each call makes a
cluster key of its own (collectives.security.JobKey, removed when the call returns) unless
given ``key=`` (a key file, which a process started beside the group needs as GOSSIP_KEY to
join it) or ``insecure=True`` (for tests of what an open group lets in). A GOSSIP_KEY in the
caller's environment (or ``env``) counts as ``key=``.
"""
from __future__ import annotations

import importlib
import logging
import os
import time
from dataclasses import dataclass, field
from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING, Any, Callable

from collectives import defaults
from collectives.errors import GossipError, RendezvousError
from collectives.security import ClusterKey, JobKey
from gossip.launch.supervisor import PeerOutcome, after_report, first_failure, free_port, supervise

if TYPE_CHECKING:
    from topologies import Topology

__all__ = ["spawn", "spawn_outcomes", "SpawnError", "SpawnTimeout", "PeerOutcome", "free_port",
           "wait_until"]

log = logging.getLogger(__name__)


def wait_until(predicate: Callable[[], Any], timeout: float, *, interval: float = 0.02,
               what: str = "the condition") -> Any:
    """Poll ``predicate`` until it returns something truthy (returned) or ``timeout`` seconds
    pass (TimeoutError naming ``what``). For conditions with no event to wait on, such as a
    file another process writes."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() >= deadline:
            raise TimeoutError(f"{what} did not happen within {timeout:g}s")
        time.sleep(interval)


class SpawnError(GossipError):
    """A spawned peer failed; ``outcomes`` holds every rank's status, traceback and output."""

    def __init__(self, message: str, outcomes: list[PeerOutcome]) -> None:
        super().__init__(message)
        self.outcomes = outcomes


class SpawnTimeout(SpawnError, TimeoutError):
    """The spawned peers did not all finish before the global deadline."""


class _PortTaken(RendezvousError):
    """(In a peer.) The job's rendezvous port was taken between free_port() and rank 0's bind."""


#: Starts of one spawn on a fresh port when its port was taken (_PortTaken) before the bind.
_PORT_ATTEMPTS = 3


@dataclass
class _Job:
    fn: Callable[..., Any]
    n: int
    port: int
    topology: Topology | str | None
    args: tuple
    kwargs: dict
    peer_timeout: float | None
    env: dict = field(default_factory=dict)
    init_kwargs: dict = field(default_factory=dict)
    preload: tuple = ()


def _peer_main(rank: int, job: _Job) -> Any:
    """One supervised child: a peer of the group on 127.0.0.1, running the user's function."""
    os.environ.update(job.env)
    # As a script's imports come before its gossip.init: a restarted peer then asks to join
    # ready to attach its policy, and the members, which wait for that at the new view's
    # barrier, are not held up by its imports.
    for module in job.preload:
        importlib.import_module(module)
    os.environ.update({"GOSSIP_RANK": str(rank), "GOSSIP_WORLD_SIZE": str(job.n),
                       "GOSSIP_LOCAL_RANK": str(rank), "LOCAL_WORLD_SIZE": str(job.n),
                       "GOSSIP_RENDEZVOUS": f"tcp://127.0.0.1:{job.port}"})
    import gossip

    try:
        peer = gossip.init(rank=rank, world_size=job.n,
                           rendezvous=f"tcp://127.0.0.1:{job.port}", topology=job.topology,
                           timeout=job.peer_timeout, **job.init_kwargs)
    except RendezvousError as exc:
        if exc.address_in_use and os.environ.get("GOSSIP_INCARNATION", "0") == "0":
            # free_port's port was free when chosen; something bound it since. No rank ran
            # the user's function yet: spawn_outcomes starts the job again on another port.
            raise _PortTaken(f"rank {rank}: port {job.port}, free when spawn chose it, was "
                             f"taken before rank 0 bound the rendezvous there") from exc
        raise
    after_report(peer.close)
    return job.fn(peer, *job.args, **job.kwargs)


def spawn(fn: Callable[..., Any], n: int = 4, *, timeout: float = defaults.TIMEOUT,
          topology: Topology | str | None = None, args: tuple = (),
          kwargs: dict[str, Any] | None = None, peer_timeout: float | None = None,
          env: dict[str, str] | None = None, tolerate: Iterable[int] = (),
          restarts: Mapping[int, int] | None = None,
          tolerated_grace: float | None = None, preload: tuple[str, ...] = (),
          key: str | os.PathLike | ClusterKey | None = None, insecure: bool = False,
          **init_kwargs) -> list[Any]:
    """Run ``fn(peer, *args, **kwargs)`` in ``n`` peer processes; return each rank's result.

    ``timeout`` is the global deadline for the whole run; ``peer_timeout`` is each peer's
    own operation timeout (default: a third of ``timeout``, so peers report PeerLost before
    the harness has to kill them). ``fn`` and its arguments must be picklable (a module-level
    function). Extra keyword arguments go to gossip.init (transport=, config=, link=).
    ``tolerate``: ranks expected to die or fail (fault-injection tests); the others go on, and
    those ranks' results are None. ``restarts`` (rank -> count) and ``tolerated_grace``: see
    gossip.launch.supervisor.supervise; a restarted rank's process calls gossip.init as the first
    did, so it rejoins the running group (gossip/membership/). ``preload``: modules each
    process imports before gossip.init (``("torch",)``).

    ``key``: the group's cluster key (a file, or a ClusterKey with its path), given to every
    peer as GOSSIP_KEY; default: GOSSIP_KEY of ``env`` or of this process, else a fresh key
    made for this call (in a private temporary folder, removed when the call returns;
    restarted ranks get the same). A process the test starts beside the group must hold the
    key to join it: write one (collectives.security.write_cluster_key) and pass it here and
    as GOSSIP_KEY to that process. ``insecure=True``: no key (the peers get
    GOSSIP_INSECURE=1), for tests of what reaches an open group.
    """
    outcomes = spawn_outcomes(fn, n, timeout=timeout, topology=topology, args=args,
                              kwargs=kwargs, peer_timeout=peer_timeout, env=env,
                              tolerate=tolerate, restarts=restarts,
                              tolerated_grace=tolerated_grace, preload=preload, key=key,
                              insecure=insecure, **init_kwargs)
    return [o.result if o.status == "ok" else None for o in outcomes]


def spawn_outcomes(fn: Callable[..., Any], n: int = 4, *, timeout: float = defaults.TIMEOUT,
                   topology: Topology | str | None = None, args: tuple = (),
                   kwargs: dict[str, Any] | None = None, peer_timeout: float | None = None,
                   env: dict[str, str] | None = None, tolerate: Iterable[int] = (),
                   restarts: Mapping[int, int] | None = None,
                   tolerated_grace: float | None = None,
                   preload: tuple[str, ...] = (),
                   key: str | os.PathLike | ClusterKey | None = None, insecure: bool = False,
                   **init_kwargs) -> list[PeerOutcome]:
    """As spawn(), but every rank's PeerOutcome (a tolerated rank's error or death, and the
    earlier starts of a restarted rank, in ``earlier``), once the verdict is a pass."""
    if n < 1:
        raise ValueError(f"n must be at least 1, got {n}")
    env = dict(env or {})
    job_key = _key_env(env, key, insecure)
    try:
        job = _Job(fn, n, free_port(), topology, tuple(args), dict(kwargs or {}),
                   peer_timeout if peer_timeout is not None else max(5.0, timeout / 3),
                   env, init_kwargs, tuple(preload))
        tolerate = frozenset(tolerate)
        for attempt in range(1, _PORT_ATTEMPTS + 1):
            outcomes = supervise(_peer_main, n, args=(job,), timeout=timeout,
                                 tolerate=tolerate, restarts=restarts,
                                 tolerated_grace=tolerated_grace)
            taken = [o for o in outcomes if o.status == "error" and _PortTaken.__name__ in o.error]
            if not taken or attempt == _PORT_ATTEMPTS:
                break
            old, job.port = job.port, free_port()
            log.warning("spawn: rendezvous port %d was taken before rank 0 bound it; starting "
                        "the %d peers again on port %d (attempt %d of %d)", old, n, job.port,
                        attempt + 1, _PORT_ATTEMPTS)
    finally:
        if job_key is not None:
            job_key.close()
    _verdict(outcomes, timeout, tolerate)
    return outcomes


def _key_env(env: dict[str, str], key: Any, insecure: bool) -> JobKey | None:
    """Put the group's key (or GOSSIP_INSECURE) into ``env``, the peers' environment; returns
    the JobKey made for the call, if one was, for the caller to remove."""
    if insecure:
        if key is not None:
            raise ValueError("spawn: give key= or insecure=True, not both")
        env["GOSSIP_KEY"] = ""   # not an inherited one either
        env["GOSSIP_INSECURE"] = "1"
        return None
    if isinstance(key, ClusterKey):
        if not key.path:
            raise ValueError("spawn: key= needs a key file (a ClusterKey loaded from one, or "
                             "its path): the peers are other processes")
        key = key.path
    key = key if key is not None else (env.get("GOSSIP_KEY") or os.environ.get("GOSSIP_KEY")
                                       or None)
    if key is not None:
        env["GOSSIP_KEY"] = os.path.abspath(key)
        return None
    job_key = JobKey(prefix="gossip-spawn-key-")
    env["GOSSIP_KEY"] = job_key.path
    return job_key


def _verdict(outcomes: list[PeerOutcome], timeout: float, tolerate: frozenset) -> list[Any]:
    # "stopped": a tolerated rank still running once the others had finished (tolerated_grace).
    if all(o.status == "ok" or o.rank in tolerate and o.status in ("error", "died", "stopped")
           for o in outcomes):
        return [o.result if o.status == "ok" else None for o in outcomes]
    skips = [o for o in outcomes if o.status == "skip"]
    if skips and all(o.status in ("ok", "skip") for o in outcomes):
        import pytest
        pytest.skip(f"rank {skips[0].rank}: {skips[0].error}")
    lines = []
    for o in outcomes:
        lines.append(f"--- rank {o.rank}: {o.status} (exit code {o.exitcode})")
        if o.error:
            lines.append(o.error.rstrip())
        if o.output.strip() and o.status != "ok":
            lines.append(f"    output of rank {o.rank}:\n" + o.output.rstrip())
    timed_out = any(o.status == "killed" for o in outcomes) and not any(
        o.status in ("error", "died") for o in outcomes)
    # The headline names the failure seen first (the cause), not the lowest rank.
    first = first_failure(outcomes, tolerate)
    head = (f"spawned peers did not finish within {timeout:g}s" if timed_out
            else "spawned peers failed" if first is None
            else f"rank {first.rank} {'failed' if first.status == 'error' else 'died'} "
                 f"(exit code {first.exitcode})")
    cls = SpawnTimeout if timed_out else SpawnError
    raise cls(head + "\n" + "\n".join(lines), outcomes)
