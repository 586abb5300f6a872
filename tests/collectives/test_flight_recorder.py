"""The flight recorder as a data structure (real peers record into it in tests/launch/
test_status.py and tests/observe/test_exporter.py): bounded, totals by operation name with a
cumulative histogram, failures, waits, and a view change's carry-over."""
from __future__ import annotations

from collectives.flight_recorder import LATENCY_BUCKETS, FlightRecorder


def test_it_keeps_the_last_calls_and_counts_them_all() -> None:
    r = FlightRecorder(3, capacity=8)
    for seq in range(20):
        r.end(r.begin("allreduce(sum,ring)", 0, seq, (0, 1), 64))
    held = r.begin("broadcast(0)", 0, 20, (0,), 16)
    r.count("send", 100)
    failed = r.begin("recv from rank 1", 1, 0, (1,), 0)
    r.end(failed, TimeoutError("late"))
    calls = r.records()
    assert len(calls) == 8 and calls[-1]["op"] == "recv from rank 1"
    assert calls[-1]["state"] == "failed" and calls[-1]["error"] == "TimeoutError: late"
    assert [c["op"] for c in r.running()] == ["broadcast(0)"]
    assert r.running()[0]["waited"] >= 0 and r.running()[0]["thread"] == "MainThread"
    totals = r.totals()
    assert totals["allreduce"]["calls"] == 20 and totals["allreduce"]["bytes"] == 20 * 64
    assert totals["send"] == {**totals["send"], "calls": 1, "bytes": 100, "seconds": 0.0}
    assert totals["recv"]["failed"] == 1
    buckets = totals["allreduce"]["buckets"]
    assert len(buckets) == len(LATENCY_BUCKETS) + 1 and buckets[-1] == [float("inf"), 20]
    assert all(a[1] <= b[1] for a, b in zip(buckets, buckets[1:]))   # cumulative
    assert r.begun == {0: 20, 1: 0}
    r.end(held)
    assert r.running() == [] and "broadcast(0) channel 0 seq 20" in r.describe()


def test_a_view_change_carries_the_history_over() -> None:
    old = FlightRecorder(0, capacity=4)
    for seq in range(3):
        old.end(old.begin("allreduce(sum,ring)", 0, seq, (1,), 8))
    old.waited_on(1, 0.5)
    new = FlightRecorder(0, capacity=4)
    new.continue_from(old)
    new.end(new.begin("allreduce(sum,ring)", 0, 0, (1,), 8))
    new.waited_on(1, 0.25)
    assert [c["id"] for c in new.records()] == [1, 2, 3, 4]
    assert new.totals()["allreduce"]["calls"] == 4
    assert new.waited == {1: 0.75}
