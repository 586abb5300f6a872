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
           "DEFAULT_PORT", "Variable", "ENVIRONMENT"]

DEFAULT_PORT = 29500
"""The rendezvous port when nothing names one (torchrun's default, as MASTER_PORT)."""
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
        return is_loopback(self.master_addr)


def is_loopback(host: str) -> bool:
    """Whether ``host`` (a name or an address, IPv6 with or without brackets) is this
    machine's loopback."""
    host = host.strip("[]")
    return host in ("localhost", "::1") or host.startswith("127.")


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


@dataclass(frozen=True)
class Variable:
    """An environment variable the runtime reads or sets for the processes it starts: one row
    of the settings page of the documentation (generated from ENVIRONMENT)."""

    name: str
    # What holds when it is unset ("" when nothing does).
    default: str
    # What it does, in a sentence or two (markdown).
    meaning: str
    # The modules that read it (paths in the repository); () for one only set for others.
    read_in: tuple[str, ...] = ()
    # What sets it for the processes it starts ("" when nothing of ours does).
    set_by: str = ""
    # Whose convention it is: "gossip", "torchrun", "SLURM", "OpenMPI" or "process".
    convention: str = "gossip"


_SETTINGS, _RUNTIME = "gossip/settings.py", "gossip/runtime.py"
_MEMBERSHIP, _LAUNCHER = "gossip/membership/controller.py", "gossip/launch/launcher.py"
_SPAWN = "gossip.testing.spawn"
_METRICS_SETTINGS = "gossip/metrics/metrics_settings.py"

