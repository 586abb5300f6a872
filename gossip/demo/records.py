"""What each peer of the demo records while it trains, and how the launching process puts the
peers' records together into one record per policy.

    records = PeerRecords(directory, "gossip", slot=2, incarnation=0)   # in a peer
    records.evaluation({"step": 40, "accuracy": 0.93, ...}, flat_parameters)
    record = collect(directory, "gossip", slots=4)                      # in the launcher

A peer appends JSON lines to DIR/<policy>/slot<S>.jsonl and, at each evaluation, saves its
parameters as DIR/<policy>/slot<S>-<step>.npy; the process that takes a slot over after a
restart appends to the same file. Files, not collectives: a diagnostic that is a collective
waits on a dead peer (and makes peers meet that the policy lets run apart), and what a
process wrote before a SIGKILL is still there. The launcher averages the peers' accuracy and
losses at each step and computes the consensus distance from the saved parameters (the peers'
mean distance to their average, as Policy.consensus_distance does, in float64).
"""
from __future__ import annotations

import json
import math
import os
from typing import Any

import numpy as np

__all__ = ["PeerRecords", "collect", "records_of", "finished_runs", "finished_training"]


def _policy_dir(directory: str, policy: str) -> str:
    return os.path.join(directory, policy)


def _snapshot(directory: str, policy: str, slot: int, step: int) -> str:
    return os.path.join(_policy_dir(directory, policy), f"slot{slot}-{step}.npy")


class PeerRecords:
    """One process's records of one policy (line-buffered: each line is in the file as soon
    as it is written, so a SIGKILL loses none)."""

    def __init__(self, directory: str, policy: str, slot: int, incarnation: int) -> None:
        self.directory, self.policy, self.slot = directory, policy, slot
        self.incarnation = incarnation
        os.makedirs(_policy_dir(directory, policy), exist_ok=True)
        path = os.path.join(_policy_dir(directory, policy), f"slot{slot}.jsonl")
        self._file = open(path, "a", buffering=1)

    def write(self, kind: str, **fields: Any) -> None:
        """One line: ``kind`` (eval, joined, killed, done) and ``fields``."""
        self._file.write(json.dumps({"kind": kind, "inc": self.incarnation, **fields}) + "\n")

    def evaluation(self, point: dict, parameters: np.ndarray | None) -> None:
        """An evaluation ``point`` (step, epoch, time, accuracy, test_loss, train_loss) and the
        parameters it was made with (None: no consensus, the one-process baseline)."""
        if parameters is not None:
            np.save(_snapshot(self.directory, self.policy, self.slot, point["step"]),
                    parameters)
        self.write("eval", **point)

    def close(self) -> None:
        self._file.close()


def records_of(directory: str, policy: str, slot: int) -> list[dict]:
    """The lines slot ``slot`` wrote for ``policy`` (none if it wrote nothing)."""
    path = os.path.join(_policy_dir(directory, policy), f"slot{slot}.jsonl")
    try:
        with open(path) as f:
            lines = f.read().splitlines()
    except FileNotFoundError:
        return []
    out = []
    for line in lines:
        try:
            out.append(json.loads(line))
        except ValueError:
            pass  # a torn line (a full disk) is left out, as the progress reader does
    return out


def finished_training(directory: str, policy: str, slots: int) -> int:
    """How many processes wrote that they finished training ``policy`` (a "finished" line:
    one per process that got there; a killed one never does)."""
    return sum(1 for slot in range(slots) for line in records_of(directory, policy, slot)
               if line.get("kind") == "finished")


def _mean(values: list[float]) -> float:
    finite = [v for v in values if v is not None and math.isfinite(v)]
    return sum(finite) / len(finite) if finite else float("nan")


def _mean_and_consensus(directory: str, policy: str,
                        at: list[tuple[int, int]]) -> tuple[np.ndarray, float]:
    """The peers' average parameters, each (slot, step) of ``at`` as saved at that step, and
    their mean distance to it."""
    arrays = [np.load(_snapshot(directory, policy, s, step)).astype(np.float64)
              for s, step in at]
    mean = np.mean(arrays, axis=0)
    return mean, float(np.mean([np.linalg.norm(a - mean) for a in arrays]))


