"""`gossip run`: start N peer processes on this machine, with torchrun's habits.

    gossip run -n 4 train.py --lr 0.1          # or: python -m gossip.run -n 4 train.py ...
    gossip run -n 2 -m mypkg.train             # a module instead of a script
    gossip run --nnodes 2 --node-rank 1 --master-addr node0 --key cluster.key -n 8 train.py
    gossip run --nnodes 2:4 --node-rank 3 --master-addr node0 --key cluster.key -n 8 train.py

``--nnodes MIN:MAX``: nodes 0..MIN-1 form the job (WORLD_SIZE = MIN x N at the start); a node
of rank MIN..MAX-1 starts its peers as joiners of the running job (GOSSIP_JOIN, through the
rendezvous address: they take the members' state at a step boundary, as a restarted peer
does), whenever it comes; every peer is told the job's bound (GOSSIP_MAX_PEERS = MAX x N),
past which joiners are refused. Each joiner's RANK is its slot, node rank x N + local rank,
and names it (a restarted one takes its slot again); its rank in the group is the view's
(``peer.rank``, ``peer.world_size``), not RANK/WORLD_SIZE.

Each peer gets torchrun's variables (RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE,
MASTER_ADDR, MASTER_PORT, GROUP_RANK), so ``gossip.init()`` (or torch.distributed) finds the
group, and GOSSIP_JOB_ID (``--job-id``, or one made here: see _job_id), so peers of two runs
that meet at one port never mix.

Every job is encrypted and authenticated (CURVE) unless ``--insecure``: each peer gets
GOSSIP_KEY, the cluster key of ``--key FILE`` (or of the launcher's own GOSSIP_KEY), else one
made for the job on one node (collectives.security.JobKey: a private temporary folder,
removed when the launcher exits; restarted peers get the same). A job across nodes
(``--nnodes`` > 1 or MIN:MAX) needs the same key file on every node (``gossip keygen PATH``,
then copy it) or ``--insecure`` on every node: without either it is refused before anything
starts. Under ``--insecure`` the peers get GOSSIP_INSECURE=1 (gossip.init then does not warn).

Every output line is prefixed with the peer's rank (``--log-dir``, ``--tee``: see launch). The
first peer to fail stops the others (SIGTERM, then SIGKILL after ``grace`` seconds) and its
exit code becomes the launcher's (128+N for death by signal N, like a shell).
SIGINT/SIGTERM/SIGHUP to the launcher are forwarded to every peer, with the same escalation,
and the launcher exits 128+signal. SIGUSR1 is passed on to every peer that catches it (each
writes its threads' stacks: gossip/stacks.py) and the job goes on.

At the start the launcher says where the job is (to stderr, unless GOSSIP_LOG_LEVEL is above
INFO; see _banner): the job id, the rendezvous address, the peers of this node, the command
that adds a peer to the running job from another shell, and the pid to send SIGUSR1 to.

This module must not import torch: it only starts processes, and should start fast.

The processes themselves (start, watch, stop, reap) are local_peers.py's.
"""
from __future__ import annotations

import argparse
import logging
import os
import re
import secrets
import shlex
import sys
import threading
from typing import Mapping, Sequence

from collectives import defaults
from collectives.config import MAX_JOB_ID, check_job_id
from collectives.errors import AuthenticationError
from collectives.security import JobKey, load_cluster_key
from gossip.launch.local_peers import LocalPeers
from gossip.logs import check_log_level
from gossip.launch.supervisor import free_port

__all__ = ["launch", "main", "build_parser", "add_arguments", "run_from_args", "parse_nnodes",
           "parse_tee", "DEFAULT_GRACE"]

DEFAULT_GRACE = defaults.LAUNCHER_GRACE  # seconds between the polite signal and SIGKILL
_MULTI_NODE_PORT = 29500  # torchrun's default, for runs where every node must agree on it
# These outrank torchrun's variables in gossip.settings: a stale one inherited from the
# launcher's own environment would override the ranks we hand out, so peers never see them.
_OVERRIDES = ("GOSSIP_RANK", "GOSSIP_WORLD_SIZE", "GOSSIP_LOCAL_RANK", "GOSSIP_RENDEZVOUS",
              "GOSSIP_MASTER_ADDR", "GOSSIP_MASTER_PORT")