# Every environment variable the runtime reads (and those it sets for the processes it
# starts), in one place: the settings page is generated from it, and
# tests/docs/test_reference.py checks it against the variables the code names, both ways.
ENVIRONMENT: tuple[Variable, ...] = (
    Variable("GOSSIP_RANK", "RANK, SLURM_PROCID, OMPI_COMM_WORLD_RANK; else 0",
             "This process's rank: the first source of the rank (the module docstring gives "
             "the order of the launchers' variables).", (_SETTINGS, "gossip/logs.py"),
             _SPAWN),
    Variable("GOSSIP_WORLD_SIZE", "WORLD_SIZE, SLURM_NTASKS, OMPI_COMM_WORLD_SIZE; else 1",
             "The number of peers the group starts with.", (_SETTINGS,), _SPAWN),
    Variable("GOSSIP_LOCAL_RANK", "LOCAL_RANK, SLURM_LOCALID, OMPI_COMM_WORLD_LOCAL_RANK; "
             "else 0", "This process's rank on its host.", (_SETTINGS,), _SPAWN),
    Variable("GOSSIP_RENDEZVOUS", "from the master address and port",
             "`tcp://HOST:PORT` of rank 0's rendezvous; takes the place of the master address "
             "and port.", (_SETTINGS,), _SPAWN),
    Variable("GOSSIP_MASTER_ADDR", "MASTER_ADDR; the first host of SLURM's node list; else "
             "127.0.0.1", "The host of rank 0, where the peers meet.", (_SETTINGS,)),
    Variable("GOSSIP_MASTER_PORT", "MASTER_PORT (+1 under torchrun's agent store); under "
             "SLURM 20000 + SLURM_JOB_ID mod 20000; else 29500",
             "The rendezvous port on rank 0's host.", (_SETTINGS,)),
    Variable("GOSSIP_JOB_ID", "the launcher's job id (TORCHELASTIC_RUN_ID, SLURM_JOB_ID, "
             "OpenMPI's); else none (an unnamed job)",
             "The job this peer belongs to: peers of another job are refused at the "
             "rendezvous and on every connection.", (_SETTINGS, _LAUNCHER),
             "gossip run (--job-id, or one of its own)"),
    Variable("GOSSIP_TOPOLOGY", "ring", "The peer graph, as a spec string (`ring`, "
             "`torus:4x4`, `exponential`, ...: `gossip topology --help`).", (_RUNTIME,),
             "gossip run --topology"),
    Variable("GOSSIP_TIMEOUT", "60", "Seconds every blocking call may wait before it raises; "
             "the liveness times follow from it (collectives/defaults.py).", (_RUNTIME,),
             "gossip run --timeout"),
    Variable("GOSSIP_KEY", "none (under gossip run: a key made for the job)",
             "A cluster key file (`gossip keygen PATH`): every socket is encrypted and "
             "authenticated with it (CURVE).", (_RUNTIME, "gossip/testing.py", _LAUNCHER),
             f"gossip run, {_SPAWN}"),
    Variable("GOSSIP_INSECURE", "unset", "`1` (or true, yes, on): a group without a key is "
             "meant, so no InsecureWarning.", ("collectives/security.py",),
             f"gossip run --insecure, {_SPAWN}(insecure=True)"),
    Variable("GOSSIP_JOIN", "unset: form the group", "`1`: join the running job through the "
             "rendezvous address instead of forming one; or member doors, "
             "`tcp://h:p,tcp://h2:p2`.", (_RUNTIME,),
             "gossip run, on a node past MIN of --nnodes MIN:MAX"),
    Variable("GOSSIP_MAX_PEERS", "no bound", "The most members the group admits; joiners past "
             "it are refused.", (_MEMBERSHIP,), "gossip run --nnodes MIN:MAX (MAX x -n)"),
    Variable("GOSSIP_MEMBER_NAME", "`rank<R>` from the launcher's rank; else `<host>-<pid>`",
             "The name this process is a member under: a restarted process under the same "
             "name takes the place of the one it replaces.", (_MEMBERSHIP,)),
    Variable("GOSSIP_INCARNATION", "TORCHELASTIC_RESTART_COUNT; else the start time in "
             "microseconds", "Which start of its member this process is (a later start "
             "replaces an earlier one).", (_MEMBERSHIP, "gossip/demo/train.py"),
             "gossip run (0, then 1, ... with --max-restarts)"),
    Variable("GOSSIP_TRANSPORT", "auto", "`auto` (shared memory between peers of a host, tcp "
             "between hosts), or force `shm`, `ipc` or `tcp`.", (_RUNTIME,)),
    Variable("GOSSIP_LINK", "off", "Emulate a slow network on one machine: `RATE,LATENCY`, "
             "e.g. `1gbit,2ms`, for every link this peer sends on.", (_RUNTIME,)),
    Variable("GOSSIP_PORT_RANGE", "20000-64999", "`LO-HI`: the ports data sockets may bind, "
             "for firewalls between machines (one per peer).", (_RUNTIME,)),
    Variable("GOSSIP_SOCKET_BUFFER", "4M", "The kernel buffers (SO_SNDBUF, SO_RCVBUF) of "
             "each tcp connection, bytes or K/M/G: a connection keeps at most about this much "
             "in flight, so a link of 1 Gbit/s at a 50 ms round trip wants 8M or more. The "
             "kernel caps it at net.core.wmem_max and rmem_max; a run across machines warns "
             "when they are lower. `0`: the kernel's autotuning.", (_RUNTIME,)),
    Variable("GOSSIP_BIND_HOST", "0.0.0.0 on a run across machines; 127.0.0.1 on one",
             "The address data sockets bind on a run across machines.", (_RUNTIME,)),
    Variable("GOSSIP_HOST", "this host's address on the route to the rendezvous",
             "The address other peers reach this one at, on a run across machines.",
             (_RUNTIME,)),
    Variable("GOSSIP_LOG_LEVEL", "unset: only the events logger, at INFO, to stderr",
             "The level of the `gossip`, `collectives` and `topologies` loggers (DEBUG, INFO, "
             "WARNING, ...); DEBUG also makes `gossip run` show every traceback whole.",
             ("gossip/logs.py", _LAUNCHER)),
    Variable("GOSSIP_STACKS_ON_SIGUSR1", "1", "`0` (or false, no, off): `gossip.init()` "
             "leaves SIGUSR1 alone; else it makes SIGUSR1 write every thread's stack to "
             "stderr, the peer running on (only from the main thread, and only while the "
             "signal has no handler of the user's).", ("gossip/stacks.py",)),
    Variable("GOSSIP_METRICS_PORT", "unset: no exporter", "Serve Prometheus text at "
             "`http://HOST:PORT+k/metrics`, k the local rank (docs/how-to/observe.md); a port "
             "in use is a warning, the peer trains on.", (_METRICS_SETTINGS,)),
    Variable("GOSSIP_METRICS_HOST", "127.0.0.1 (this host alone)", "The address the metrics "
             "exporter binds: `0.0.0.0` for a scraper on another machine.",
             (_METRICS_SETTINGS,)),
    Variable("GOSSIP_METRICS_FILE", "unset", "Append a JSON lines record of every metric each "
             "GOSSIP_METRICS_INTERVAL to this path: `{rank}` in it becomes the rank; without "
             "it a group of several writes `NAME.rank<R>.SUFFIX`.", (_METRICS_SETTINGS,)),
    Variable("GOSSIP_TENSORBOARD", "unset", "Write every metric as TensorBoard scalars each "
             "GOSSIP_METRICS_INTERVAL, in `DIR/rank<R>` (needs `pip install tensorboard`).",
             (_METRICS_SETTINGS,)),
    Variable("GOSSIP_METRICS_INTERVAL", "10", "Seconds between two writes of "
             "GOSSIP_METRICS_FILE and GOSSIP_TENSORBOARD (and one more at close).",
             (_METRICS_SETTINGS,)),
    Variable("GOSSIP_NCCL", "NCCL when cupy has it", "`0`: GPU arrays take the staged ring "
             "instead of NCCL (to compare the two).", ("collectives/algorithms/nccl.py",)),
    # torchrun's (and gossip run's: it gives its peers the same)
    Variable("RANK", "", "The rank, when GOSSIP_RANK is unset.", (_SETTINGS, "gossip/logs.py"),
             "gossip run", "torchrun"),
    Variable("WORLD_SIZE", "", "The world size, when GOSSIP_WORLD_SIZE is unset.", (_SETTINGS,),
             "gossip run", "torchrun"),
    Variable("LOCAL_RANK", "", "The rank on this host, when GOSSIP_LOCAL_RANK is unset.",
             (_SETTINGS,), "gossip run", "torchrun"),
    Variable("LOCAL_WORLD_SIZE", "", "The peers on this host (not read: set as torchrun does).",
             (), f"gossip run, {_SPAWN}", "torchrun"),
    Variable("GROUP_RANK", "", "This node's rank (not read: set as torchrun does).", (),
             "gossip run", "torchrun"),
    Variable("MASTER_ADDR", "", "Rank 0's host, when GOSSIP_MASTER_ADDR is unset; also the "
             "torch backend's rendezvous host.",
             (_SETTINGS, "gossip/torch_backend/process_group.py"), "gossip run", "torchrun"),
    Variable("MASTER_PORT", "", "The rendezvous port, when GOSSIP_MASTER_PORT is unset (the "
             "next one under torchrun's agent store, which holds this one).", (_SETTINGS,),
             "gossip run", "torchrun"),
    Variable("TORCHELASTIC_RUN_ID", "", "torchrun's `--rdzv-id`: the job id "
             "`torchrun-<id>` (but `none`, torchrun's default).", (_SETTINGS,),
             convention="torchrun"),
    Variable("TORCHELASTIC_USE_AGENT_STORE", "", "`true`: torchrun's agent holds MASTER_PORT, "
             "so the rendezvous takes the next port.", (_SETTINGS,), convention="torchrun"),
    Variable("TORCHELASTIC_RESTART_COUNT", "", "The incarnation, when GOSSIP_INCARNATION is "
             "unset.", (_MEMBERSHIP,), convention="torchrun"),
    Variable("SLURM_PROCID", "", "The rank, after GOSSIP_RANK and RANK.", (_SETTINGS,),
             convention="SLURM"),
    Variable("SLURM_NTASKS", "", "The world size, after GOSSIP_WORLD_SIZE and WORLD_SIZE.",
             (_SETTINGS,), convention="SLURM"),
    Variable("SLURM_LOCALID", "", "The rank on this host, after GOSSIP_LOCAL_RANK and "
             "LOCAL_RANK.", (_SETTINGS,), convention="SLURM"),
    Variable("SLURM_JOB_NODELIST", "", "Its first host is rank 0's, when no master address is "
             "set (SLURM_NODELIST when it is unset).", (_SETTINGS,), convention="SLURM"),
    Variable("SLURM_NODELIST", "", "As SLURM_JOB_NODELIST, for SLURMs that set only this one.",
             (_SETTINGS,), convention="SLURM"),
    Variable("SLURM_JOB_ID", "", "The job id `slurm-<id>` (with `.<step>`), and the default "
             "rendezvous port 20000 + id mod 20000.", (_SETTINGS,), convention="SLURM"),
    Variable("SLURM_STEP_ID", "", "The step, in the job id.", (_SETTINGS,),
             convention="SLURM"),
    Variable("OMPI_COMM_WORLD_RANK", "", "The rank, after GOSSIP_RANK, RANK and SLURM_PROCID.",
             (_SETTINGS,), convention="OpenMPI"),
    Variable("OMPI_COMM_WORLD_SIZE", "", "The world size, after the others.", (_SETTINGS,),
             convention="OpenMPI"),
    Variable("OMPI_COMM_WORLD_LOCAL_RANK", "", "The rank on this host, after the others.",
             (_SETTINGS,), convention="OpenMPI"),
    Variable("OMPI_COMM_WORLD_LOCAL_SIZE", "", "Below OMPI_COMM_WORLD_SIZE (mpirun across "
             "hosts) without a master address: an error that asks for MASTER_ADDR.",
             (_SETTINGS,), convention="OpenMPI"),
    Variable("PMIX_NAMESPACE", "", "The job id `mpi-<namespace>` under mpirun.", (_SETTINGS,),
             convention="OpenMPI"),
    Variable("OMPI_MCA_ess_base_jobid", "", "The job id `mpi-<id>`, without PMIX_NAMESPACE.",
             (_SETTINGS,), convention="OpenMPI"),
    # the process's own, set for the peers
    Variable("OMP_NUM_THREADS", "", "1 for each peer when there are several (unless set), so "
             "N peers do not each start a BLAS thread per core.", (),
             "gossip run, with -n > 1", "process"),
    Variable("PYTHONUNBUFFERED", "", "1, so every line reaches the launcher's prefixed output "
             "at once (and is not lost when a peer is killed).", (),
             "gossip run (unless --no-prefix without --log-dir)", "process"),
)

