"""Where a peer learns its rank, the world size and the rendezvous address.

Each setting comes from the first source that has it, in this order: explicit arguments,
``GOSSIP_*`` variables, torchrun's (RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR, MASTER_PORT),
SLURM's (SLURM_PROCID, SLURM_NTASKS, SLURM_LOCALID; the master is the job's first node),
OpenMPI's (OMPI_COMM_WORLD_RANK, _SIZE, _LOCAL_RANK). With none of them, a process is a world of
one, so a script runs unchanged without a launcher.

The job id follows the same order: ``job_id=``, GOSSIP_JOB_ID (``gossip run`` sets it),
torchrun's TORCHELASTIC_RUN_ID (its ``--rdzv-id``; "none", torchrun's default, names no job),
SLURM's SLURM_JOB_ID (with the step: SLURM_STEP_ID), OpenMPI's PMIX_NAMESPACE or
OMPI_MCA_ess_base_jobid. Without any, the job is unnamed: it meets only unnamed peers, and two
unnamed jobs on one rendezvous address are not told apart (set GOSSIP_JOB_ID).
"""
from __future__ import annotations

import os
import re
from dataclasses import dataclass
from typing import Mapping

from collectives.config import MAX_JOB_ID, check_job_id
from collectives.errors import RendezvousError

__all__ = ["LaunchSettings", "resolve_settings", "resolve_job_id", "first_slurm_host",
           "DEFAULT_PORT"]

DEFAULT_PORT = 29500
# LaunchSettings.source when no launcher variable and no argument gave the rank.
_NO_RANK = "default (no launcher variables: a world of one)"

_RANK = (("GOSSIP_RANK", "GOSSIP_*"), ("RANK", "torchrun"), ("SLURM_PROCID", "SLURM"),
         ("OMPI_COMM_WORLD_RANK", "OpenMPI"))
_SIZE = (("GOSSIP_WORLD_SIZE", "GOSSIP_*"), ("WORLD_SIZE", "torchrun"),
         ("SLURM_NTASKS", "SLURM"), ("OMPI_COMM_WORLD_SIZE", "OpenMPI"))
_LOCAL = (("GOSSIP_LOCAL_RANK", "GOSSIP_*"), ("LOCAL_RANK", "torchrun"),
          ("SLURM_LOCALID", "SLURM"), ("OMPI_COMM_WORLD_LOCAL_RANK", "OpenMPI"))


@dataclass(frozen=True)
class LaunchSettings:
    rank: int
    world_size: int
    local_rank: int
    master_addr: str
    master_port: int
    source: str  # which convention gave the rank, for logs and error messages
    job_id: str = ""  # "" : an unnamed job
    job_source: str = "none"  # which convention gave the job id

    @property
    def rendezvous(self) -> str:
        """The rendezvous address, tcp://HOST:PORT (an IPv6 host in brackets)."""
        host = f"[{self.master_addr}]" if ":" in self.master_addr else self.master_addr
        return f"tcp://{host}:{self.master_port}"

    @property
    def rank_given(self) -> bool:
        """True when an argument or a launcher variable gave the rank (the launcher's slot:
        what names this process across its restarts); False for the default rank 0."""
        return self.source != _NO_RANK

    @property
    def is_local(self) -> bool:
        """True when the rendezvous is on loopback: a single-machine run, bound to loopback."""
        return self.master_addr in ("localhost", "::1") or self.master_addr.startswith("127.")


def _int_from(env: Mapping[str, str], name: str) -> int:
    value = env[name]
    try:
        return int(value)
    except ValueError:
        raise RendezvousError(f"environment variable {name}={value!r} is not an integer") from None


def _first(env: Mapping[str, str], names) -> tuple[int, str] | None:
    for name, source in names:
        if env.get(name, "") != "":
            return _int_from(env, name), source
    return None


def first_slurm_host(nodelist: str) -> str:
    """The first host of a SLURM node list: 'gpu[03-05,9],cpu1' -> 'gpu03'."""
    match = re.match(r"([^,\[]+)(?:\[([^\]]+)\])?", nodelist.strip())
    if not match:
        raise RendezvousError(f"cannot read SLURM node list {nodelist!r}; set MASTER_ADDR")
    prefix, ranges = match.group(1), match.group(2)
    if not ranges:
        return prefix
    first = ranges.split(",")[0].split("-")[0]
    return prefix + first


