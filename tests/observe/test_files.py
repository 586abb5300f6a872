"""The JSON lines file and the TensorBoard scalars of real peers, read back: a record per
flush per rank with the series a scrape shows, and scalars whose steps increase."""
from __future__ import annotations

import json

import numpy as np
from metrics_helpers import WAIT_S, parse, series

import gossip
from gossip.testing import spawn, wait_until


def _flushed_job(peer, flushes: int) -> list:
    """Gossip steps until the metrics were written ``flushes`` times by the interval (no
    wall-clock figure: it waits for the count), then the names a scrape shows; closing writes
    once more."""
    w = np.zeros(256, dtype=np.float32)
    policy = gossip.policies.make("gossip").attach(peer, [w])
    first = peer.metrics.flushes

    def stepped() -> bool:
        w[:] += 1.0
        policy.after_step()
        return peer.metrics.flushes >= first + flushes
    wait_until(stepped, WAIT_S, interval=0.0, what=f"{flushes} flushes of the metrics")
    names = sorted({name for name, _ in series(parse(peer.metrics.scrape()))})
    peer.close()
    return names


def test_the_json_lines_file_has_a_record_per_flush_per_rank(tmp_path) -> None:
    path = tmp_path / "m" / "metrics-{rank}.jsonl"
    names = spawn(_flushed_job, n=2, args=(2,), timeout=90,
                  env={"GOSSIP_METRICS_FILE": str(path), "GOSSIP_METRICS_INTERVAL": "0.2"})
    for rank in (0, 1):
        lines = (tmp_path / "m" / f"metrics-{rank}.jsonl").read_text().splitlines()
        records = [json.loads(line) for line in lines]
        assert len(records) >= 3   # two by the interval, one at close
        assert [r["sequence"] for r in records] == list(range(len(records)))
        assert all(r["rank"] == rank for r in records)
        times = [r["time"] for r in records]
        assert times == sorted(times)
        last = records[-1]
        assert sorted({s["name"] for s in last["samples"]}) == names[rank]
        assert {s["labels"]["rank"] for r in records for s in r["samples"]} == {str(rank)}
        steps = [s["value"] for r in records for s in r["samples"]
                 if s["name"] == "gossip_steps_total"]
        assert steps == sorted(steps) and steps[-1] > 0


def test_a_file_without_a_rank_placeholder_gets_the_rank_before_its_suffix(tmp_path) -> None:
    spawn(_flushed_job, n=2, args=(1,), timeout=90,
          env={"GOSSIP_METRICS_FILE": str(tmp_path / "metrics.jsonl"),
               "GOSSIP_METRICS_INTERVAL": "0.2"})
    assert sorted(p.name for p in tmp_path.iterdir()) == ["metrics.rank0.jsonl",
                                                          "metrics.rank1.jsonl"]


def test_tensorboard_scalars_read_back_with_increasing_steps(tmp_path) -> None:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    spawn(_flushed_job, n=2, args=(2,), timeout=120, preload=("torch",),
          env={"GOSSIP_TENSORBOARD": str(tmp_path), "GOSSIP_METRICS_INTERVAL": "0.2"})
    for rank in (0, 1):
        events = EventAccumulator(str(tmp_path / f"rank{rank}"))
        events.Reload()
        tags = events.Tags()["scalars"]
        assert "gossip_bytes_sent_total" in tags and "gossip_steps_total/policy=gossip" in tags
        peer = 1 - rank
        assert f"gossip_link_bytes_sent_total/peer={peer}" in tags
        steps = [e.step for e in events.Scalars("gossip_steps_total/policy=gossip")]
        assert len(steps) >= 3 and steps == sorted(set(steps))
        sent = [e.value for e in events.Scalars("gossip_bytes_sent_total")]
        assert sent == sorted(sent) and sent[-1] > 0
