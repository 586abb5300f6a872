"""Running the demo: check the settings, load the data, start the peers on this machine
(gossip.testing.spawn: real processes on loopback, a global deadline, the first failure stops
the rest), follow their progress, then print the table and write the PNG and JSON.

    code = run_demo(DemoOptions(peers=4, policies=("synchronous", "gossip"), epochs=5,
                                out="demo-out"))
    code = run_demo(DemoOptions(policies=("gossip",), kill=Kill(2, 0.33)))

Everything the user can get wrong is checked before any process starts, as a ValueError
with one line. A peer that fails or dies stops the run: the message names the peer, what
happened and the policy being trained; every peer's traceback and output go to
OUT/failure.log.

With ``kill`` (--kill RANK@FRACTION) each policy trains in a group of its own, in which that
peer SIGKILLs itself and is started again (gossip/demo/kill.py); what became of it (back at
which step, how long after its death; its restart refused by a policy that cannot take a
joiner, and why) is in its row. A policy whose other peers fail after the death gets a row
that says so (details in OUT/failure-POLICY.log) and the demo goes on with the next.
"""
from __future__ import annotations

import dataclasses
import importlib.util
import os
import re
import sys
import tempfile
import time
from typing import IO

from collectives import defaults
from gossip.demo.data import Dataset, load_digits, load_mnist, load_shifted_digits
from gossip.demo.evaluation import averaged_accuracies
from gossip.demo.options import DATASETS, DEFAULT_EPOCHS, KILL_EPOCHS, TARGETS, DemoOptions
from gossip.demo.progress import ProgressDisplay
from gossip.demo.records import collect, finished_runs
from gossip.demo.report import format_table, summarize, write_json, write_png
from gossip.demo.train import BASELINE, TrainConfig, run_baseline, run_peer

__all__ = ["DemoOptions", "DemoFailed", "run_demo", "load_dataset", "DATASETS",
           "DEFAULT_EPOCHS", "KILL_EPOCHS", "PNG_NAME", "JSON_NAME"]

PNG_NAME = "demo.png"
JSON_NAME = "demo.json"
_PEER_TIMEOUT_S = defaults.TIMEOUT  # each blocking call; a dead peer is noticed at once anyway
# --kill: once the other peers finished, a restarted peer still on its way back (admitted at a
# boundary the job never reached) gets this long, then is stopped: the job is over.
_REJOIN_GRACE_S = 5.0
# Imported by every peer process before gossip.init, as a training script imports torch first:
# a restarted peer's imports then happen while the others train, not while they wait for it
# at the new view's barrier (torch._dynamo: the first torch optimizer imports it, 0.8 s here).
_PRELOAD = ("torch", "torch._dynamo")


class DemoFailed(RuntimeError):
    """A peer failed or died, or the run passed its deadline; the message is one line."""


def load_dataset(options: DemoOptions) -> Dataset:
    """The data set ``options`` name: MNIST from ``data_dir``, or the digits; DataError if it cannot
    be loaded."""
    if options.dataset == "mnist":
        if options.data_dir is None:   # (DemoOptions asks for one with mnist)
            raise ValueError("--dataset mnist needs --data-dir")
        return load_mnist(options.data_dir)
    if options.dataset == "shifted-digits":
        return load_shifted_digits()
    return load_digits()


def _check_topology(options: DemoOptions) -> str:
    import topologies

    # topologies.TopologyError is a ValueError: one line via the command's error handling.
    return repr(topologies.parse(options.topology, options.peers))


def _check_plotting() -> None:
    if importlib.util.find_spec("matplotlib") is None:
        raise ValueError("the demo draws its figures with matplotlib, which is not installed; "
                         "pip install '.[demo]' in gossip's checkout (or the demo's "
                         "packages: pip install torch scikit-learn matplotlib tqdm)")


