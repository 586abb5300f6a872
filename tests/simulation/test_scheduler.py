"""The simulator's virtual threads (gossip/simulation/scheduler.py): one runs at a time, the
earliest in virtual time first; locks, conditions, events and joins wait in virtual time;
a run where nobody can go on says who waits for what; and the asynchronous policy, whose
threads run on them, gives the same run twice and is not held back by a straggler."""
from __future__ import annotations

import threading

import numpy as np
import pytest

from gossip.simulation import TrainingSpec, simulate_training
from gossip.simulation.scheduler import Scheduler, SimulationDeadlock


def _run(bodies: dict[str, tuple[int, object]], ranks: int = 2) -> tuple[Scheduler, list]:
    clocks = [0.0] * ranks
    sched = Scheduler(clocks, timeout=30)
    for name, (rank, body) in bodies.items():
        sched.spawn(lambda body=body, sched=sched: body(sched), rank, name)
    sched.run()
    return sched, clocks


def test_threads_take_turns_in_virtual_time_order() -> None:
    trace: list[tuple[str, float]] = []

    def sleeper(name: str, steps: list[float]):
        def body(s: Scheduler) -> None:
            for step in steps:
                s.sleep_until(s.monotonic() + step)
                trace.append((name, s.monotonic()))
        return body
    sched, _ = _run({"a": (0, sleeper("a", [0.3, 0.3, 0.3])),
                     "b": (1, sleeper("b", [0.2, 0.2, 0.2, 0.2]))})
    assert sched.failed is None
    assert trace == sorted(trace, key=lambda t: (t[1], t[0]))   # (a before b at a tie)
    assert [t for t, _ in trace] == ["b", "a", "b", "a", "b", "b", "a"]
    assert trace[-1] == ("a", pytest.approx(0.9))


def test_primitives_wait_in_virtual_time() -> None:
    """An event set at 0.5 wakes its waiter at 0.5; a wait with a timeout of 0.2 ends at
    0.2 (False); a lock held across a sleep makes the other wait until its release; a
    condition notified at 0.7 wakes its waiter then; join waits for the thread's end."""
    seen: dict[str, object] = {}

    def main(s: Scheduler) -> None:
        event, lock = s.event(), s.lock()
        cond = s.condition(s.lock())

        def waiter() -> None:
            seen["timed out"] = (event.wait(0.2), s.monotonic())
            seen["set"] = (event.wait(), s.monotonic())
            with lock:
                seen["locked at"] = s.monotonic()
            with cond:
                seen["notified"] = (cond.wait(5.0), s.monotonic())
        thread = s.thread(waiter, "waiter")
        with lock:
            thread.start()
            s.sleep_until(0.5)
            event.set()
            s.sleep_until(0.6)
        s.sleep_until(0.7)
        with cond:
            cond.notify_all()
        thread.join()
        seen["joined at"] = s.monotonic()
        seen["alive"] = thread.is_alive()
    sched, _ = _run({"main": (0, main)}, ranks=1)
    assert sched.failed is None
    assert seen["timed out"] == (False, pytest.approx(0.2))
    assert seen["set"] == (True, pytest.approx(0.5))
    assert seen["locked at"] == pytest.approx(0.6)
    assert seen["notified"] == (True, pytest.approx(0.7))
    assert seen["joined at"] == pytest.approx(0.7) and seen["alive"] is False


def test_a_deadlock_names_every_waiter() -> None:
    def body(s: Scheduler) -> None:
        s.event().wait()   # nobody sets it
    sched, _ = _run({"first": (0, body), "second": (1, body)})
    assert isinstance(sched.failed, SimulationDeadlock)
    message = str(sched.failed)
    assert "first (clock 0 s) waits for an event" in message
    assert "second (clock 0 s) waits for an event" in message


def test_asynchronous_runs_alike_twice_and_a_straggler_holds_nobody_back() -> None:
    """AD-PSGD's claim, on the real Asynchronous class: a peer 4x slower than the others
    slows only itself (gossip's ring waits for it every round); two runs give the same
    parameters, clocks and bytes."""
    common = dict(peers=6, steps=30, link="1gbit,5ms", straggler=(5, 4.0), step_jitter=0.2)
    spec = TrainingSpec(policy="asynchronous", **common)
    a, b = simulate_training(spec, timeout=120), simulate_training(spec, timeout=120)
    assert a.to_dict() | {"seconds": 0} == b.to_dict() | {"seconds": 0}
    for p, q in zip(a.peers, b.peers):
        assert np.array_equal(p.parameters, q.parameters) and p.clocks == q.clocks
    fast = max(p.clocks[-1] for p in a.peers[:5])
    assert fast < 0.5 * a.peers[5].clocks[-1]
    ring = simulate_training(TrainingSpec(policy="gossip", **common), timeout=120)
    assert min(p.clocks[-1] for p in ring.peers) > 0.9 * ring.peers[5].clocks[-1]
    # Each exchange: a request and its answer, the parameters and a short tail each.
    nbytes = a.peers[0].parameters.nbytes
    assert all(p.bytes_sent >= len(p.losses) * nbytes for p in a.peers)
    assert a.consensus < 0.5 and a.accuracy > 0.5


