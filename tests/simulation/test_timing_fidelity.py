"""The simulator's clock against real peers on shaped links (issue #38, item 4): four network
namespaces (tests/netfault.py), every directed pair of hosts a link of its own shaped by tc
(htb, 100 Mbit/s), one real peer per host running the loop every simulated peer runs
(gossip.simulation.train_peer, tests/simulation/workers/timing_worker.py); then the simulator
runs the same TrainingSpec over "100mbit,0ms" links; then the same with a round trip of 20 ms
on the wire (each host's cable two taps joined by a user-space process holding every frame
5 ms each way, ``Network(wire_delay=)``) against "100mbit,10ms". The communication of a synchronous step
(the gradients' allreduce), of a gossip step (a ring round: each peer sends its parameters to
both neighbours and hears from both) and of a DiLoCo outer step (local SGD's average of the
parameters and the outer Nesterov step) must take within 20% of the real time.

The hosts' TCP congestion control is reno (netfault.Network.congestion), TCP's classic
loss-based control, which fills a link as the simulator's model assumes. A namespace otherwise
takes the machine's default, and under BBR (the default on some machines, this one included)
a gossip round, with both directions of every link busy at once, takes 1.2-1.7x what its
bytes need at iperf3's rate, no packet lost (BBR paces by the rate its acknowledgements show,
and those of one direction queue behind the other direction's data); the allreduce, one way a
link, is the same under either.

The real compute is measured in the same run: DiLoCo's local steps communicate nothing, so
their time is the step's compute, which the simulator is then given (step_seconds). The model
is the digits MLP widened to 8,192 hidden units (614,410 parameters, 2.46 MB in float32): its
messages take 0.05-0.2 s on these links, its compute a few milliseconds. The kernel here has no
netem qdisc: the latency is the wire's (whose epoll wakes at millisecond steps: each crossing
may hold a frame up to a millisecond more). Needs root and `ip netns` (and /dev/net/tun for
the wire); skips otherwise.
"""
from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys

import pytest

from gossip.testing import wait_until

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))   # tests/
import netfault  # noqa: E402

pytest.importorskip("torch")

HOSTS = 4
RATE = "100mbit"
WIRE_DELAYS = (None, 0.005)   # veth cables; tap cables holding each frame 5 ms each way
HIDDEN = 8192
PERIOD = 4            # DiLoCo's local steps per outer step
WARMUP = 2            # steps left out of the real medians (connections, first allocations)
TOLERANCE = 0.20      # the bound on simulated against real communication time
CONGESTION = "reno"   # the hosts' TCP congestion control (see the module's docstring)
WORKER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "workers", "timing_worker.py")
REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
MASTER_PORT = 29500


@pytest.fixture(scope="module", params=WIRE_DELAYS, ids=["no-latency", "20ms-rtt"])
def shaped(request):
    reason = netfault.netns_unavailable() if request.param is None else \
        netfault.wire_unavailable()
    if reason:
        pytest.skip(reason)
    with netfault.Network(HOSTS, wire_delay=request.param) as net:
        net.shape(RATE)
        net.congestion(CONGESTION)
        yield net


def _link(net) -> str:
    """The simulator's link for ``net``'s: the rate, and one way's latency (two cables)."""
    return f"{RATE},{2 * (net.wire_delay or 0.0) * 1e3:g}ms"


def _spec(policy: str, steps: int, **options) -> dict:
    return {"policy": policy, "peers": HOSTS, "topology": "ring", "steps": steps,
            "hidden": HIDDEN, "batch": 16, "lr": 0.05, "seed": 0, "policy_options": options}


def _real(net, tmp_path, spec: dict, label: str) -> list[list[float]]:
    """Every rank's step start times (time.monotonic()) in a real run of ``spec``."""
    out = tmp_path / label
    out.mkdir()
    procs = {}
    for host in net.hosts:
        env = dict(os.environ, GOSSIP_RANK=str(host.index), GOSSIP_WORLD_SIZE=str(HOSTS),
                   GOSSIP_MASTER_ADDR=net.hosts[0].addr, GOSSIP_MASTER_PORT=str(MASTER_PORT),
                   GOSSIP_TIMEOUT="60", TIMING_SPEC=json.dumps(spec), TIMING_DIR=str(out),
                   PYTHONPATH=REPO, PYTHONUNBUFFERED="1", OMP_NUM_THREADS="1")
        env.pop("GOSSIP_TRANSPORT", None)
        procs[host.index] = net.run(host, [sys.executable, WORKER], env,
                                    log_path=str(out / f"log.{host.index}"))

    def logs() -> str:
        return "\n".join(f"--- rank {r} (exit {p.poll()}) ---\n"
                         + (out / f"log.{r}").read_text(errors="replace")[-3000:]
                         for r, p in procs.items())
    try:
        wait_until(lambda: all(p.poll() is not None for p in procs.values()), 240,
                   interval=0.1, what=f"the real {label} run's end")
    except TimeoutError:
        pytest.fail(f"{label}: the real run did not end within 240 s\n{logs()}")
    if any(p.returncode != 0 for p in procs.values()):
        pytest.fail(f"{label}: a real peer failed\n{logs()}")
    return [json.loads((out / f"result.{r}").read_text())["starts"] for r in range(HOSTS)]