def run_demo(options: DemoOptions, *, stdout: IO[str] | None = None,
             stderr: IO[str] | None = None) -> int:
    """Run the demo; returns 0. Bad settings or data raise ValueError (one line), a failed
    run raises DemoFailed (one line; details in OUT/failure.log)."""
    stdout = stdout or sys.stdout
    stderr = stderr or sys.stderr
    graph = _check_topology(options)
    _check_plotting()
    dataset = load_dataset(options)
    shard_size = len(dataset.train_labels) // options.peers
    if shard_size < options.batch_size:
        raise ValueError(f"{options.peers} peers get {shard_size} training samples each, "
                         f"fewer than one batch of {options.batch_size}: use fewer peers or "
                         "a smaller --batch-size")
    epochs = options.epochs_per_policy
    steps_per_epoch = shard_size // options.batch_size
    if options.kill is not None and epochs * steps_per_epoch < 2:
        raise ValueError(f"--kill needs at least 2 training steps (one before the death, one "
                         f"after); {epochs} epoch(s) of {steps_per_epoch} step(s) is fewer")
    os.makedirs(options.out, exist_ok=True)
    per_policy = f"{epochs} epoch{'s' if epochs != 1 else ''} per policy"
    with tempfile.TemporaryDirectory(prefix="gossip-demo-") as tmp:
        progress_path = os.path.join(tmp, "progress.jsonl")
        records_dir = os.path.join(tmp, "records")
        config = TrainConfig(policies=tuple(options.policies), records_dir=records_dir,
                             epochs=epochs, batch_size=options.batch_size, lr=options.lr,
                             seed=options.seed, baseline=options.baseline,
                             progress_path=progress_path,
                             policy_options=dict(options.policy_options), kill=options.kill,
                             non_iid=options.non_iid, straggler=options.straggler,
                             target_accuracy=TARGETS[options.dataset])
        print(f"gossip demo: {dataset.describe()}; {options.peers} peers on {graph} "
              f"(loopback); {per_policy} of {steps_per_epoch} steps, batch "
              f"{options.batch_size} per peer, SGD lr {config.lr:g} momentum "
              f"{config.momentum:g}", file=stderr, flush=True)
        if options.kill is not None:
            print(f"--kill {options.kill}: peer {options.kill.rank} SIGKILLs itself after "
                  f"step {options.kill.step(epochs * steps_per_epoch)} of "
                  f"{epochs * steps_per_epoch} and is started again, in a group of its own "
                  "per policy (synchronous, local-sgd and elastic with elastic=True)",
                  file=stderr, flush=True)
        print(f"starting {options.peers} peer processes...", file=stderr, flush=True)
        with ProgressDisplay(progress_path, stream=stderr, bars=options.bars,
                             target=config.target_accuracy) as display:
            try:
                fates = _launch(options, dataset, config)
            except KeyboardInterrupt:
                # Ctrl-C: what finished before it is reported and written, then the
                # interrupt goes on (exit 130).
                display.close()
                runs = [(name, options.peers) for name in options.policies]
                finished = finished_runs(records_dir, runs + [(BASELINE, 1)] * options.baseline)
                if finished:
                    print(f"gossip demo: interrupted; {len(finished)} finished run(s) "
                          f"reported: {', '.join(r['policy'] for r in finished)}",
                          file=stderr, flush=True)
                    _report(finished, options, dataset, config, graph=graph,
                            per_policy=per_policy, steps_per_epoch=steps_per_epoch,
                            stdout=stdout, interrupted=True)
                raise
            except Exception as exc:
                display.close()
                raise _failure(exc, display.current, options) from None
        records = [_record(records_dir, name, options, fates.get(name))
                   for name in options.policies]
        if options.baseline:
            records.append(collect(records_dir, BASELINE, 1, consensus=False))
    _report(records, options, dataset, config, graph=graph, per_policy=per_policy,
            steps_per_epoch=steps_per_epoch, stdout=stdout)
    return 0


