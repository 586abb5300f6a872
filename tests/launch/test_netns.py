"""Real network faults between hosts: four network namespaces on one bridge (tests/netfault.py),
one peer per namespace (tests/launch/workers/netfault_worker.py) talking tcp, and faults made
by the kernel or by a relay, not by the runtime's own code.

- A host's cable pulled mid-training (its bridge port set down): gossip-family policies drop
  it within the timeout and finish within 2 accuracy points of a run without the fault;
  Synchronous fails on every survivor with PeerLost naming the cut rank within timeout + 2 s.
- Latency (a user-space relay on every host adds DELAY to each byte it receives) and packet
  loss (the switch drops packets at random): training completes and converges.

The peers see each other as different machines: each namespace has its own host identity
(collectives.transport.host_id includes the network namespace), so the transport's "auto"
choice is tcp between them, never ipc or shared memory; every test checks the addresses.
Needs root and `ip netns`; skips otherwise.
"""
from __future__ import annotations

import json
import os
import statistics
import sys
import time

import numpy as np
import pytest

from gossip.testing import wait_until

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))   # tests/
import netfault  # noqa: E402

WORKER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "workers",
                      "netfault_worker.py")
REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
HOSTS = 4
VICTIM = 3
STEPS = 200
PAUSE_AT = 60            # the step at which faults are injected
TIMEOUT = 4.0            # GOSSIP_TIMEOUT of the cut tests: heartbeats declare loss in 2 s
SLACK = 2.0              # "within timeout + 2 s", as the issue asks
MASTER_PORT = 29500      # each run has its own namespaces: no port can collide
TRAIN = {"batch": 32, "lr": 1.0}
ACCURACY_POINTS = 2.0


@pytest.fixture(scope="module")
def netns_ok():
    reason = netfault.netns_unavailable()
    if reason:
        pytest.skip(reason)


@pytest.fixture(scope="module")
def digits(tmp_path_factory):
    """The digits data set, split once, as a file the workers load (they never import
    sklearn: it costs a second of start-up per peer)."""
    datasets = pytest.importorskip("sklearn.datasets")
    d = datasets.load_digits()
    order = np.random.default_rng(0).permutation(len(d.target))
    x, y = d.data[order] / 16.0, d.target[order]
    path = str(tmp_path_factory.mktemp("digits") / "digits.npz")
    np.savez(path, x_train=x[:1297], y_train=y[:1297], x_test=x[1297:], y_test=y[1297:])
    return path


@pytest.fixture
def network(netns_ok):
    with netfault.Network(HOSTS) as net:
        yield net


_baselines: dict = {}