def parse_nnodes(text: str) -> tuple[int, int]:
    """``--nnodes``: "N" (N nodes) or "MIN:MAX" (an elastic job) -> (MIN, MAX)."""
    low, sep, high = str(text).partition(":")
    try:
        lo, hi = int(low), int(high) if sep else int(low)
    except ValueError:
        raise ValueError(f"--nnodes {text!r}: expected N or MIN:MAX (numbers of nodes)") \
            from None
    if lo < 1 or hi < lo:
        raise ValueError(f"--nnodes {text!r}: need 1 <= MIN <= MAX")
    return lo, hi


def parse_tee(text: str, nprocs: int) -> list[int]:
    """``--tee``, torchrun's: "3" (every local rank) or "LOCAL_RANK:N,..." (ranks not named
    show nothing) -> the streams each local rank also shows here: 0 none, 1 stdout, 2
    stderr, 3 both."""
    def streams(value: str) -> int:
        if value.strip() not in ("0", "1", "2", "3"):
            raise ValueError(f"--tee {text!r}: expected 0 (none), 1 (stdout), 2 (stderr), "
                             "3 (both), or LOCAL_RANK:N,... such as 0:3,1:2")
        return int(value)
    text = str(text).strip()
    if ":" not in text:
        return [streams(text)] * nprocs
    tee = [0] * nprocs
    for item in text.split(","):
        rank, _, value = item.partition(":")
        if not rank.strip().isdigit() or not int(rank) < nprocs:
            raise ValueError(f"--tee {text!r}: {rank.strip()!r} is not a local rank "
                             f"(0..{nprocs - 1})")
        tee[int(rank)] = streams(value)
    return tee


def _check(nprocs: int, *, nnodes: int, node_rank: int, master_addr: str | None,
           master_port: int | None, topology: str | None, timeout: float | None,
           grace: float, max_nodes: int) -> None:
    """Raise ValueError with a one-line message for every input a user can get wrong."""
    if type(nprocs) is not int or nprocs < 1:
        raise ValueError(f"-n must be at least 1, got {nprocs}")
    if type(nnodes) is not int or nnodes < 1:
        raise ValueError(f"--nnodes must be at least 1, got {nnodes}")
    if type(max_nodes) is not int or max_nodes < nnodes:
        raise ValueError(f"--nnodes {nnodes}:{max_nodes}: need MIN <= MAX")
    spec = f"{nnodes}" if max_nodes == nnodes else f"{nnodes}:{max_nodes}"
    if type(node_rank) is not int or not 0 <= node_rank < max_nodes:
        raise ValueError(f"--node-rank {node_rank} is outside 0..{max_nodes - 1} "
                         f"(--nnodes {spec})")
    if max_nodes > 1 and not master_addr:
        raise ValueError("--nnodes > 1 needs --master-addr (the host of node rank 0)")
    if master_port is not None and not 0 < master_port < 65536:
        raise ValueError(f"--master-port {master_port} is not a valid TCP port (1..65535)")
    if timeout is not None and not timeout > 0:
        raise ValueError(f"--timeout must be > 0 seconds, got {timeout}")
    if grace < 0:
        raise ValueError(f"--grace must be >= 0, got {grace}")
    if topology is not None:
        import topologies  # numpy only; catches a typo before N peers each fail on it
        try:
            topologies.parse(topology, nnodes * nprocs)
        except ValueError as exc:
            raise ValueError(f"--topology {topology!r}: {exc}") from None


