"""The Prometheus exporter of real peers: scraped over HTTP and read with prometheus_client's
parser and checked by promtool, against the peers' own stats taken at the same moment; one port per local rank under
`gossip run`; a port in use is a warning and the job goes on."""
from __future__ import annotations

import re
import shutil
import socket
import subprocess

import numpy as np
import pytest
from metrics_helpers import JOB_WAIT, Launcher, free_ports, parse, scrape, series

import gossip
from gossip.testing import spawn

N_ALLREDUCE = 5
ARRAY = 10_000   # float32 elements of each allreduce


def _scraped_job(peer, steps: int) -> dict:
    """N allreduces of a known array and ``steps`` gossip steps; then, between two barriers
    (no traffic of this peer's own), its stats, a scrape of its own /metrics and its stats
    again; and a scrape of the next rank's, whose port is its local rank's."""
    for _ in range(N_ALLREDUCE):
        peer.allreduce(np.ones(ARRAY, dtype=np.float32))
    w = np.zeros(512, dtype=np.float32)
    policy = gossip.policies.make("gossip").attach(peer, [w])
    for _ in range(steps):
        w += 1.0
        policy.after_step()
    peer.barrier()
    before = peer.stats()
    own = scrape(peer.metrics.http.url)
    after = peer.stats()
    again = scrape(peer.metrics.http.url)   # counts the first scrape's own cost
    port = peer.metrics.http.port - peer.local_rank + (peer.rank + 1) % peer.world_size
    other = scrape(f"http://127.0.0.1:{port}/metrics")
    peer.barrier()   # the next rank serves until every peer scraped it
    return {"own": own, "again": again, "other": other, "before": before, "after": after,
            "policy": policy.name, "url": peer.metrics.http.url}


@pytest.mark.parametrize("n", [2, 3])
def test_a_scrape_shows_each_peers_counters_as_its_stats_say(n: int) -> None:
    base = free_ports(n)
    steps = 4
    results = spawn(_scraped_job, n=n, args=(steps,), timeout=90,
                    env={"GOSSIP_METRICS_PORT": str(base)})
    for rank, r in enumerate(results):
        assert r["url"] == f"http://127.0.0.1:{base + rank}/metrics"
        families = parse(r["own"])
        for name in ("gossip_steps", "gossip_comm_seconds", "gossip_link_bytes_sent",
                     "gossip_link_bytes_received", "gossip_bytes_sent", "gossip_view",
                     "gossip_members", "gossip_lost_peers", "gossip_view_changes",
                     "gossip_op_seconds", "gossip_wait_seconds"):
            assert name in families, sorted(families)
        values = series(families)
        assert {dict(k[1])["rank"] for k in values} == {str(rank)}
        assert values[("gossip_steps_total", (("policy", r["policy"]), ("rank", str(rank))))] \
            == steps
        assert values[("gossip_members", (("rank", str(rank)),))] == n
        assert values[("gossip_view", (("rank", str(rank)),))] == 0
        # Per link: as the peer's own stats said just before and just after the scrape.
        links = {int(dict(labels)["peer"]): v for (name, labels), v in values.items()
                 if name == "gossip_link_bytes_sent_total"}
        assert set(links) == set(r["before"]["peers"]), (links, r["before"]["peers"])
        for peer, value in links.items():
            lo = r["before"]["peers"][peer]["bytes_sent"]
            hi = r["after"]["peers"][peer]["bytes_sent"]
            assert lo <= value <= hi and value > 0
        total = values[("gossip_bytes_sent_total", (("rank", str(rank)),))]
        assert r["before"]["bytes_sent"] <= total <= r["after"]["bytes_sent"]
        # Per operation (the flight recorder's totals): the caller's bytes of the calls
        # made, and a histogram that counts every call.
        key = ("gossip_op_bytes_total", (("op", "allreduce"), ("rank", str(rank))))
        assert values[key] == N_ALLREDUCE * ARRAY * 4
        count = values[("gossip_op_seconds_count", (("op", "allreduce"), ("rank", str(rank))))]
        assert count == values[("gossip_op_calls_total", (("op", "allreduce"),
                                                          ("rank", str(rank))))] == N_ALLREDUCE
        assert values[("gossip_consensus_distance_estimate",
                       (("policy", r["policy"]), ("rank", str(rank))))] >= 0
        # The metrics' own cost: the scrape between the two counted, with the CPU it took.
        again = series(parse(r["again"]))
        me = (("rank", str(rank)),)
        assert again[("gossip_metrics_collections_total", me)] \
            >= values[("gossip_metrics_collections_total", me)] + 1
        assert again[("gossip_metrics_cpu_seconds_total", me)] \
            > values[("gossip_metrics_cpu_seconds_total", me)]
        # Prometheus' own checker (promtool, Go's parser and its lint rules) takes the page.
        _promtool_accepts(r["own"])
        # The next rank's exporter answers with its own rank.
        other = series(parse(r["other"]))
        assert {dict(k[1])["rank"] for k in other} == {str((rank + 1) % n)}


def _promtool_accepts(text: str) -> None:
    promtool = shutil.which("promtool")
    if promtool is None:
        pytest.skip("promtool is not installed (apt-get install prometheus; .ci/run does)")
    check = subprocess.run([promtool, "check", "metrics"], input=text, capture_output=True,
                           text=True, timeout=60, check=False)
    assert check.returncode == 0 and not check.stdout.strip(), check.stdout + check.stderr


def _stopped(folder) -> None:
    (folder / "stop").write_text("")


def test_gossip_run_peers_serve_port_and_port_plus_one(tmp_path) -> None:
    base = free_ports(2)
    job = Launcher(tmp_path, "-n", "2", str(JOB_WAIT), str(tmp_path),
                   GOSSIP_METRICS_PORT=str(base))
    try:
        job.wait_for(lambda: len(re.findall(r"RUNNING", job.output)) >= 2, "2 peers running")
        for local_rank in (0, 1):
            url = f"http://127.0.0.1:{base + local_rank}/metrics"
            assert f"metrics at {url}" in job.output
            values = series(parse(scrape(url)))
            assert {dict(k[1])["rank"] for k in values} == {str(local_rank)}
            key = ("gossip_steps_total", (("policy", "synchronous"), ("rank", str(local_rank))))
            job.wait_for(lambda url=url, key=key: series(parse(scrape(url))).get(key),
                         "a step counted")
        _stopped(tmp_path)
        assert job.finish() == 0, job.output
    finally:
        job.close()
    assert job.output.count("DONE") == 2


def test_a_port_in_use_is_a_warning_and_the_job_goes_on(tmp_path) -> None:
    base = free_ports(2)
    taken = socket.socket()
    taken.bind(("127.0.0.1", base))
    taken.listen()
    job = Launcher(tmp_path, "-n", "2", str(JOB_WAIT), str(tmp_path),
                   GOSSIP_METRICS_PORT=str(base))
    try:
        job.wait_for(lambda: len(re.findall(r"RUNNING", job.output)) >= 2, "2 peers running")
        warning = job.wait_for(lambda: re.search(
            rf"WARNING.*cannot listen on 127\.0\.0\.1:{base} \(GOSSIP_METRICS_PORT.*training "
            "goes on", job.output), "the warning")
        assert warning
        values = series(parse(scrape(f"http://127.0.0.1:{base + 1}/metrics")))
        assert {dict(k[1])["rank"] for k in values} == {"1"}
        _stopped(tmp_path)
        assert job.finish() == 0, job.output
    finally:
        job.close()
        taken.close()
    assert job.output.count("DONE") == 2
