"""`gossip demo --simulate`: the story's scenarios in simulated time, at many peers on a
wide-area network, run by the simulator (gossip.simulation: the project's own policy classes,
one thread per peer in this process, each on a virtual clock that charges its compute and the
bytes and latency of its messages) instead of by peer processes.

    gossip demo --simulate                       # 64 peers, every scenario, ~3 minutes
    gossip demo --simulate --peers 16 --steps 100 --scenario straggler

What a real run of the demo measures moves with the machine and its load (four peers sharing
two cores); a simulated run does not: the same options give the same JSON, byte for byte, on
any machine under any load (the wall time each run took is printed, never written). The task
is the simulator's (the 8x8 digits, an MLP of 9,738 parameters), its numbers a real run's;
only the times are the models'. The real demo stays the proof that the mechanics work.

The scenarios are the story's (scenarios.py) where the simulator can run them, every one on a
WAN (SIMULATED_LINK), for the policies it simulates (synchronous, local-sgd, gossip,
push-sum, asynchronous: its threads on the simulator's virtual threads): the network alone, a
straggler, non-iid data, and a death (the middle peer dies when a third of the steps' compute
has passed, counted lost DETECT seconds later; gossip, push-sum and asynchronous go on around
it, synchronous and local SGD run with ``elastic=True`` and re-form the group without it). Per
scenario the table says which policy is the fastest of those whose peers end within one point
of the best accuracy (the time is the last peer's: with a straggler, asynchronous's others end
long before it, which ``peer_seconds`` in the JSON shows).
"""
from __future__ import annotations

import json
import os
import sys
import time
from dataclasses import dataclass, field
from typing import IO, Any

__all__ = ["SimulatedScenario", "SIMULATED_SCENARIOS", "SIMULATED_LINK", "SIMULATED_PEERS",
           "SIMULATED_STEPS", "run_simulated_story", "simulated_story", "format_story"]

#: Every link of the simulated story: a wide-area network (rate, one-way latency).
SIMULATED_LINK = "100mbit,50ms"
#: Peers and steps per peer when not given (--peers, --steps).
SIMULATED_PEERS = 64
SIMULATED_STEPS = 200
#: A policy "wins" a scenario when it is the fastest of those whose peers end within this
#: much (accuracy, a fraction) of the best peers' accuracy.
WITHIN = 0.01


@dataclass(frozen=True)
class SimulatedScenario:
    """A scenario of the story as the simulator runs it: TrainingSpec fields it sets."""

    name: str
    title: str
    settings: dict = field(default_factory=dict)


#: The death scenario: the others count the dead peer lost this long after (heartbeats).
DETECT = 2.0
#: The policies that need elastic=True to survive a death (they re-form the group).
_ELASTIC = ("synchronous", "local-sgd")

SIMULATED_SCENARIOS = (
    SimulatedScenario("slow-network", f"every link {SIMULATED_LINK} (a WAN)"),
    SimulatedScenario("straggler", "a WAN, the last peer 4x slower per step",
                      {"straggler": "last"}),
    SimulatedScenario("non-iid", "a WAN, each peer's classes drawn from Dirichlet(0.1)",
                      {"non_iid": 0.1}),
    SimulatedScenario("death", "a WAN, the middle peer dies a third of the way in "
                               f"(counted lost {DETECT:g} s later; synchronous and local-sgd "
                               "elastic)", {"deaths": "middle"}),
)


def _scenarios(names: tuple[str, ...] | None) -> list[SimulatedScenario]:
    """The scenarios to run for the story's ``names`` (None: all)."""
    by_name = {s.name: s for s in SIMULATED_SCENARIOS}
    return [by_name[n] for n in (names if names is not None else by_name) if n in by_name]