def _durations(starts: list[float]) -> list[float]:
    return [b - a for a, b in zip(starts, starts[1:])]


def _simulated(spec: dict, compute: float, link: str) -> list[float]:
    """The simulated steps' durations (the slowest peer's clock, step to step)."""
    from gossip.simulation import TrainingSpec, simulate_training
    result = simulate_training(TrainingSpec(**spec, link=link, step_seconds=compute))
    clock = result.to_dict()["time"]
    return _durations([0.0] + clock)


def _iperf(net) -> float:
    """iperf3's rate (bits/s) from host 1 to host 0 over the shaped link, 2 s of TCP. The
    client is started again until it has measured: the server says nothing when it listens,
    and iperf3 3.12 exits 0 with ``-J`` even when it could not connect (the JSON then holds an
    ``"error"`` and an empty ``"end"``). A server that took a connection and then failed has
    exited (``-1``), so it is started again too."""
    servers = [net.run(net.hosts[0], ["iperf3", "-s", "-1", "-p", "5201"], dict(os.environ))]
    runs: list = []
    rates: list[float] = []

    def measured() -> bool:
        if servers[-1].poll() is not None:
            servers.append(net.run(net.hosts[0], ["iperf3", "-s", "-1", "-p", "5201"],
                                   dict(os.environ)))
        runs.append(net.ns_exec(net.hosts[1], "iperf3", "-c", net.hosts[0].addr, "-p", "5201",
                                "-t", "2", "-J"))
        try:
            rates.append(float(json.loads(runs[-1].stdout)["end"]["sum_received"]
                               ["bits_per_second"]))
        except (ValueError, KeyError, TypeError):
            return False
        return True
    try:
        wait_until(measured, 30, interval=0.2, what="an iperf3 run between hosts 1 and 0")
    except TimeoutError:
        raise AssertionError(f"iperf3 did not measure in 30 s ({len(runs)} runs); the last "
                             f"printed: {runs[-1].stdout[-500:]} {runs[-1].stderr[-500:]}"
                             ) from None
    finally:
        for server in servers:
            server.kill()
            server.wait()
    return rates[-1]


def test_simulated_communication_time_is_within_20_percent_of_real_peers_on_shaped_links(
        shaped, tmp_path, capsys):
    rate = _iperf(shaped) if subprocess.run(["which", "iperf3"], capture_output=True
                                            ).returncode == 0 else None
    # DiLoCo first: its local steps give the real compute of a step.
    diloco = _spec("local-sgd", 4 * PERIOD, period=PERIOD, outer_optimizer="diloco")
    starts = _real(shaped, tmp_path, diloco, "diloco")
    local = [d for s in starts for k, d in enumerate(_durations(s))
             if k >= WARMUP and (k + 1) % PERIOD]
    compute = statistics.median(local)
    # An outer period, real: from a period's first step to the next period's.
    real_outer = statistics.median(
        s[k + PERIOD] - s[k] for s in starts for k in range(PERIOD, len(s) - PERIOD, PERIOD))
    sim_outer = statistics.median(
        sum(d[k:k + PERIOD]) for d in [_simulated(diloco, compute, _link(shaped))]
        for k in range(PERIOD, len(d) - PERIOD + 1, PERIOD))
    rows = [("diloco outer step", real_outer - PERIOD * compute,
             sim_outer - PERIOD * compute)]
    for policy in ("synchronous", "gossip"):
        spec = _spec(policy, 10)
        real = statistics.median(d for s in _real(shaped, tmp_path, spec, policy)
                                 for d in _durations(s)[WARMUP:])
        sim = statistics.median(_simulated(spec, compute, _link(shaped))[WARMUP:])
        rows.append((f"{policy} step", real - compute, sim - compute))
    with capsys.disabled():
        print(f"\n# {_link(shaped)} links, TCP {CONGESTION} (iperf3: {rate / 1e6:.1f} Mbit/s), "
              f"step compute {compute * 1e3:.2f} ms" if rate
              else f"\n# {_link(shaped)} links, TCP {CONGESTION}, compute {compute:.4f}s")
        for name, real, sim in rows:
            print(f"# {name:20s} real {real * 1e3:8.1f} ms  simulated {sim * 1e3:8.1f} ms  "
                  f"({sim / real:.3f}x)")
    for name, real, sim in rows:
        assert abs(sim - real) <= TOLERANCE * real, (name, real, sim, rows)