def train(net, tmp_path, digits, policy, *, policy_kwargs=None, steps=STEPS, fault=None,
          inflight=False, victim=None, timeout=TIMEOUT, proxied=False, deadline=90.0,
          compute=0.0, label="run"):
    """Train on every host; ``fault()`` (which returns the fault's time.monotonic()) runs while
    every peer waits at step PAUSE_AT, or (``inflight``) as soon as the victim has reached
    PAUSE_AT, while the others keep training. Returns {rank: result} for every peer (the
    victim's only if it wrote one before the survivors finished)."""
    ctl = tmp_path / label
    ctl.mkdir()
    cfg = {"policy": policy, "policy_kwargs": policy_kwargs or {}, "steps": steps,
           "pause_at": PAUSE_AT if fault and not inflight else None,
           "mark_at": PAUSE_AT if inflight else None,
           "fault_time_file": "cut" if inflight else None,
           "victim": victim, "data": digits, "compute_seconds": compute, **TRAIN}
    procs = {}
    for host in net.hosts:
        env = dict(os.environ, GOSSIP_RANK=str(host.index), GOSSIP_WORLD_SIZE=str(HOSTS),
                   GOSSIP_MASTER_ADDR=net.hosts[0].addr, GOSSIP_MASTER_PORT=str(MASTER_PORT),
                   GOSSIP_TIMEOUT=str(timeout), GOSSIP_TOPOLOGY="complete",
                   NETFAULT_CONFIG=json.dumps(cfg), NETFAULT_DIR=str(ctl),
                   PYTHONPATH=REPO, PYTHONUNBUFFERED="1")
        env.pop("GOSSIP_TRANSPORT", None)   # "auto": the transport must find tcp itself
        if proxied:
            env["GOSSIP_BIND_HOST"] = "127.0.0.1"   # reachable only through the relay
        procs[host.index] = net.run(host, [sys.executable, WORKER], env,
                                    log_path=str(ctl / f"log.{host.index}"))

    def logs() -> str:
        out = []
        for r, p in procs.items():
            text = (ctl / f"log.{r}").read_text(errors="replace")[-3000:]
            out.append(f"--- rank {r} (exit {p.poll()}) ---\n{text}")
        return "\n".join(out)

    def failed() -> list:
        return [r for r, p in procs.items()
                if p.poll() not in (None, 0) and r != victim]

    end = time.monotonic() + deadline
    fault_time = None
    if fault is not None and inflight:
        try:
            wait_until(lambda: failed() or (ctl / f"reached.{victim}").exists(),
                       end - time.monotonic(), interval=0.005,
                       what=f"rank {victim} at step {PAUSE_AT}")
        except TimeoutError:
            pytest.fail(f"{label}: rank {victim} never reached step {PAUSE_AT}\n{logs()}")
        fault_time = fault()
        tmp = ctl / "cut.tmp"
        tmp.write_text(json.dumps({"fault_time": fault_time}))
        os.replace(tmp, ctl / "cut")
    elif fault is not None:
        try:
            wait_until(lambda: failed() or all((ctl / f"paused.{r}").exists() for r in procs),
                       end - time.monotonic(), what="every peer at the fault step")
        except TimeoutError:
            pytest.fail(f"{label}: peers never reached step {PAUSE_AT}\n{logs()}")
        if failed():
            pytest.fail(f"{label}: ranks {failed()} failed before the fault\n{logs()}")
        fault_time = fault()
        tmp = ctl / "go.tmp"
        tmp.write_text(json.dumps({"fault_time": fault_time}))
        os.replace(tmp, ctl / "go")
    else:
        (ctl / "go").write_text("{}")
    survivors = [r for r in procs if r != victim]
    try:
        wait_until(lambda: failed() or all(procs[r].poll() is not None for r in survivors),
                   max(1.0, end - time.monotonic()), interval=0.05,
                   what="the survivors' end")
    except TimeoutError:
        pytest.fail(f"{label}: survivors did not finish within {deadline}s\n{logs()}")
    if failed():
        pytest.fail(f"{label}: ranks {failed()} exited with an error\n{logs()}")
    results = {}
    for r in procs:
        path = ctl / f"result.{r}.json"
        if path.exists():
            results[r] = json.loads(path.read_text())
        elif r != victim:
            pytest.fail(f"{label}: rank {r} wrote no result\n{logs()}")
    for r, res in results.items():   # tcp between the hosts, never ipc or shm
        for other, addr in res["addresses"].items():
            assert addr.startswith("tcp://10.77.0."), (r, other, addr)
    return results


def median_step(results, ranks, start=0, stop=None) -> float:
    return statistics.median(t for r in ranks for t in results[r]["step_times"][start:stop])


def summary(results) -> str:
    return "; ".join(f"rank {r}: {res['accuracy']:.1f}% steps {res['steps_done']} "
                     f"lost {sorted(res['lost'])} error {res['error'] and res['error']['type']}"
                     for r, res in sorted(results.items()))


def report(request, text: str) -> None:
    """Figures for the log (shown with -rA or -s); never asserted on except where noted."""
    print(f"\n[{request.node.name}] {text}")


def baseline(net, tmp_path, digits, policy, **kwargs):
    """The run without a fault, once per module and policy."""
    key = (policy, json.dumps(kwargs.get("policy_kwargs"), sort_keys=True),
           kwargs.get("compute", 0.0))
    if key not in _baselines:
        _baselines[key] = train(net, tmp_path, digits, policy, label=f"baseline-{policy}",
                                **kwargs)
    return _baselines[key]


def check_converged(faulted, reference, ranks, what):
    ref = statistics.mean(reference[r]["accuracy"] for r in reference)
    for r in ranks:
        assert faulted[r]["steps_done"] == STEPS, (what, r, summary(faulted))
        assert faulted[r]["accuracy"] >= ref - ACCURACY_POINTS, \
            (what, f"reference mean {ref:.1f}%", summary(faulted))


