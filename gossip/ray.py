"""Ray: gossip peers as Ray actors across a Ray cluster's nodes, each one restarted by Ray
after a death and rejoining the running job through gossip's membership (the others keep
training: nobody else restarts).

    import ray, gossip.ray

    def train(config):                        # runs in every actor: a gossip training loop
        peer = gossip.init()                  # rank, world size, rendezvous, key: set here
        ...
        return result

    ray.init(address="auto")
    results = gossip.ray.run(train, num_workers=8, config={"lr": 0.1}, max_restarts=2)

``run`` reserves one placement-group bundle per peer (``resources_per_worker``, by default
one CPU; ``placement_strategy`` "SPREAD" puts the peers on different nodes where it can,
"PACK" together), starts one actor per bundle and calls ``train_fn(config)`` in each; it
returns each rank's return value, in rank order. Each actor is a peer as under ``gossip run``:
RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR/MASTER_PORT (rank 0's node and a port free there:
the job's rendezvous), GOSSIP_JOB_ID, and a cluster key made for this job (every connection
encrypted and authenticated; the key travels to the actors in their constructor arguments,
as safe as the Ray cluster's own channels, and is written to a 0600 file the actor removes).

Failures: an actor that dies (SIGKILL, its node lost) is started again by Ray up to
``max_restarts`` times (actor ``max_restarts``; its call of ``train_fn`` retried, Ray's
``max_task_retries``): the new process has the same rank and a later GOSSIP_INCARNATION (0 at
the first start, then the start time in microseconds), so ``gossip.init()`` rejoins the
running job as ``gossip run --max-restarts`` does. The rendezvous lives in rank 0's process:
rank 0 is the one peer whose death ends the job. A ``train_fn`` that raises fails ``run``
with that error (the other actors are killed). ``timeout``: seconds for the whole run.

Elastic worker counts: ``num_workers=(MIN, MAX)`` forms the job with MIN peers and asks Ray
for MAX - MIN more, which join the running job whenever the cluster has room for them (a node
added, Ray's autoscaler), through gossip's membership; one that dies for good is a leave.

Ray Train's own path needs nothing of this module: ``TorchTrainer(...,
torch_config=TorchConfig(backend="gossip"))`` runs DDP code on the "gossip" process group
(torch loads the backend in Ray's workers), and ``GossipAverager`` works inside its loop.
"""
from __future__ import annotations

import logging
import os
import socket
import tempfile
import time
import uuid
from collections.abc import Callable, Mapping
from typing import Any

import ray
import zmq
from ray.util.placement_group import placement_group, remove_placement_group
from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

from collectives.security import ClusterKey

__all__ = ["run"]

_PLACEMENT_WAIT_S = 120.0

log = logging.getLogger("gossip")