def simulated_story(*, policies: tuple[str, ...], peers: int, steps: int, topology: str,
                    lr: float, seed: int, scenarios: tuple[str, ...] | None = None,
                    stderr: IO[str] | None = None) -> dict[str, Any]:
    """Run the scenarios and return the story as a dict (what OUT/story-simulated.json
    holds): deterministic, so nothing in it depends on the machine (no wall times)."""
    from gossip.simulation import TrainingSpec, simulate_training

    stderr = stderr or sys.stderr
    run = _scenarios(scenarios)
    story: dict[str, Any] = {
        "run": {"peers": peers, "steps": steps, "topology": topology, "lr": lr, "seed": seed,
                "link": SIMULATED_LINK, "policies": list(policies),
                "task": "digits MLP (gossip.simulation.training)"},
        "scenarios": []}
    for scenario in run:
        settings = dict(scenario.settings)
        if settings.get("straggler") == "last":
            settings["straggler"] = (peers - 1, 4.0)
        dies = settings.get("deaths") == "middle"
        if dies:
            # A third of the steps' compute: within the run whatever the network costs.
            third = steps * TrainingSpec.step_seconds / 3
            settings.update(deaths=((peers // 2, third),), detect_seconds=DETECT)
        rows = []
        for policy in policies:
            options = {"elastic": True} if dies and policy in _ELASTIC else {}
            spec = TrainingSpec(policy=policy, peers=peers, topology=topology, steps=steps,
                                link=SIMULATED_LINK, lr=lr, seed=seed, policy_options=options,
                                **settings)
            started = time.perf_counter()
            result = simulate_training(spec).to_dict()
            print(f"{scenario.name}: {policy} took {result['simulated_seconds']:.1f} "
                  f"simulated s ({time.perf_counter() - started:.0f} s to simulate)",
                  file=stderr, flush=True)
            del result["seconds"]   # the machine's: two runs would differ there only
            result["policy"] = policy
            rows.append(result)
        story["scenarios"].append({"name": scenario.name, "title": scenario.title,
                                   "rows": rows, "wins": _winner(rows)})
    return story


def _winner(rows: list[dict]) -> str | None:
    """The fastest (simulated) policy of those whose peers end within WITHIN of the best."""
    if not rows:
        return None
    best = max(r["accuracy"] for r in rows)
    close = [r for r in rows if r["accuracy"] >= best - WITHIN]
    return min(close, key=lambda r: (r["simulated_seconds"], r["policy"]))["policy"]


def format_story(story: dict[str, Any]) -> str:
    """The story as tables, one per scenario."""
    run = story["run"]
    lines = [f"{run['peers']} simulated peers, {run['steps']} steps each, topology "
             f"{run['topology']}, every link {run['link']}; task: {run['task']}"]
    for scenario in story["scenarios"]:
        lines += ["", f"{scenario['name']}: {scenario['title']}",
                  f"{'policy':<14}{'accuracy':>10}{'worst':>9}{'averaged':>10}"
                  f"{'consensus':>11}{'simulated s':>13}{'MB/peer':>10}"]
        for r in scenario["rows"]:
            lines.append(f"{r['policy']:<14}{r['accuracy']:>10.2%}{r['worst_accuracy']:>9.2%}"
                         f"{r['averaged_accuracy']:>10.2%}{r['consensus']:>11.4f}"
                         f"{r['simulated_seconds']:>13.2f}{r['bytes_per_peer'] / 1e6:>10.2f}")
        lines.append(f"fastest within {WITHIN:.0%} of the best accuracy: {scenario['wins']}")
    return "\n".join(lines)


def run_simulated_story(*, policies: tuple[str, ...], peers: int, steps: int, topology: str,
                        lr: float, seed: int, out: str, scenarios: tuple[str, ...] | None,
                        stdout: IO[str] | None = None, stderr: IO[str] | None = None) -> int:
    """`gossip demo --simulate`: run, print the tables, write OUT/story-simulated.json."""
    stdout = stdout or sys.stdout
    story = simulated_story(policies=policies, peers=peers, steps=steps, topology=topology,
                            lr=lr, seed=seed, scenarios=scenarios, stderr=stderr)
    os.makedirs(out, exist_ok=True)
    path = os.path.join(out, "story-simulated.json")
    with open(path, "w") as f:
        json.dump(story, f, indent=1, sort_keys=True)
        f.write("\n")
    print(format_story(story), file=stdout)
    print(f"\nwrote {path}", file=stdout, flush=True)
    return 0