def collect(directory: str, policy: str, slots: int, *, consensus: bool = True) -> dict:
    """One record of ``policy`` from the records of its ``slots`` peers: ``history`` (one
    point per evaluation, the peers' k-th together: accuracy and losses averaged over the
    peers that evaluated it, ``peers`` of them, the consensus distance among them and their
    average (``averaged_parameters``, with ``consensus``), and the
    time on the clock of the slowest peer that trained the whole run in one process),
    ``train_seconds`` and ``wall_seconds`` (the slowest such peer's), ``samples`` (every
    process's), ``bytes_per_peer`` (per slot, its processes' together), ``steps``,
    ``parameters``, and per slot the ``killed`` and ``joined`` lines (a peer killed and
    started again) and whether it finished (``done``)."""
    lines = {s: records_of(directory, policy, s) for s in range(slots)}
    done = {s: [r for r in ls if r["kind"] == "done"] for s, ls in lines.items()}
    # A slot trained the whole run in one process: one start, finished, never killed.
    whole = [s for s, ls in lines.items()
             if done[s] and not any(r["kind"] == "killed" for r in ls)
             and len({r["inc"] for r in ls}) == 1]
    # The k-th evaluations of all peers are one point (loop.py: at the same step on every
    # peer, or, where the peers split the steps by speed, at about the same time).
    by_index: dict[int, list[tuple[int, dict]]] = {}
    for s, ls in lines.items():
        latest: dict[int, dict] = {}   # a point evaluated again (train._end_together): the later
        for r in ls:
            if r["kind"] == "eval":
                latest[r["index"]] = r
        for index, r in latest.items():
            by_index.setdefault(index, []).append((s, r))
    history = []
    for index in sorted(by_index):
        group = by_index[index]
        clocks = [r["time"] for s, r in group if s in whole] or [r["time"] for _, r in group]
        history.append({
            "time": max(clocks), "step": max(r["step"] for _, r in group),
            "epoch": max(r["epoch"] for _, r in group), "index": index,
            "accuracy": _mean([r["accuracy"] for _, r in group]),
            "worst_accuracy": min((r["accuracy"] for _, r in group), default=float("nan")),
            "test_loss": _mean([r["test_loss"] for _, r in group]),
            "train_loss": _mean([r["train_loss"] for _, r in group]),
            "consensus": None,
            "peers": len(group),
        })
    for point in history if consensus else ():
        # The average at each point (the runner evaluates it, then drops the array; the last
        # one's is the run's "avg model"): what a final allreduce would give at that time,
        # the deliverable of elastic and asynchronous, whose peers' own models are not meant
        # to agree while they train.
        point["averaged_parameters"], point["consensus"] = _mean_and_consensus(
            directory, policy, [(s, r["step"]) for s, r in by_index[point["index"]]])
    finals = [d[-1] for d in done.values() if d]
    ends = [r for s, ls in lines.items() for r in ls if r["kind"] in ("done", "killed")]
    sent = [sum(r.get("bytes_sent", 0) for r in ls if r["kind"] in ("done", "killed"))
            for ls in lines.values() if ls]
    timing = [done[s][-1] for s in whole] or finals
    return {
        "policy": policy,
        "peers": slots,
        "history": history,
        "steps": max((r["steps"] for r in finals), default=0),
        "samples": sum(r.get("samples", 0) for r in ends),
        "train_seconds": max((r["train_seconds"] for r in timing), default=0.0),
        "wall_seconds": max((r["wall_seconds"] for r in timing), default=0.0),
        "bytes_per_peer": sum(sent) / len(sent) if sent else 0.0,
        "parameters": next((r["parameters"] for r in finals), None),
        "slots": {s: {"killed": next((r for r in ls if r["kind"] == "killed"), None),
                      "joined": next((r for r in ls if r["kind"] == "joined"), None),
                      "done": bool(done[s])}
                  for s, ls in lines.items()},
        # Per slot, the policy's own counters at the end (train._mixing_counters).
        "mixing": {s: done[s][-1].get("mixing") for s in lines if done[s]},
    }


def finished_runs(directory: str, runs: list[tuple[str, int]]) -> list[dict]:
    """The records (collect's) of those ``runs`` (policy, peers) every peer of which
    finished: what a Ctrl-C keeps. The baseline's consensus is not computed (one peer)."""
    out = []
    for policy, slots in runs:
        try:
            record = collect(directory, policy, slots, consensus=slots > 1)
        except (OSError, ValueError, KeyError):
            continue
        states = [slot.get("done") for slot in record.get("slots", {}).values()]
        if len(states) == slots and all(states):
            out.append(record)
    return out