def _cluster_key(key: str | None, where: str, insecure: bool, max_nodes: int) -> str | None:
    """The key file every peer gets (an absolute path: peers may chdir), checked here, once;
    None when there is none to give (one node: the job makes its own; or ``insecure``).
    ValueError for a key and --insecure together, a file that is not a cluster key, and a
    job across nodes with neither."""
    if key is not None and insecure:
        raise ValueError(f"{where} and --insecure: give one of them (the key encrypts the "
                         "job; --insecure runs it open)")
    if key is None:
        if max_nodes > 1 and not insecure:
            raise ValueError(
                "a job across nodes (--nnodes > 1 or MIN:MAX) needs a cluster key shared by "
                "every node, which gossip run cannot hand out itself: make one with `gossip "
                "keygen PATH`, copy the file to every node (keep it private) and give --key "
                "PATH (or GOSSIP_KEY=PATH) on each; or give --insecure on every node to run "
                "the job open (anyone who can reach its ports can then take a rank, read and "
                "inject data)")
        return None
    if not os.path.isfile(key):
        raise ValueError(f"{where} {key}: no such file (make one with `gossip keygen PATH`)")
    try:
        load_cluster_key(key)
    except AuthenticationError as exc:
        raise ValueError(f"{where}: {exc}") from None
    return os.path.abspath(key)


def _job_id(job_id: str | None, env: Mapping[str, str], nnodes: int, addr: str,
            port: int) -> str:
    """The job id every peer gets (GOSSIP_JOB_ID): --job-id, else an inherited GOSSIP_JOB_ID,
    else one made here: on one node a fresh random one, so two runs that meet at one port
    never mix; across nodes every node must derive the same, so one from the rendezvous
    address (two jobs cannot share that address across nodes anyway: give --job-id to tell
    them apart for certain)."""
    chosen = job_id if job_id is not None else env.get("GOSSIP_JOB_ID")
    if chosen is not None:
        return chosen
    if nnodes == 1:
        return f"run-{secrets.token_hex(6)}"
    return re.sub(r"[^A-Za-z0-9._:@+-]", "_", f"run-{addr}-{port}")[-MAX_JOB_ID:]


def _banner(cmd: list[str], nprocs: int, *, env: Mapping[str, str], nnodes: int,
            max_nodes: int, node_rank: int, addr: str, port: int) -> list[str]:
    """Where the job is, in a few lines: its id and rendezvous address, this node's peers,
    the command that adds a peer to it (the variables a joiner needs: GOSSIP_JOIN, the
    address, the job id, and the key file's path or GOSSIP_INSECURE, never a key itself; the
    topology and timeout when the job has them, since a joiner's must match), the `gossip
    status` command that shows the running job, and, when
    signals are forwarded (the main thread), the pid to send SIGUSR1 to for every peer's
    stacks."""
    host = f"[{addr}]" if ":" in addr else addr
    where = f"{nprocs} peer(s) on this node"
    if max_nodes > 1:
        nodes = f"{nnodes}:{max_nodes}" if max_nodes > nnodes else str(nnodes)
        where += f", node {node_rank} of --nnodes {nodes}"
        if node_rank >= nnodes:
            where += " (joining the running job)"
    lines = [f"job {env['GOSSIP_JOB_ID']} at {host}:{port}, {where}"]
    joiner = {"GOSSIP_JOIN": "1", "GOSSIP_RENDEZVOUS": f"tcp://{host}:{port}",
              "GOSSIP_JOB_ID": env["GOSSIP_JOB_ID"]}
    for name in ("GOSSIP_KEY", "GOSSIP_INSECURE", "GOSSIP_TOPOLOGY", "GOSSIP_TIMEOUT"):
        if env.get(name):
            joiner[name] = env[name]
    assignments = " ".join(f"{name}={shlex.quote(value)}" for name, value in joiner.items())
    lines.append(f"add a peer: {assignments} {shlex.join(cmd)}")
    status = ["gossip", "status", f"{host}:{port}", "--job", env["GOSSIP_JOB_ID"]]
    if env.get("GOSSIP_KEY"):
        status += ["--key", env["GOSSIP_KEY"]]
    lines.append(f"see it: {shlex.join(status)} [--watch] [--stacks]")
    if threading.current_thread() is threading.main_thread():
        lines.append(f"every peer's stacks: kill -USR1 {os.getpid()}")
    return lines


