"""The demo's speed share (gossip/demo/pace.py) and the evaluation schedule it moves
(gossip/demo/loop.py): peers that count their own steps end together, having trained the
group's budget, and every evaluation index still comes once."""
from __future__ import annotations

import json
import os
import time

import pytest

from gossip.demo.loop import _evaluation_steps, _rescheduled
from gossip.demo.pace import SpeedShare


def _write(directory, slot: int, *, step: int, wall: float, start: float, first: int = 0):
    os.makedirs(os.path.join(directory, "asynchronous"), exist_ok=True)
    with open(os.path.join(directory, "asynchronous", f"pace{slot}.json"), "w") as f:
        json.dump({"step": step, "wall": wall, "start": start, "first": first}, f)


def _share(directory, slot: int, slots: int, total: int, start: float | None = None):
    return SpeedShare(None, str(directory), "asynchronous", slot=slot, slots=slots, total=total,
                      steps_per_epoch=10, allreduce=False, start=start)


def test_the_share_stays_until_every_peer_wrote(tmp_path):
    share = _share(tmp_path, 0, 2, 100)
    assert share.again(20) == 100          # the other peer has not written: as it was
    assert share.first(10, 1.0) == 100     # no allreduce under --kill


def test_a_peer_twice_as_fast_takes_twice_the_steps_left_and_both_end_together(tmp_path):
    now = time.time()
    # Peer 1 wrote just now: 30 steps in 10 s (3/s). Peer 0 is asked at step 60 after
    # 10 s (6/s): the group's 200 steps leave 110, 12.2 s at 9 steps/s, 73 of them its own.
    _write(tmp_path, 1, step=30, wall=now, start=now - 10)
    share = _share(tmp_path, 0, 2, 100, start=now - 10)   # (started with the other)
    total = share.again(60)
    left = (200 - 60 - 30) / 9
    assert total == pytest.approx(60 + 6 * left, abs=1.5)
    other_total = 30 + 3 * left            # what peer 1 computes in turn
    assert total + other_total == pytest.approx(200, abs=2)


def test_a_dead_peer_s_progress_is_extrapolated_and_a_restart_counts_from_its_first_step(
        tmp_path):
    now = time.time()
    # Slot 1 died 5 s ago at step 50, after 50 s: at 1 step/s it counts as 55 now.
    _write(tmp_path, 1, step=50, wall=now - 5, start=now - 55)
    share = _share(tmp_path, 0, 2, 100, start=now - 55)
    total = share.again(55)                 # 1 step/s too: 90 left, 45 s each
    assert total == pytest.approx(55 + 45, abs=1.5)
    # Its restarted process took step 80 with the state 2 s ago, and is at 84: 2 steps/s.
    _write(tmp_path, 1, step=84, wall=now, start=now - 2, first=80)
    total = share.again(55)                 # 61 left at 3/s: 20.3 s, 20 of them its own
    assert total == pytest.approx(55 + 61 / 3, abs=1.5)


@pytest.mark.parametrize("total", [60, 356, 900, 40])
def test_a_rescheduled_evaluation_keeps_every_index_once_and_after_the_step(total):
    schedule = _evaluation_steps(356, 89, 4, 16)
    passed, step = 6, 140
    assert schedule[passed - 1] <= step < schedule[passed]
    new = _rescheduled(schedule, passed, step, total)
    assert new[:passed] == schedule[:passed]
    assert len(new) == len(schedule)
    assert all(b > a for a, b in zip(new, new[1:]))
    assert new[passed] > step
    if total - step >= len(schedule) - passed:
        assert new[-1] == total


def test_re_estimates_every_few_steps_do_not_push_the_next_evaluation_ahead():
    """Spread from the last evaluation made, not from the step: with the total unchanged,
    asking again every 8 steps leaves the schedule where it was."""
    schedule = _evaluation_steps(356, 89, 4, 16)
    passed = 4
    for step in range(96, schedule[passed], 8):
        again = _rescheduled(schedule, passed, step, 356)
        assert again == schedule, step