def _report(records: list[dict], options: DemoOptions, dataset: Dataset, config: TrainConfig,
            *, graph: str, per_policy: str, steps_per_epoch: int, stdout: IO[str],
            interrupted: bool = False) -> None:
    """The table on stdout, the PNG and the JSON in the output folder."""
    epochs = options.epochs_per_policy
    for r in records:   # the peers' averages, evaluated here (the peers are gone)
        points = [p for p in r["history"] if p.get("averaged_parameters") is not None]
        for p, accuracy in zip(points, averaged_accuracies(
                dataset, [p.pop("averaged_parameters") for p in points])):
            p["averaged_accuracy"] = accuracy
        if points:   # the run's "avg model": its average at the last evaluation
            r["averaged_accuracy"] = points[-1]["averaged_accuracy"]
    rows = summarize(records, target=config.target_accuracy)
    parameters = next((r["parameters"] for r in records if r["parameters"]), 0)
    table_header = (f"{dataset.describe()}, CNN of {parameters:,} parameters; "
                    f"{options.peers} peers on {graph}, {per_policy}")
    if options.link:
        table_header += f"; every link {options.link} (emulated)"
    if options.non_iid is not None:
        table_header += f"; non-iid shards (Dirichlet alpha {options.non_iid:g})"
    if options.straggler is not None:
        table_header += (f"; peer {options.straggler.rank} {options.straggler.factor:g}x "
                         "slower per step")
    if interrupted:
        table_header += "; interrupted (Ctrl-C): the runs that finished"
    if options.kill is not None:
        table_header += (f"; --kill {options.kill}: peer {options.kill.rank} SIGKILLed after "
                         f"step {options.kill.step(epochs * steps_per_epoch)} of "
                         f"{epochs * steps_per_epoch}, started again")
    print(format_table(rows, target=config.target_accuracy, header=table_header),
          file=stdout, flush=True)
    png = os.path.join(options.out, PNG_NAME)
    js = os.path.join(options.out, JSON_NAME)
    info = {"dataset": dataset.name, "train_samples": len(dataset.train_labels),
            "test_samples": len(dataset.test_labels), "image_shape": list(dataset.image_shape),
            "peers": options.peers, "topology": graph, "epochs": epochs,
            "steps_per_epoch": steps_per_epoch,
            "batch_size_per_peer": options.batch_size, "lr": config.lr, "momentum": config.momentum,
            "seed": options.seed, "parameters": parameters, "non_iid": options.non_iid,
            "link": options.link, "straggler": None if options.straggler is None else {
                "rank": options.straggler.rank, "factor": options.straggler.factor},
            "target_accuracy": config.target_accuracy, "policies": list(options.policies),
            "kill": None if options.kill is None else {
                "rank": options.kill.rank, "fraction": options.kill.fraction,
                "step": options.kill.step(epochs * steps_per_epoch)}}
    write_json(js, rows, info)
    # The figure's title on two lines under --kill: one is wider than the figure.
    write_png(png, rows, title=table_header.replace("; --kill", "\n--kill"),
              target=config.target_accuracy)
    print(f"\nwrote {png} and {js}", file=stdout, flush=True)


def _launch(options: DemoOptions, dataset: Dataset, config: TrainConfig) -> dict[str, dict]:
    """Train every policy (and the baseline); the peers' records are in
    ``config.records_dir``. Returns, under --kill, what became of the killed peer (or of
    the group) per policy."""
    from gossip.testing import spawn

    if options.kill is None:
        spawn(run_peer, n=options.peers, timeout=options.timeout, topology=options.topology,
              args=(dataset, config), peer_timeout=_PEER_TIMEOUT_S, preload=_PRELOAD,
              **_link(options))
        return {}
    deadline = time.monotonic() + options.timeout
    fates = {}
    for name in options.policies:
        single = dataclasses.replace(config, policies=(name,), baseline=False)
        fates[name] = _launch_killing(options, dataset, single, deadline)
    if options.baseline:
        spawn(run_baseline, n=1, timeout=_remaining(options, deadline),
              args=(dataset, dataclasses.replace(config, policies=()), options.peers),
              peer_timeout=_PEER_TIMEOUT_S)
    return fates


def _link(options: DemoOptions) -> dict:
    """gossip.init's ``link=`` for the peers under --link (the baseline is one process)."""
    return {"link": options.link} if options.link else {}


def _remaining(options: DemoOptions, deadline: float) -> float:
    from gossip.testing import SpawnTimeout

    left = deadline - time.monotonic()
    if left <= 0:
        raise SpawnTimeout(f"spawned peers did not finish within {options.timeout:g}s", [])
    return left


