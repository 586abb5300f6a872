"""One peer of a multi-host test (tests/launch/test_netns.py), run inside a host's network
namespace:

    ip netns exec NS python tests/launch/workers/netfault_worker.py   # GOSSIP_*, NETFAULT_* set

It trains softmax regression (a convex problem, so accuracy is well defined and runs agree)
on its shard of the digits data set with one averaging policy, then writes a JSON result
(accuracy, step times, which peers it found lost and when, the error that ended it) to
``$NETFAULT_DIR/result.<rank>.json``.

Control, by files in $NETFAULT_DIR (the test and the workers share the file system, not the
network): at step ``pause_at`` a worker writes ``paused.<rank>`` and waits for ``go``, so a
fault is injected at the same step everywhere; ``go`` holds the time.monotonic() of the fault
(the clock is the machine's, shared by every namespace).
"""
from __future__ import annotations

import json
import os
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__))))))   # the repository

import gossip  # noqa: E402
from gossip.errors import GossipError, PeerLost  # noqa: E402
from gossip.policies import make  # noqa: E402
from gossip.testing import wait_until  # noqa: E402

CLASSES = 10


def softmax_grad(w: np.ndarray, x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """Gradient of the mean cross-entropy of softmax regression; ``w`` is (features+1, 10)
    flattened, the last row the bias."""
    feats = x.shape[1]
    W = w.reshape(feats + 1, CLASSES)
    logits = x @ W[:-1] + W[-1]
    logits -= logits.max(axis=1, keepdims=True)
    p = np.exp(logits)
    p /= p.sum(axis=1, keepdims=True)
    p[np.arange(len(y)), y] -= 1.0
    p /= len(y)
    return np.concatenate([(x.T @ p).ravel(), p.sum(axis=0)])


def accuracy(w: np.ndarray, x: np.ndarray, y: np.ndarray) -> float:
    W = w.reshape(x.shape[1] + 1, CLASSES)
    return float(((x @ W[:-1] + W[-1]).argmax(axis=1) == y).mean() * 100.0)


def write_json(path: str, obj: dict) -> None:
    tmp = f"{path}.tmp"
    with open(tmp, "w") as f:
        json.dump(obj, f, default=str)
    os.replace(tmp, path)


def main() -> int:
    cfg = json.loads(os.environ["NETFAULT_CONFIG"])
    ctl = os.environ["NETFAULT_DIR"]
    start = time.monotonic()
    peer = gossip.init()
    rank, n = peer.rank, peer.world_size
    result: dict = {
        "rank": rank, "init_seconds": time.monotonic() - start,
        "addresses": {r: peer.transport.address(r) for r in range(n) if r != rank},
        "endpoints": {k: v for k, v in peer.transport.endpoints.items() if k != "shm"},
        "error": None, "lost": {}, "detected_at": {}, "detected_step": {}, "steps_done": 0,
    }
    data = np.load(cfg["data"])
    x, y = data["x_train"][rank::n], data["y_train"][rank::n]
    w = np.zeros((x.shape[1] + 1) * CLASSES)
    policy = make(cfg["policy"], **cfg.get("policy_kwargs", {})).attach(peer, [w])
    rng = np.random.default_rng(1000 + rank)
    victim = cfg.get("victim")
    step_times = []
    fault_time = None
    try:
        for step in range(cfg["steps"]):
            if step == cfg.get("pause_at"):
                write_json(os.path.join(ctl, f"paused.{rank}"), {"t": time.monotonic()})
                go = os.path.join(ctl, "go")
                wait_until(lambda: os.path.exists(go), cfg.get("pause_timeout", 60),
                           what="the test's go file")
                fault_time = json.load(open(go)).get("fault_time")
            t0 = time.perf_counter()
            batch = rng.integers(0, len(y), cfg["batch"])
            w -= cfg["lr"] * softmax_grad(w, x[batch], y[batch])
            if cfg.get("compute_seconds"):
                # Stands in for a real model's forward and backward: a policy whose loop never
                # waits (asynchronous) would otherwise finish before a fault is noticed.
                time.sleep(cfg["compute_seconds"])
            policy.after_step()
            step_times.append(time.perf_counter() - t0)
            result["steps_done"] = step + 1
            for r in peer.lost_peers():
                if str(r) not in result["detected_at"]:
                    result["detected_at"][str(r)] = time.monotonic()
                    result["detected_step"][str(r)] = step
            if step == cfg.get("mark_at"):
                write_json(os.path.join(ctl, f"reached.{rank}"), {"t": time.monotonic()})
        if victim is not None and rank != victim:
            # A peer that talks to the victim notices over that connection; give it the
            # timeout to do so (after the steps, where the asynchronous policy may be).
            # The asynchronous policy also drops from its rotation a neighbour it never
            # reached (a push that timed out), without the transport declaring it lost.
            def noticed() -> bool:
                return (victim in peer.lost_peers()
                        or victim in policy.stats().get("dropped_peers", ()))
            try:
                wait_until(noticed, peer.timeout + 2, what=f"rank {victim} declared lost")
            except TimeoutError:
                pass
            if noticed():
                result["detected_at"].setdefault(str(victim), time.monotonic())
            for r in peer.lost_peers():
                result["detected_at"].setdefault(str(r), time.monotonic())
    except GossipError as exc:
        result["error"] = {"type": type(exc).__name__, "message": str(exc),
                           "rank": getattr(exc, "rank", None),
                           "operation": getattr(exc, "operation", None),
                           "at": time.monotonic(), "is_peer_lost": isinstance(exc, PeerLost)}
    if cfg.get("fault_time_file"):
        path = os.path.join(ctl, cfg["fault_time_file"])
        if os.path.exists(path):
            fault_time = json.load(open(path))["fault_time"]
    result["fault_time"] = fault_time
    result["lost"] = {str(r): why for r, why in peer.lost_peers().items()}
    result["accuracy"] = accuracy(w, data["x_test"], data["y_test"])
    result["step_times"] = step_times
    result["stats"] = {k: v for k, v in policy.stats().items()
                       if isinstance(v, (int, float, str, list, dict))}
    t0 = result["finished_at"] = time.monotonic()
    policy.close()
    peer.close()
    result["close_seconds"] = time.monotonic() - t0
    write_json(os.path.join(ctl, f"result.{rank}.json"), result)
    return 0


if __name__ == "__main__":
    sys.exit(main())
