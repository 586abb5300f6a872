"""`gossip demo`'s story: the scenarios (scenarios.py) one after the other, each through
run_demo into OUT/<scenario>/ (its own table, demo.png and demo.json), then a summary of all:
a table per scenario on stdout, OUT/story.png (a panel per scenario: test accuracy against
wall time, zoomed to where the lines differ) and OUT/story.json. The summary files are written
again after each scenario, so Ctrl-C or a failure keeps what the finished scenarios showed.
"""
from __future__ import annotations

import json
import math
import os
from typing import IO, Any

from gossip.demo.options import DemoOptions
from gossip.demo.report import write_json_doc
from gossip.demo.runner import run_demo
from gossip.demo.scenarios import Scenario
from gossip.demo.train import BASELINE

__all__ = ["run_story", "budget", "summary_table", "STORY_PNG", "STORY_JSON"]

STORY_PNG, STORY_JSON = "story.png", "story.json"
# Distinct dashes and markers: two runs that coincide (gossip and push-sum on an undirected
# ring are the same run) still show as two lines.
_STYLES = [("-", "o"), ("--", "s"), ("-.", "^"), (":", "D"), ("-", "v"), ("--", "P")]


def run_story(base: DemoOptions, scenarios: tuple[Scenario, ...], *, stdout: IO[str],
              stderr: IO[str]) -> int:
    """Run ``scenarios`` with ``base``'s peers, data and seed; returns 0. Errors as run_demo's
    (the summary of the scenarios that finished is written first)."""
    finished: list[tuple[Scenario, dict]] = []   # (OUT is made by the first one's run_demo)
    for k, scenario in enumerate(scenarios, 1):
        options = scenario.options(base)
        try:   # (the banner too: a Ctrl-C as it is printed is reported as any other)
            print(f"\n=== scenario {k} of {len(scenarios)}: {scenario.name} "
                  f"({scenario.title})\n    expected: {scenario.shows}", file=stdout, flush=True)
            run_demo(options, stdout=stdout, stderr=stderr)
        except KeyboardInterrupt:
            if finished:
                print(f"gossip demo: interrupted; the finished scenarios are in "
                      f"{os.path.join(base.out, STORY_PNG)}: "
                      f"{', '.join(s.name for s, _ in finished)}", file=stderr, flush=True)
            raise
        with open(os.path.join(options.out, "demo.json")) as f:
            finished.append((scenario, json.load(f)))
        _write(base.out, finished)
    print("\n" + summary_table(finished), file=stdout, flush=True)
    print(f"\nwrote {os.path.join(base.out, STORY_PNG)} and "
          f"{os.path.join(base.out, STORY_JSON)}", file=stdout, flush=True)
    return 0


def _pct(value: Any) -> str:
    return "-" if value is None else f"{100 * value:.1f}%"


def _seconds(value: Any) -> str:
    return "-" if value is None else f"{value:.1f} s"


def budget(doc: dict, key: str = "accuracy") -> tuple[float | None, dict[str, float | None]]:
    """The scenario's time budget T, the training time of the first policy to finish (the
    one-process baseline aside), and each run's test accuracy at T: its last evaluation at
    or before T (None: none yet besides the start). Comparing at equal time is what a user
    with a deadline sees: a policy that trains the same epochs faster is further along.
    ``key`` "averaged_accuracy": that of the peers' averaged model instead (a run with one
    model, the baseline, gives its own)."""
    times = [r["train_seconds"] for r in doc["table"]
             if r["policy"] != BASELINE and not r.get("failed") and r.get("train_seconds")]
    if not times:
        return None, {}
    t = min(times)
    at = {}
    for name, curve in doc["figures"]["test_accuracy_vs_wall_time"].items():
        points = [a for time, a in zip(curve["time"], curve.get(key) or curve["accuracy"])
                  if time <= t * (1 + 1e-9)]
        at[name] = points[-1] if len(points) > 1 else None
    return t, at


def summary_table(finished: list[tuple[Scenario, dict]]) -> str:
    """One block per scenario: per policy, test accuracy (mean of the peers' models, the
    worst peer's, and the model of their averaged weights), those of the peers' own and
    of the averaged model at the scenario's time budget (budget()), time to the target,
    training time, samples/s, MB sent per peer and the consensus distance, after the last
    epoch."""
    head = ("policy", "test acc", "worst peer", "avg model", "at T", "avg at T", "to target",
            "time", "samples/s", "sent/peer", "consensus")
    lines = []
    for scenario, doc in finished:
        target = doc["run"].get("target_accuracy", 0.95)
        t, at = budget(doc)
        _, averaged_at = budget(doc, "averaged_accuracy")
        lines.append(f"{scenario.name}: {scenario.title} (time to {100 * target:.0f}%; at T: "
                     f"test acc and avg model's when the first policy finished, "
                     f"T = {_seconds(t)})")
        rows = [head]
        for r in doc["table"]:
            consensus = r.get("consensus")
            rows.append((r["policy"], _pct(r.get("final_accuracy")),
                         _pct(r.get("worst_peer_accuracy")),
                         _pct(r.get("averaged_model_accuracy")), _pct(at.get(r["policy"])),
                         _pct(averaged_at.get(r["policy"])),
                         _seconds(r.get("time_to_target")),
                         _seconds(r.get("train_seconds")), f"{r.get('throughput') or 0:,.0f}",
                         f"{(r.get('bytes_per_peer') or 0) / 1e6:.1f} MB",
                         "-" if consensus is None else f"{consensus:.3g}"))
        widths = [max(len(row[i]) for row in rows) for i in range(len(head))]
        for row in rows:
            lines.append("  " + "  ".join(c.ljust(w) if i == 0 else c.rjust(w)
                                          for i, (c, w) in enumerate(zip(row, widths))))
        lines.append("")
    return "\n".join(lines).rstrip()