def run(train_fn: Callable[[Any], Any], *, num_workers: int | tuple[int, int],
        config: Any = None, resources_per_worker: Mapping[str, float] | None = None,
        placement_strategy: str = "SPREAD", max_restarts: int = 0,
        env: Mapping[str, str] | None = None, timeout: float | None = None) -> list[Any]:
    """Run ``train_fn(config)`` as ``num_workers`` gossip peers, one Ray actor each (see the
    module's text); returns their return values by rank. ``env``: more variables for every
    peer (GOSSIP_TOPOLOGY, GOSSIP_TIMEOUT, ...).

    ``num_workers=(MIN, MAX)``, Ray's elastic worker count: MIN peers form the job (in the
    placement group); MAX - MIN more are asked of Ray as actors of their own and join the
    running job whenever the cluster has room for them (a node added, the autoscaler), as
    ``gossip run --nnodes MIN:MAX`` joins nodes past MIN (GOSSIP_JOIN; GOSSIP_MAX_PEERS =
    MAX). A joiner Ray never started, or one that started after the MIN had finished, returns
    None; one that dies for good is a leave, the others go on where their policy allows."""
    low, high = _worker_counts(num_workers)
    if isinstance(max_restarts, bool) or not isinstance(max_restarts, int) or max_restarts < 0:
        raise ValueError(f"gossip.ray.run: max_restarts must be >= 0, got {max_restarts!r}")
    if placement_strategy not in ("SPREAD", "PACK", "STRICT_SPREAD", "STRICT_PACK"):
        raise ValueError("gossip.ray.run: placement_strategy must be SPREAD, PACK, "
                         f"STRICT_SPREAD or STRICT_PACK, got {placement_strategy!r}")
    if not ray.is_initialized():
        ray.init()
    resources = dict(resources_per_worker or {"CPU": 1})
    group = placement_group([dict(resources) for _ in range(low)],
                            strategy=placement_strategy)
    actors: list[Any] = []
    try:
        ready = group.ready()
        done, _ = ray.wait([ready], timeout=_PLACEMENT_WAIT_S)
        if not done:
            raise TimeoutError(
                f"gossip.ray.run: the cluster did not grant {low} bundles of "
                f"{resources} ({placement_strategy}) within {_PLACEMENT_WAIT_S:.0f} s: "
                f"it has {ray.cluster_resources()}")
        placed = [PlacementGroupSchedulingStrategy(group, placement_group_bundle_index=i)
                  for i in range(low)]
        # Where each bundle is: rank 0's address and a free port for the rendezvous, and
        # the local ranks (peers of one node, in rank order).
        probing = [_where.options(scheduling_strategy=s, num_cpus=0).remote() for s in placed]
        answered, _ = ray.wait(probing, num_returns=low, timeout=_PLACEMENT_WAIT_S)
        if len(answered) < low:
            raise TimeoutError(
                f"gossip.ray.run: {low - len(answered)} of the {low} placed bundles did not "
                f"say where they are (node, address) within {_PLACEMENT_WAIT_S:.0f} s; "
                f"the cluster's nodes: {[n['NodeManagerAddress'] for n in ray.nodes()]}")
        where = ray.get(probing)
        master_addr, master_port = where[0][1], where[0][2]
        nodes: dict[str, int] = {}
        local_ranks = []
        for node, _, _ in where:
            local_ranks.append(nodes.get(node, 0))
            nodes[node] = nodes.get(node, 0) + 1
        public, secret = zmq.curve_keypair()
        key = ClusterKey(public, secret)
        common = dict(env or {})
        common.update(MASTER_ADDR=master_addr, MASTER_PORT=str(master_port),
                      GOSSIP_JOB_ID=f"ray-{uuid.uuid4().hex[:12]}")
        if high > low:
            common["GOSSIP_MAX_PEERS"] = str(high)
        options = _actor_options(resources, max_restarts)
        for rank in range(low):
            variables = dict(common, WORLD_SIZE=str(low), RANK=str(rank),
                             LOCAL_RANK=str(local_ranks[rank]),
                             LOCAL_WORLD_SIZE=str(nodes[where[rank][0]]))
            actors.append(_Peer.options(  # type: ignore[attr-defined]  # @ray.remote's class
                scheduling_strategy=placed[rank], **options).remote(variables, key))
        for slot in range(low, high):   # joiners: started when the cluster has room
            variables = dict(common, WORLD_SIZE=str(high), RANK=str(slot), LOCAL_RANK="0",
                             GOSSIP_JOIN="1")
            actors.append(_Peer.options(  # type: ignore[attr-defined]
                scheduling_strategy="SPREAD", **options).remote(variables, key))
        probes = [a.started.remote() for a in actors]   # (before train: answered once built)
        calls = [a.train.remote(train_fn, config) for a in actors]
        return _results(calls, probes, low, timeout)
    finally:
        for actor in actors:
            ray.kill(actor, no_restart=True)
        remove_placement_group(group)