def test_asynchronous_leaves_at_once_the_same_twice() -> None:
    """Ranks 2 and 4 leave (at once, as peer.leave() under asynchronous): each goes at its
    next step boundary, its threads end, the others' receives from it fail once they hear
    (the view's notice), they drop it and re-form the group without it; a death beside."""
    spec = TrainingSpec(policy="asynchronous", peers=6, steps=40, link="100mbit,5ms",
                        leaves=((2, 0.3), (4, 0.5)), deaths=((1, 0.7),), detect_seconds=0.1)
    a, b = simulate_training(spec, timeout=120), simulate_training(spec, timeout=120)
    assert a.to_dict() | {"seconds": 0} == b.to_dict() | {"seconds": 0}
    assert a.left == [2, 4] and a.died == [1]
    assert [p.rank for p in a.peers] == [0, 3, 5]
    assert all(len(p.losses) == 40 for p in a.peers)
    assert a.accuracy > 0.6


def test_asynchronous_admits_a_restart_and_a_joiner_the_same_twice() -> None:
    """Rank 2 dies and restarts, a new peer (slot 6) joins: each is admitted at the first
    step boundary past its request (the members' view change: the policy's own settle of the
    pushes in flight, counted per view, then the source's state and a share of its weights),
    and trains to the end with the others; two runs alike."""
    spec = TrainingSpec(policy="asynchronous", peers=6, steps=40, link="100mbit,5ms",
                        deaths=((2, 0.2),), restarts=((2, 0.4),), joins=(0.5,),
                        detect_seconds=0.1)
    a, b = simulate_training(spec, timeout=120), simulate_training(spec, timeout=120)
    assert a.to_dict() | {"seconds": 0} == b.to_dict() | {"seconds": 0}
    assert a.died == [2] and a.restarted == [2] and a.joined == [6]
    assert [p.rank for p in a.peers] == list(range(7))
    for rank, request in ((2, 0.4), (6, 0.5)):
        late = a.peers[rank]
        assert 0 < late.first_step and late.first_step + len(late.losses) == 40
        assert late.clocks[0] > request
    assert a.accuracy > 0.6 and a.consensus < 0.5


def test_asynchronous_under_heavy_churn_with_restarts_the_same_twice() -> None:
    """A death every 0.3 simulated seconds across 12 peers, each back 0.3 s later: deaths
    during view changes and admissions (a peer's own death waits until its view change is
    over; its policy's threads die with it), requests of a view never taken by the next."""
    spec = TrainingSpec(policy="asynchronous", peers=12, steps=60, link="100mbit,5ms",
                        mtbf=0.3, restart_after=0.3)
    a, b = simulate_training(spec, timeout=300), simulate_training(spec, timeout=300)
    assert a.to_dict() | {"seconds": 0} == b.to_dict() | {"seconds": 0}
    assert len(a.died) >= 8 and len(a.restarted) >= 8
    # No wait ran to its timeout: the run lasts about its 60 steps of compute and exchanges.
    assert a.simulated_seconds < 10
    assert a.accuracy > 0.5


def test_asynchronous_goes_on_around_deaths_the_same_twice() -> None:
    """A dead peer's training loop raises its death at its first turn past it, its policy's
    threads end at theirs after that (ThreadKilled); the others drop it once they count it
    lost and train on. Two runs alike."""
    spec = TrainingSpec(policy="asynchronous", peers=8, steps=40, link="1gbit,5ms",
                        deaths=((3, 0.1), (5, 0.2)), detect_seconds=0.1, step_jitter=0.2)
    a, b = simulate_training(spec, timeout=120), simulate_training(spec, timeout=120)
    assert a.to_dict() | {"seconds": 0} == b.to_dict() | {"seconds": 0}
    assert a.died == [3, 5] and [p.rank for p in a.peers] == [0, 1, 2, 4, 6, 7]
    assert all(len(p.losses) == 40 for p in a.peers)
    assert a.accuracy > 0.6
    # The dead peers' policy threads ended too (ThreadKilled), none left blocked.
    left = [t for t in threading.enumerate() if t.name.endswith(("-r3", "-r5"))]
    for thread in left:
        thread.join(10)
    assert not [t.name for t in left if t.is_alive()]
