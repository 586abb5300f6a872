"""The margin a view change is proposed at (collectives/group/margin.py): the members'
spread plus the steps they take while the prepare travels, from the coordinator's step times.
Pure arithmetic on given times; the protocol around it runs in test_membership.py."""
from __future__ import annotations

from collectives.group.margin import PREPARE_TRAVEL, BoundaryMargin


def margin_after(step_seconds: float, drift, members: int = 4, steps: int = 6) -> int:
    m = BoundaryMargin()
    m.drift, m.members = (lambda: drift), members
    for step in range(steps):
        m.passing(step, now=100.0 + step * step_seconds)
    return m.steps()


def test_before_any_step_time_the_margin_is_the_fixed_one_or_the_spread():
    m = BoundaryMargin()
    m.members = 3
    assert m.steps() == 4
    m.members = 8
    assert m.steps() == 9   # unknown spread: the view's size and one


def test_long_synchronous_steps_are_proposed_two_steps_ahead():
    # A 256 MiB allreduce per step (about 0.3 s here): one step of spread, one of travel;
    # before, 4 steps, 1.2 s of a joiner's admission.
    assert margin_after(0.3, drift=1) == 2


def test_short_steps_get_the_travel_time_in_steps():
    # 1 ms steps: the prepare's 20 ms are 20 steps (before: 4, so a member was late and
    # the coordinator proposed again, further on).
    assert margin_after(0.001, drift=1) == 1 + round(PREPARE_TRAVEL / 0.001)
    assert margin_after(0.001, drift=8) == 8 + round(PREPARE_TRAVEL / 0.001)


def test_the_median_step_time_counts_not_one_pause():
    m = BoundaryMargin()
    m.drift = lambda: 1
    times = [0.0, 0.3, 0.6, 5.0, 5.3, 5.6]   # a view change's pause between two steps
    for step, t in enumerate(times):
        m.passing(step, now=t)
    m.passing(5, now=9.0)   # the same boundary again: not a step
    assert m.steps() == 2


def test_steps_of_no_time_give_a_bounded_margin():
    assert margin_after(0.0, drift=1) <= 100_001