def _launch_killing(options: DemoOptions, dataset: Dataset, config: TrainConfig,
                    deadline: float) -> dict:
    """One policy's group under --kill: the killed slot is started again once (and may
    fail: a refused restart), the others must finish. Returns the restarted process's fate
    ({"status": rejoined | refused | failed | stopped, "detail": why}), or the group's
    ({"status": "others failed", ...}) if another peer failed."""
    from gossip.testing import SpawnError, SpawnTimeout, spawn_outcomes

    if options.kill is None:
        raise ValueError("a group under --kill needs options.kill")
    name, victim = config.policies[0], options.kill.rank
    try:
        outcomes = spawn_outcomes(run_peer, n=options.peers,
                                  timeout=_remaining(options, deadline),
                                  topology=options.topology, args=(dataset, config),
                                  peer_timeout=_PEER_TIMEOUT_S, restarts={victim: 1},
                                  tolerate={victim}, tolerated_grace=_REJOIN_GRACE_S,
                                  preload=_PRELOAD, **_link(options))
    except SpawnTimeout:
        raise
    except SpawnError as exc:
        log = os.path.join(options.out, f"failure-{name}.log")
        with open(log, "w") as f:
            f.write(str(exc) + "\n")
        failed = [o for o in exc.outcomes if o.status == "error" and o.rank != victim]
        cause = _cause(failed[0]) if failed else str(exc).splitlines()[0]
        return {"status": "others failed", "detail": f"{cause} (details: {log})"}
    o = outcomes[victim]
    if not o.earlier:
        return {"status": "not killed", "detail": "the peer finished before its kill step"}
    if o.status == "ok":
        return {"status": "rejoined", "detail": ""}
    if o.status == "stopped":
        return {"status": "stopped", "detail": "started again, but not back before the "
                                               "others finished"}
    cause = _cause(o)
    refused = re.search(r"refused by the member at \S+: (.*)", cause)
    if refused:
        return {"status": "refused", "detail": refused.group(1)}
    return {"status": "failed", "detail": cause or f"exit code {o.exitcode}"}


def _record(records_dir: str, name: str, options: DemoOptions, fate: dict | None) -> dict:
    """The policy's record (records.collect) with, under --kill, its ``restart``: the
    killed peer's fate, the step it died after and, if it came back, the step it came back
    at, the seconds from its death to then and the state it took."""
    record = collect(records_dir, name, options.peers)
    if fate is None or options.kill is None:   # (a fate is a killed peer's)
        return record
    slot = record["slots"].get(options.kill.rank, {})
    killed, joined = slot.get("killed"), slot.get("joined")
    restart = {"rank": options.kill.rank, "status": fate["status"], "detail": fate["detail"],
               "killed_at_step": killed["step"] if killed else None,
               "rejoined_at_step": None, "rejoin_seconds": None, "state_bytes": None}
    if fate["status"] == "rejoined" and joined and killed:
        restart.update(rejoined_at_step=joined["step"],
                       rejoin_seconds=joined["wall"] - killed["wall"],
                       state_bytes=joined["state_bytes"])
    record["restart"] = restart
    if fate["status"] == "others failed":
        record["failed"] = fate["detail"]
    return record


def _cause(outcome) -> str:
    """The last line of a peer's traceback: the exception and its message."""
    lines = [ln.strip() for ln in (outcome.error or "").strip().splitlines() if ln.strip()]
    return lines[-1] if lines else ""


def _failure(exc: Exception, policy: str | None, options: DemoOptions) -> Exception:
    """A one-line DemoFailed for a failed spawn (details to OUT/failure.log), or ``exc``
    itself when it is not about the peers."""
    from gossip.testing import SpawnError, SpawnTimeout

    if not isinstance(exc, SpawnError):
        return exc
    during = f" while training {policy}" if policy else " while starting"
    log = os.path.join(options.out, "failure.log")
    try:
        with open(log, "w") as f:
            f.write(str(exc) + "\n")
        details = f"; every peer's traceback and output: {log}"
    except OSError:
        details = ""
    if isinstance(exc, SpawnTimeout):
        return DemoFailed(f"the peers did not finish within the {options.timeout:g} s "
                          f"deadline{during}; stopped them{details}")
    outcomes = exc.outcomes
    # The root cause first: a peer that died, then one whose error is not merely the
    # consequence of another's death (PeerLost, timeouts), then any.
    died = [o for o in outcomes if o.status == "died"]
    errors = [o for o in outcomes if o.status == "error"]
    primary = [o for o in errors if not any(k in _cause(o) for k in (
        "PeerLost", "OperationTimeout", "SpawnError"))]
    if died:
        o = died[0]
        what = f"peer {o.rank} died (exit code {o.exitcode})"
    elif primary or errors:
        o = (primary or errors)[0]
        what = f"peer {o.rank} failed: {_cause(o)}"
    else:
        what = str(exc).splitlines()[0]
    return DemoFailed(f"{what}{during}; the other peers were stopped{details}")