def resolve_job_id(job_id: str | None = None,
                   env: Mapping[str, str] | None = None) -> tuple[str, str]:
    """(job id, where it came from), from the first source that has one (module docstring).
    A launcher's id is made fit for a routing id (other characters become '_', a long one is
    cut, keeping its end: the distinct part of generated ids); an id the user gave that does
    not fit is a RendezvousError."""
    env = os.environ if env is None else env
    if job_id is not None:
        return _user_job_id(job_id, "job_id="), "arguments"
    if "GOSSIP_JOB_ID" in env:
        return _user_job_id(env["GOSSIP_JOB_ID"], "GOSSIP_JOB_ID"), "GOSSIP_JOB_ID"
    run_id = env.get("TORCHELASTIC_RUN_ID", "")
    if run_id and run_id != "none":
        return _fit(f"torchrun-{run_id}"), "torchrun"
    if env.get("SLURM_JOB_ID"):
        step = env.get("SLURM_STEP_ID")
        return _fit(f"slurm-{env['SLURM_JOB_ID']}" + (f".{step}" if step else "")), "SLURM"
    for name in ("PMIX_NAMESPACE", "OMPI_MCA_ess_base_jobid"):
        if env.get(name) and env.get("OMPI_COMM_WORLD_SIZE"):
            return _fit(f"mpi-{env[name]}"), "OpenMPI"
    return "", "none"


def _user_job_id(value: str, where: str) -> str:
    try:
        return check_job_id(value.strip())
    except ValueError as exc:
        raise RendezvousError(f"{where}: {exc}") from None


def _fit(value: str) -> str:
    return re.sub(r"[^A-Za-z0-9._:@+-]", "_", value)[-MAX_JOB_ID:]


def resolve_settings(*, rank: int | None = None, world_size: int | None = None,
                     local_rank: int | None = None, rendezvous: str | None = None,
                     job_id: str | None = None,
                     env: Mapping[str, str] | None = None) -> LaunchSettings:
    """This process's settings, each from the first source that has it (see the module docstring;
    ``env`` defaults to os.environ). RendezvousError for a variable that is not an integer, a rank
    outside the world or a malformed rendezvous address."""
    env = os.environ if env is None else env
    source = "arguments"
    if rank is None:
        found = _first(env, _RANK)
        rank, source = found if found else (0, _NO_RANK)
    if world_size is None:
        found = _first(env, _SIZE)
        world_size = found[0] if found else 1
    if local_rank is None:
        found = _first(env, _LOCAL)
        local_rank = found[0] if found else 0
    if type(world_size) is not int or world_size < 1:
        raise RendezvousError(f"world size must be a positive integer, got {world_size!r}")
    if type(rank) is not int or not 0 <= rank < world_size:
        raise RendezvousError(f"rank {rank!r} (from {source}) is outside world size {world_size}")

    addr, port = _master(env, rendezvous)
    job, job_source = resolve_job_id(job_id, env)
    return LaunchSettings(rank, world_size, local_rank, addr, port, source, job, job_source)


def _master(env: Mapping[str, str], rendezvous: str | None) -> tuple[str, int]:
    explicit = rendezvous or env.get("GOSSIP_RENDEZVOUS") or ""
    if explicit:
        match = re.fullmatch(r"(?:tcp://)?\[?([^\[\]]+?)\]?:(\d+)", explicit.strip())
        if not match:
            raise RendezvousError(f"rendezvous address {explicit!r} is not tcp://HOST:PORT")
        return match.group(1), int(match.group(2))
    addr = env.get("GOSSIP_MASTER_ADDR") or env.get("MASTER_ADDR")
    if not addr and env.get("SLURM_JOB_NODELIST") or not addr and env.get("SLURM_NODELIST"):
        addr = first_slurm_host(env.get("SLURM_JOB_NODELIST") or env["SLURM_NODELIST"])
    if not addr and env.get("OMPI_COMM_WORLD_SIZE"):
        if env.get("OMPI_COMM_WORLD_LOCAL_SIZE", env["OMPI_COMM_WORLD_SIZE"]) != \
                env["OMPI_COMM_WORLD_SIZE"]:
            raise RendezvousError("mpirun across several hosts: set MASTER_ADDR (the host of "
                                  "rank 0) and MASTER_PORT, e.g. mpirun -x MASTER_ADDR=node1 ...")
    addr = addr or "127.0.0.1"
    if env.get("GOSSIP_MASTER_PORT"):
        port = _int_from(env, "GOSSIP_MASTER_PORT")
    elif env.get("MASTER_PORT"):
        port = _int_from(env, "MASTER_PORT")
        if env.get("TORCHELASTIC_USE_AGENT_STORE", "").lower() == "true":
            # Under torchrun the agent's TCP store holds MASTER_PORT for the whole run; take
            # the next port, which every node derives alike (GOSSIP_MASTER_PORT overrides).
            port += 1
    elif env.get("SLURM_JOB_ID", "").isdigit():
        # Two jobs sharing a node must not collide on one default port.
        port = 20000 + int(env["SLURM_JOB_ID"]) % 20000
    else:
        port = DEFAULT_PORT
    if not 0 < port < 65536:
        raise RendezvousError(f"rendezvous port {port} is not a valid TCP port")
    return addr, port
