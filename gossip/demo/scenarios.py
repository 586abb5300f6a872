"""`gossip demo`'s story: the scenarios in which the averaging policies differ, each a named set
of the demo's own options (a slow network, a straggler, a peer that dies, non-iid data), run
one after the other by story.py. Each trains the policies that the scenario tells apart, from
the same start on the same batches, with the one-process baseline beside them.

Sized for about three minutes on 2 cores in all (4 peers): the shifted digits (STORY_DATASET,
a task on which accuracy keeps rising for a few epochs, so a policy that is further along is
seen to be), 4 epochs (8 under the death, so the restarted process, 2-4 s to come back, still
has steps to train). On another data set (--dataset) the scenarios take its default epochs.
"""
from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass, field

from gossip.demo.kill import Kill
from gossip.demo.options import DemoOptions
from gossip.demo.straggler import Straggler

__all__ = ["Scenario", "SCENARIOS", "STORY_DATASET", "scenario_names", "parse_scenarios"]

#: The story's data set when none is named: digits at random places on a 12x12 canvas. On the
#: plain digits every policy passes 95% within an epoch or two and ends within the seeds' noise
#: of the others (96.9-98.9% over three seeds in every scenario).
STORY_DATASET = "shifted-digits"


@dataclass(frozen=True)
class Scenario:
    """A named run of the demo: its policies and the options it sets."""

    name: str
    title: str                 # one line, for the table and the figure's panel
    shows: str                 # what it is expected to show, and why (printed before it runs)
    policies: tuple[str, ...]
    epochs: int = 4            # on STORY_DATASET
    settings: dict = field(default_factory=dict)   # DemoOptions fields it sets

    def options(self, base: DemoOptions) -> DemoOptions:
        """``base`` (the user's peers, seed, data, ...) with this scenario's policies, epochs
        (the user's, else this scenario's on STORY_DATASET, else the data set's default) and
        settings, writing into OUT/<name>/."""
        settings = dict(self.settings)
        # "{last}": the last peer, so that peer 0, which reports progress, is a normal one.
        for key, parse in (("kill", Kill.parse), ("straggler", Straggler.parse)):
            if key in settings:
                settings[key] = parse(settings[key].format(last=base.peers - 1))
        return dataclasses.replace(
            base, policies=self.policies,
            epochs=base.epochs or (self.epochs if base.dataset == STORY_DATASET else None),
            out=os.path.join(base.out, self.name), **settings)


SCENARIOS = (
    Scenario("slow-network", "every link 100 Mbit/s, 1 ms (emulated)",
             "communication costs what it would on a slow cluster: local-sgd and easgd "
             "communicate every few steps and finish first; synchronous pays an allreduce "
             "per step, gossip one exchange with each neighbour",
             ("synchronous", "local-sgd", "easgd", "gossip"), settings={"link": "100mbit,1ms"}),
    Scenario("straggler", "the last peer 4x slower per step",
             "synchronous and gossip wait for the slow peer at every step; asynchronous lets "
             "the others go on: its fast peers take more of the group's steps (split by "
             "speed) and it finishes first, its averaged model ahead at any deadline, while "
             "its peers' own models lag behind that average",
             ("synchronous", "gossip", "asynchronous"), settings={"straggler": "{last}@4"}),
    Scenario("death", "the last peer SIGKILLed at a third, started again",
             "gossip and asynchronous train on past a dead neighbour; synchronous "
             "(elastic=True) re-forms its group and goes on; the restarted peer rejoins with "
             "the running job's state",
             ("synchronous", "gossip", "asynchronous"), epochs=8, settings={"kill": "{last}@0.33"}),
    Scenario("non-iid", "each peer's classes drawn from Dirichlet(0.1)",
             "peers see mostly one or two classes: synchronous averages every step and keeps "
             "its accuracy; gossip on a ring mixes only with neighbours and loses points (its "
             "worst peer most); local-sgd's drift over 4 steps between averages costs little",
             ("synchronous", "gossip", "local-sgd"), settings={"non_iid": 0.1}),
)


def scenario_names() -> tuple[str, ...]:
    return tuple(s.name for s in SCENARIOS)


def parse_scenarios(text: str) -> tuple[Scenario, ...]:
    """``all`` or comma-separated scenario names -> the scenarios, in the order given;
    ValueError (one line) for an unknown name."""
    by_name = {s.name: s for s in SCENARIOS}
    items = [t.strip().lower() for t in str(text).split(",")]
    if items == ["all"]:
        return SCENARIOS
    for item in items:
        if item not in by_name:
            raise ValueError(f"unknown scenario {item!r}; known: {', '.join(by_name)}, or all")
    if len(set(items)) != len(items):
        raise ValueError(f"scenario listed twice in {text!r}")
    return tuple(by_name[i] for i in items)