def launch(cmd: list[str], nprocs: int, *, nnodes: int = 1, node_rank: int = 0,
           max_nodes: int | None = None,
           master_addr: str | None = None, master_port: int | None = None,
           env: Mapping[str, str] | None = None, topology: str | None = None,
           timeout: float | None = None, key: str | None = None, insecure: bool = False,
           prefix: bool = True, grace: float = DEFAULT_GRACE, keep_going: bool = False,
           job_id: str | None = None, max_restarts: int = 0,
           log_dir: str | None = None, tee: str | None = None) -> int:
    """Run ``cmd`` as ``nprocs`` peers of this node; return the launcher's exit code.

    ``cmd`` is the full command line (e.g. ``[sys.executable, "train.py"]``). ``env`` adds to
    the launcher's environment. ``timeout`` (GOSSIP_TIMEOUT) is each peer's operation
    deadline, not a limit on the run. ``keep_going``: a failed peer does not stop the
    others (gossip policies train on around a dead peer); the exit code is then the first
    failure's once all have ended. Raises ValueError for bad arguments, before any process
    starts. Signal forwarding is installed only when called from the main thread.
    ``max_nodes`` (> ``nnodes``): an elastic job of ``nnodes`` to ``max_nodes`` nodes (see
    the module docstring). ``log_dir``: each peer's stdout and stderr are also written to
    ``LOG_DIR/rank{R}.stdout`` and ``.stderr`` (unprefixed; a restarted peer's lines follow
    its earlier ones after a marker line); ``tee`` (torchrun's --tee, see parse_tee; default
    "3") chooses which of them are also shown here. A peer's traceback is shown in one line
    when another rank's failure caused it, or when it is a RendezvousError, unless the
    environment's GOSSIP_LOG_LEVEL is DEBUG (gossip/launch/failure_report.py).
    ``key`` (a cluster key file; default GOSSIP_KEY of ``env`` or of the launcher's
    environment) and ``insecure``: see the module docstring; a single-node job with neither
    gets a key of its own, removed when this returns.
    """
    max_nodes = nnodes if max_nodes is None else max_nodes
    _check(nprocs, nnodes=nnodes, node_rank=node_rank, master_addr=master_addr,
           master_port=master_port, topology=topology, timeout=timeout, grace=grace,
           max_nodes=max_nodes)
    if type(max_restarts) is not int or max_restarts < 0:
        raise ValueError(f"--max-restarts must be >= 0, got {max_restarts}")
    if job_id is not None:
        try:
            check_job_id(job_id)
        except ValueError as exc:
            raise ValueError(f"--job-id: {exc}") from None
    if not cmd:
        raise ValueError("nothing to run: give a script or -m module")
    streams = parse_tee("3" if tee is None else tee, nprocs)
    if log_dir is None and streams != [3] * nprocs:   # a stream hidden would be lost
        raise ValueError(f"--tee {tee} needs --log-dir (the files keep what is not shown)")
    addr = master_addr or "127.0.0.1"
    port = master_port or (free_port() if max_nodes == 1 else _MULTI_NODE_PORT)
    joining = node_rank >= nnodes   # a node beyond MIN joins the running job
    world = (max_nodes if joining else nnodes) * nprocs   # (a joiner's RANK < WORLD_SIZE)
    base = {k: v for k, v in os.environ.items() if k not in _OVERRIDES}
    base.update(env or {})
    # An inherited GOSSIP_KEY yields to an explicit --insecure (--key with it is an error).
    where = "--key" if key is not None else "GOSSIP_KEY"
    if key is None and not insecure:
        key = base.get("GOSSIP_KEY") or None
    key = _cluster_key(key, where, insecure, max_nodes)
    base.update(WORLD_SIZE=str(world), LOCAL_WORLD_SIZE=str(nprocs), MASTER_ADDR=addr,
                MASTER_PORT=str(port), GROUP_RANK=str(node_rank),
                GOSSIP_JOB_ID=_job_id(job_id, base, max_nodes, addr, port))
    if max_nodes > nnodes:
        base["GOSSIP_MAX_PEERS"] = str(max_nodes * nprocs)
    if joining:
        base["GOSSIP_JOIN"] = "1"
    if log_dir is not None:
        try:
            os.makedirs(log_dir, exist_ok=True)
        except OSError as exc:
            raise ValueError(f"--log-dir {log_dir}: {exc.strerror}") from None
    if prefix or log_dir is not None:
        # Lines reach us through pipes, where Python would hold them in a block buffer (and
        # lose them if the peer is killed). Passed-through output keeps the user's buffering.
        base["PYTHONUNBUFFERED"] = "1"
    if nprocs > 1:
        # torchrun's habit: N peers each spawning one BLAS thread per core oversubscribe.
        base.setdefault("OMP_NUM_THREADS", "1")
    if topology is not None:
        base["GOSSIP_TOPOLOGY"] = topology
    if timeout is not None:
        base["GOSSIP_TIMEOUT"] = str(timeout)
    if insecure:
        base.pop("GOSSIP_KEY", None)
        base["GOSSIP_INSECURE"] = "1"   # meant: gossip.init does not warn
    elif key is not None:
        base["GOSSIP_KEY"] = key
    # GOSSIP_LOG_LEVEL=DEBUG: every traceback whole, not shortened to its last line.
    level = check_log_level(base.get("GOSSIP_LOG_LEVEL", ""))
    if isinstance(level, str):
        level = logging.getLevelName(level) if level else 0
    verbose = 0 < level <= logging.DEBUG
    job_key = None
    if key is None and not insecure:
        job_key = JobKey()   # one node: a key for this job alone, restarts included
        base["GOSSIP_KEY"] = job_key.path
    try:
        if not level or level <= logging.INFO:   # the default level shows it
            banner = _banner(cmd, nprocs, env=base, nnodes=nnodes, max_nodes=max_nodes,
                             node_rank=node_rank, addr=addr, port=port)
            try:
                print("".join(f"gossip run: {line}\n" for line in banner), end="",
                      file=sys.stderr, flush=True)
            except (OSError, ValueError):
                pass   # no stderr to read it on: the job runs all the same
        return LocalPeers(cmd, nprocs, first_rank=node_rank * nprocs, env=base, prefix=prefix,
                          grace=grace, keep_going=keep_going, max_restarts=max_restarts,
                          log_dir=log_dir, tee=streams, verbose=verbose).run()
    finally:
        if job_key is not None:
            job_key.close()


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The options of `gossip run` (shared by `python -m gossip.run`)."""
    parser.add_argument("-n", "--nproc-per-node", dest="nprocs", type=int, default=1,
                        metavar="N", help="peers to start on this node (default 1)")
    parser.add_argument("--nnodes", default="1", metavar="N|MIN:MAX",
                        help="number of nodes (default 1); MIN:MAX for an elastic job: nodes "
                             "of rank MIN and above join the running job, up to MAX")
    parser.add_argument("--node-rank", type=int, default=0, help="this node's rank (default 0)")
    parser.add_argument("--master-addr", default=None, help="host of global rank 0 "
                        "(default 127.0.0.1; required with --nnodes > 1)")
    parser.add_argument("--master-port", type=int, default=None,
                        help=f"rendezvous port (default: a free port on one node, "
                             f"{_MULTI_NODE_PORT} on several)")
    parser.add_argument("--topology", default=None, help="topology spec, e.g. ring, torus:2x2")
    parser.add_argument("--timeout", type=float, default=None,
                        help="each peer's operation timeout in seconds (GOSSIP_TIMEOUT)")
    parser.add_argument("--key", default=None, metavar="FILE",
                        help="cluster key file (`gossip keygen FILE`; default GOSSIP_KEY): "
                             "every peer encrypts and authenticates with it (CURVE). Without "
                             "it a one-node job makes a key of its own; a job across nodes "
                             "needs it (the same file on every node) or --insecure")
    parser.add_argument("--insecure", action="store_true",
                        help="run the job without a cluster key: anyone who can reach its "
                             "ports can take a rank, read and inject data")
    parser.add_argument("--max-restarts", type=int, default=0, metavar="K",
                        help="start a failed peer again, up to K times per peer; it rejoins "
                             "the running job (policies with elastic=True, or gossip ones, "
                             "go on meanwhile); once every other peer of the node has "
                             "finished, a restart still running is stopped after --grace")
    parser.add_argument("--job-id", default=None,
                        help="the job's id (GOSSIP_JOB_ID; default: a fresh one on one node, "
                             "one from the rendezvous address across nodes): peers of other "
                             "jobs are refused")
    parser.add_argument("--grace", type=float, default=DEFAULT_GRACE, help="seconds between "
                        f"SIGTERM/SIGINT and SIGKILL (default {DEFAULT_GRACE:g})")
    parser.add_argument("--keep-going", action="store_true",
                        help="a failed peer does not stop the others (for gossip policies, "
                             "which train on around it); exit code: the first failure's")
    parser.add_argument("--no-prefix", dest="prefix", action="store_false",
                        help="pass peer output through without the [rank k] prefix")
    parser.add_argument("--log-dir", default=None, metavar="DIR",
                        help="write each peer's output to DIR/rank{R}.stdout and .stderr "
                             "(also shown here: see --tee)")
    parser.add_argument("--tee", default=None, metavar="N|LOCAL_RANK:N,...",
                        help="with --log-dir, the streams also shown here, as torchrun's: "
                             "0 none, 1 stdout, 2 stderr, 3 both (default 3); per local "
                             "rank as 0:3,1:2 (ranks not named: 0)")
    parser.add_argument("-m", "--module", action="store_true",
                        help="run the target as a module (python -m), not a script")
    parser.add_argument("script", metavar="script|module", help="script (or module with -m)")
    parser.add_argument("script_args", nargs=argparse.REMAINDER,
                        help="arguments for the script, passed through untouched")


def build_parser(prog: str = "gossip run") -> argparse.ArgumentParser:
    """A parser of the `gossip run` options on its own, for `python -m gossip.run`."""
    parser = argparse.ArgumentParser(
        prog=prog, description="Start N gossip peers on this machine, torchrun-style.")
    add_arguments(parser)
    return parser


def _strip_interpreter(args: argparse.Namespace) -> None:
    """``gossip run -n 4 python train.py`` (mpirun's and srun's habit: the command line in
    full): the interpreter named first is dropped, and ``python -m mod`` becomes ``-m mod``.
    Each peer runs under this Python (sys.executable) whatever the name given."""
    if args.module or not _PYTHON.fullmatch(os.path.basename(args.script)):
        return
    rest = list(args.script_args)
    if not rest:
        raise ValueError(f"{args.script!r} with no script: give the script to run "
                         "(gossip run -n 4 train.py)")
    if rest[0] == "-m" and len(rest) > 1:
        args.module, args.script, args.script_args = True, rest[1], rest[2:]
    elif rest[0].startswith("-"):
        raise ValueError(f"{args.script} {rest[0]}: interpreter options are not passed on; "
                         "give the script (or -m module) after gossip run's own options")
    else:
        args.script, args.script_args = rest[0], rest[1:]


_PYTHON = re.compile(r"python(\d+(\.\d+)?)?")


def run_from_args(args: argparse.Namespace) -> int:
    """Launch from parsed options; ValueError (a one-line message) for bad input."""
    _strip_interpreter(args)
    check_log_level(os.environ.get("GOSSIP_LOG_LEVEL", ""))   # one line here, not one per rank
    if args.module:
        cmd = [sys.executable, "-m", args.script, *args.script_args]
    else:
        if not os.path.isfile(args.script):
            raise ValueError(f"script {args.script!r} not found")
        cmd = [sys.executable, args.script, *args.script_args]
    nnodes, max_nodes = parse_nnodes(args.nnodes)
    return launch(cmd, args.nprocs, nnodes=nnodes, max_nodes=max_nodes,
                  node_rank=args.node_rank,
                  master_addr=args.master_addr, master_port=args.master_port,
                  topology=args.topology, timeout=args.timeout, key=args.key,
                  insecure=args.insecure, prefix=args.prefix, grace=args.grace,
                  keep_going=args.keep_going,
                  job_id=args.job_id, max_restarts=args.max_restarts, log_dir=args.log_dir,
                  tee=args.tee)


def main(argv: Sequence[str] | None = None) -> int:
    """`python -m gossip.run ...`: returns the exit code (2 for bad arguments)."""
    args = build_parser().parse_args(argv)
    try:
        return run_from_args(args)
    except KeyboardInterrupt:  # before our handlers were in place: nothing started yet
        return 130
    except ValueError as exc:
        print(f"gossip run: error: {exc}", file=sys.stderr)
        return 2