# ---------------------------------------------------------------------------- the tests
def test_training_across_hosts_is_tcp_and_converges(network, tmp_path, digits, request):
    out = baseline(network, tmp_path, digits, "gossip")
    no_false_loss(out, "gossip without fault")
    for r, res in out.items():
        assert res["error"] is None and res["steps_done"] == STEPS, summary(out)
        assert res["accuracy"] > 90.0, summary(out)
        assert res["endpoints"]["host"] != out[(r + 1) % HOSTS]["endpoints"]["host"]
    report(request, f"gossip baseline: {summary(out)}; median step "
                    f"{median_step(out, out) * 1e3:.2f} ms; transport tcp: {out[0]['addresses']}")


def no_false_loss(out, what, victim=None):
    """Nobody (but the victim) was declared lost before it finished training and closed."""
    for r, res in out.items():
        if r == victim:
            continue
        early = {p: (res["detected_step"].get(p), res["lost"].get(p))
                 for p, t in res["detected_at"].items()
                 if int(p) != victim and (int(p) not in out or t < out[int(p)]["finished_at"])}
        assert not early, (what, f"rank {r} lost", early)


# Seconds of simulated compute per step: the asynchronous loop never waits on the network,
# so without it the survivors would finish before the cut could be noticed.
COMPUTE = {"asynchronous": 0.02}


@pytest.mark.parametrize("policy,side,inflight", [
    ("gossip", "switch", False),
    pytest.param("gossip", "host", False, marks=pytest.mark.slow),
    pytest.param("gossip", "switch", True, marks=pytest.mark.slow),
    pytest.param("push-sum", "switch", False, marks=pytest.mark.slow),
    pytest.param("asynchronous", "switch", False, marks=pytest.mark.slow),
    pytest.param("asynchronous", "switch", True, marks=pytest.mark.slow),
])
def test_a_cut_host_is_dropped_and_training_converges(network, tmp_path, digits, request,
                                                      policy, side, inflight):
    """side: which end of the host's cable goes down (the switch port, or the host's eth0);
    inflight: cut while the others train (else while every peer waits at step PAUSE_AT)."""
    kwargs, compute = {}, COMPUTE.get(policy, 0.0)
    reference = baseline(network, tmp_path, digits, policy, policy_kwargs=kwargs,
                         compute=compute)
    out = train(network, tmp_path, digits, policy, policy_kwargs=kwargs, victim=VICTIM,
                compute=compute,
                fault=lambda: network.cut(network.hosts[VICTIM], side=side),
                inflight=inflight, label=f"cut-{policy}")
    survivors = [r for r in range(HOSTS) if r != VICTIM]
    detection = {}
    for r in survivors:
        res = out[r]
        assert res["error"] is None, summary(out)
        if str(VICTIM) in res["detected_at"]:
            detection[r] = res["detected_at"][str(VICTIM)] - res["fault_time"]
    check_converged(out, reference, survivors, f"{policy} with host {VICTIM} cut")
    no_false_loss(reference, f"{policy} without fault")
    no_false_loss(out, f"{policy} with host {VICTIM} cut", victim=VICTIM)
    if policy == "asynchronous":
        # A survivor notices only over a connection it has with the victim; the background
        # thread of one starved of CPU may have made none yet: at least one notices.
        assert detection, summary(out)
    else:
        # Every survivor talks to every other (complete graph; push-sum's one-peer
        # exponential graph reaches rank 3 from each of 0, 1, 2), so each must notice.
        assert set(detection) == set(survivors), (detection, summary(out))
    for r, seconds in detection.items():
        assert seconds <= TIMEOUT + SLACK, (r, seconds)
    # Noticed while training, not after it (the fault came PAUSE_AT steps in, or later).
    noticed_at_step = {r: out[r]["detected_step"].get(str(VICTIM)) for r in detection}
    assert any(s is not None and s < STEPS - 1 for s in noticed_at_step.values()), \
        (noticed_at_step, summary(out))
    report(request, f"{policy}, cut at the {side} side, "
                    f"{'in flight' if inflight else 'at a pause'}: detection after the cut (s) "
                    f"{ {r: round(s, 2) for r, s in detection.items()} } at steps "
                    f"{noticed_at_step}; slowest step after the cut "
                    f"{max(t for r in survivors for t in out[r]['step_times'][PAUSE_AT:]):.2f} s; "
                    f"accuracy without "
                    f"fault {summary(reference)} | with {summary(out)}; median step after the "
                    f"cut {median_step(out, survivors, PAUSE_AT + 5) * 1e3:.2f} ms vs "
                    f"{median_step(reference, survivors, PAUSE_AT + 5) * 1e3:.2f} ms")