def _write(out: str, finished: list[tuple[Scenario, dict]]) -> None:
    scenarios = []
    for s, d in finished:
        t, at = budget(d)
        scenarios.append({"name": s.name, "title": s.title, "expected": s.shows,
                          "run": d["run"], "budget_seconds": t, "accuracy_at_budget": at,
                          "averaged_accuracy_at_budget": budget(d, "averaged_accuracy")[1],
                          "table": d["table"]})
    write_json_doc(os.path.join(out, STORY_JSON), {"scenarios": scenarios})
    write_story_png(os.path.join(out, STORY_PNG), finished)


def _zoom(curves: list[list[float]]) -> tuple[float, float]:
    """The y range where the lines differ: from a little below the lowest point of the last
    three quarters of any line (the first quarter is the climb every run makes) to 100."""
    tails = [a for c in curves for a in c[len(c) // 4:] if math.isfinite(a)]
    low = min(tails, default=0.0)
    return max(0.0, math.floor(low - max(1.0, 0.1 * (100 - low)))), 100.3


def _color(policy: str) -> str:
    """One colour per policy in every panel (the baseline grey)."""
    from gossip.policies import names

    known = list(names())
    return f"C{known.index(policy)}" if policy in known else "0.35"


def _averaged_differs(curve: dict) -> bool:
    """Whether a run's averaged model is worth a line of its own: over the second half of the
    run, more than a point from its peers' mean accuracy on average (elastic's and
    asynchronous's peers are not meant to agree while they train; where the peers are
    replicas, or nearly, the two lines would coincide)."""
    pairs = [(a, b) for a, b in zip(curve.get("averaged_accuracy") or [], curve["accuracy"])
             if a is not None]
    late = pairs[len(pairs) // 2:]
    return bool(late) and sum(abs(a - b) for a, b in late) / len(late) > 0.01


def write_story_png(path: str, finished: list[tuple[Scenario, dict]]) -> None:
    """A panel per scenario: test accuracy (mean of the peers) against training time, and
    the averaged model's (thin, dotted) for a run whose peers' models disagree."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    cols = min(2, len(finished))
    rows = math.ceil(len(finished) / cols)
    fig, axes = plt.subplots(rows, cols, figsize=(7 * cols, 4.6 * rows), squeeze=False)
    try:
        for ax in axes.flat[len(finished):]:
            ax.axis("off")
        for ax, (scenario, doc) in zip(axes.flat, finished):
            table = {r["policy"]: r for r in doc["table"]}
            curves = doc["figures"]["test_accuracy_vs_wall_time"]
            for k, (name, d) in enumerate(curves.items()):
                dash, marker = _STYLES[k % len(_STYLES)]
                final = table.get(name, {}).get("final_accuracy")
                ax.plot(d["time"], [100 * a for a in d["accuracy"]], linestyle=dash,
                        marker=marker, ms=3, lw=1.4, color=_color(name),
                        label=f"{name} ({_pct(final)})" if final is not None else name)
                if _averaged_differs(d):   # its peers disagree: their average, thin
                    averaged = table.get(name, {}).get("averaged_model_accuracy")
                    ax.plot(d["time"], [100 * a if a is not None else math.nan
                                        for a in d["averaged_accuracy"]],
                            linestyle=":", lw=1.0, alpha=0.7, color=_color(name),
                            label=f"{name}, avg model ({_pct(averaged)})")
            target = doc["run"].get("target_accuracy", 0.95)
            ax.axhline(100 * target, color="gray", lw=0.8, ls=":")
            t, _ = budget(doc)
            if t is not None:
                ax.axvline(t, color="gray", lw=0.8, ls="--")
                ax.annotate(" T", (t, 0.02), xycoords=("data", "axes fraction"),
                            fontsize=8, color="gray")
            ax.set_ylim(*_zoom([[100 * a for a in d["accuracy"]] for d in curves.values()]))
            ax.set(xlabel="training time (s)", ylabel="test accuracy (%)",
                   title=f"{scenario.name}: {scenario.title}")
            ax.legend(loc="lower right", fontsize=8, title="final test accuracy",
                      title_fontsize=8)
            ax.grid(alpha=0.3)
        run = finished[0][1]["run"]
        fig.suptitle(f"gossip demo: where each policy wins ({run.get('dataset', 'digits')}, "
                     f"{run['peers']} peers on one machine)")
        fig.tight_layout()
        fig.savefig(path, dpi=100)
    finally:
        plt.close(fig)