def _worker_counts(num_workers: int | tuple[int, int]) -> tuple[int, int]:
    counts = num_workers if isinstance(num_workers, tuple) else (num_workers, num_workers)
    if len(counts) != 2 or any(isinstance(c, bool) or not isinstance(c, int) for c in counts) \
            or not 1 <= counts[0] <= counts[1]:
        raise ValueError("gossip.ray.run: num_workers must be a positive integer or (MIN, MAX) "
                         f"with 1 <= MIN <= MAX, got {num_workers!r}")
    return counts[0], counts[1]


def _actor_options(resources: Mapping[str, float], max_restarts: int) -> dict[str, Any]:
    options: dict[str, Any] = {"max_restarts": max_restarts, "max_task_retries": max_restarts}
    for name, amount in resources.items():
        if name == "CPU":
            options["num_cpus"] = amount
        elif name == "GPU":
            options["num_gpus"] = amount
        else:
            options.setdefault("resources", {})[name] = amount
    return options


def _results(calls: list[Any], probes: list[Any], low: int,
             timeout: float | None) -> list[Any]:
    """The peers' return values by rank. Until the first ``low`` calls (the members') are
    done, any failure raises; then a joiner whose actor never started (its ``probe``, sent
    before its call, has not answered) is left out (None), and one that did is waited for, its
    failure logged, not raised (it may have come when the job had ended)."""
    deadline = None if timeout is None else time.monotonic() + timeout

    def left() -> float | None:
        return None if deadline is None else max(0.0, deadline - time.monotonic())

    results: dict[int, Any] = {}
    pending = list(calls)
    while any(c in pending for c in calls[:low]):
        finished, pending = ray.wait(pending, num_returns=1, timeout=left())
        if not finished:
            raise TimeoutError(f"gossip.ray.run: {len(pending)} peers still running after "
                               f"{timeout} s")
        results[calls.index(finished[0])] = ray.get(finished[0])   # raises a peer's error
    for rank in range(low, len(calls)):
        if calls[rank] not in pending:
            continue
        if not ray.wait([probes[rank]], timeout=0)[0]:
            log.info("gossip.ray: joiner rank %d never started (no room in the cluster)", rank)
            continue
        try:
            results[rank] = ray.get(calls[rank], timeout=left())
        except ray.exceptions.RayError as exc:   # a joiner that came too late, or failed
            log.warning("gossip.ray: joiner rank %d ended with %s: %s", rank,
                        type(exc).__name__, exc)
    return [results.get(rank) for rank in range(len(calls))]


@ray.remote
def _where() -> tuple[str, str, int]:
    """(node id, node address, a port free there now) of the bundle this runs in."""
    address = ray.util.get_node_ip_address()
    family = socket.AF_INET6 if ":" in address else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as s:
        s.bind(("", 0))
        port = s.getsockname()[1]
    return ray.get_runtime_context().get_node_id(), address, port


@ray.remote
class _Peer:
    """One gossip peer: its variables set in the actor's process at every start (Ray runs
    the constructor again after a restart), the key in a private file."""

    def __init__(self, variables: dict[str, str], key: ClusterKey) -> None:
        restarted = ray.get_runtime_context().was_current_actor_reconstructed
        self.key_dir = tempfile.mkdtemp(prefix="gossip-ray-")
        path = os.path.join(self.key_dir, "cluster.key")
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write(f"public = {key.public.decode()}\nsecret = {key.secret.decode()}\n")
        os.environ.update(variables)
        os.environ["GOSSIP_KEY"] = path
        os.environ["GOSSIP_INCARNATION"] = str(time.time_ns() // 1000 if restarted else 0)

    def started(self) -> bool:
        """True: the actor runs (its constructor has)."""
        return True

    def train(self, train_fn: Callable[[Any], Any], config: Any) -> Any:
        try:
            return train_fn(config)
        finally:
            try:
                os.unlink(os.path.join(self.key_dir, "cluster.key"))
                os.rmdir(self.key_dir)
            except OSError:
                pass