@pytest.mark.parametrize("inflight", [False, pytest.param(True, marks=pytest.mark.slow)])
def test_synchronous_survivors_raise_peer_lost_naming_the_cut_host(network, tmp_path, digits,
                                                                    request, inflight):
    out = train(network, tmp_path, digits, "synchronous", victim=VICTIM, inflight=inflight,
                fault=lambda: network.cut(network.hosts[VICTIM]), label="cut-synchronous")
    took = {}
    for r in (r for r in range(HOSTS) if r != VICTIM):
        err = out[r]["error"]
        assert err is not None and err["is_peer_lost"], (r, err, summary(out))
        assert err["rank"] == VICTIM, (r, err)
        assert f"rank {VICTIM}" in err["message"], (r, err)
        took[r] = err["at"] - out[r]["fault_time"]
        if not inflight:
            assert out[r]["steps_done"] == PAUSE_AT, (r, out[r]["steps_done"])
    for r, seconds in took.items():
        assert seconds <= TIMEOUT + SLACK, (r, seconds, took)
    report(request, f"synchronous, {'in flight' if inflight else 'at a pause'}: steps done "
                    f"{ {r: out[r]['steps_done'] for r in took} }; PeerLost after the cut (s) "
                    f"{ {r: round(s, 2) for r, s in took.items()} }; messages "
                    f"{ {r: out[r]['error']['message'] for r in took} }")


DELAY = 0.01   # seconds the relay adds to each byte a host receives


@pytest.mark.parametrize("stalls", [0.0, pytest.param(0.01, marks=pytest.mark.slow)])
def test_gossip_converges_over_slow_links(network, tmp_path, digits, request, stalls):
    reference = baseline(network, tmp_path, digits, "gossip")
    proxies = network.start_delay_proxies(delay=DELAY, stall_probability=stalls, stall=0.2,
                                          log_dir=str(tmp_path))
    out = train(network, tmp_path, digits, "gossip", proxied=True, timeout=10.0,
                label="delay")
    assert all(p.poll() is None for p in proxies), "a relay died"
    no_false_loss(out, f"gossip with {DELAY}s latency")
    for r, res in out.items():
        assert res["error"] is None, summary(out)
    check_converged(out, reference, range(HOSTS), f"gossip with {DELAY}s latency")
    slow, fast = median_step(out, out), median_step(reference, reference)
    # Each round waits for the neighbours' messages, which now arrive DELAY late (a figure
    # the relay guarantees, not a timing of this machine): proof the traffic went through it.
    assert slow >= DELAY, (slow, fast)
    report(request, f"gossip, {DELAY * 1e3:.0f} ms latency, stalls {stalls}: median step "
                    f"{slow * 1e3:.2f} ms vs {fast * 1e3:.2f} ms without; {summary(out)}")


LOSS = 0.05


@pytest.mark.slow   # 5-10 s; the default run keeps the cut-host and slow-link netns tests
def test_gossip_converges_with_packet_loss(network, tmp_path, digits, request):
    reference = baseline(network, tmp_path, digits, "gossip")
    network.set_loss(LOSS)
    out = train(network, tmp_path, digits, "gossip", timeout=10.0, label="loss")
    dropped = network.dropped_packets()
    assert sum(dropped.values()) > 0, dropped
    no_false_loss(out, f"gossip with {LOSS:.0%} packet loss")
    for r, res in out.items():
        assert res["error"] is None, summary(out)
    check_converged(out, reference, range(HOSTS), f"gossip with {LOSS:.0%} packet loss")
    mean = statistics.mean(t for r in out for t in out[r]["step_times"])
    report(request, f"gossip, {LOSS:.0%} loss: median step {median_step(out, out) * 1e3:.2f} ms "
                    f"(mean {mean * 1e3:.2f}) "
                    f"vs {median_step(reference, reference) * 1e3:.2f} ms without; dropped "
                    f"{dropped}; {summary(out)}")
