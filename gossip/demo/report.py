"""The demo's results: one summary row per policy, the printed table, the PNG and the JSON.

    rows = summarize(records)                   # records.collect's, one per policy
    print(format_table(rows, header=...))
    write_json(path, rows, info)
    write_png(path, rows, title=...)

Each row: final test accuracy (the peers' own models, averaged), wall time of training (the
clock pauses while the peers evaluate), time to the target accuracy on that clock, training
throughput (samples per second over all peers, on the slowest peer's clock), bytes sent per
peer and the final consensus distance; under --kill, what became of the killed peer.
"""
from __future__ import annotations

import json
import math
import os
from typing import Any

__all__ = ["summarize", "format_table", "figures", "write_json", "write_json_doc", "write_png"]


def summarize(records: list[dict], *, target: float = 0.95) -> list[dict]:
    """One row per record (records.collect's: the policies in the order trained, then the
    baseline's if there is one)."""
    return [_row(r, target) for r in records]


def _row(record: dict, target: float) -> dict:
    history = record["history"]
    final = history[-1] if history else {}
    failed = record.get("failed")
    train_seconds = record["train_seconds"]
    reached = next((p["time"] for p in history if p["accuracy"] >= target), None)
    row = {
        "policy": record["policy"],
        "peers": record["peers"],
        # The others failed: what they had reached is no final accuracy.
        "final_accuracy": None if failed or not final else final["accuracy"],
        "worst_peer_accuracy": None if failed or not final else final.get("worst_accuracy"),
        "averaged_model_accuracy": None if failed else record.get("averaged_accuracy"),
        "final_test_loss": final.get("test_loss"),
        "train_seconds": train_seconds,
        "wall_seconds": record["wall_seconds"],  # evaluations included
        "time_to_target": reached,
        "throughput": record["samples"] / train_seconds if train_seconds > 0 else 0.0,
        "bytes_per_peer": record["bytes_per_peer"],
        "consensus": final.get("consensus"),
        "steps": record["steps"],
        "history": history,
    }
    if record.get("mixing"):
        row["mixing"] = record["mixing"]   # per slot: how the policy mixed (its counters)
    if "restart" in record:
        row["restart"] = record["restart"]
    if failed:
        row["failed"] = failed
    return row


def _restart(r: dict) -> str:
    """The table's short word on the killed peer (the details go below the table)."""
    restart = r.get("restart")
    if restart is None:
        return "-"
    killed = restart["killed_at_step"]
    if restart["status"] == "rejoined" and restart["rejoin_seconds"] is not None:
        return (f"{killed} -> {restart['rejoined_at_step']}, "
                f"{restart['rejoin_seconds']:.1f} s")
    return {"rejoined": "back", "refused": "restart refused", "others failed": "others failed",
            "stopped": "not back in time", "not killed": "not killed"}.get(
                restart["status"], "restart failed")


def _bytes(n: float) -> str:
    for unit, scale in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if n >= scale:
            return f"{n / scale:.2f} {unit}"
    return f"{n:.0f} B"


def _consensus(value: float | None) -> str:
    if value is None:
        return "-"
    return "0" if value == 0 else f"{value:.3g}"


def format_table(rows: list[dict], *, target: float = 0.95, header: str = "") -> str:
    """The table the demo prints, one row per policy."""
    pct = f"{target * 100:g}%"
    heads: tuple[str, ...] = ("policy", "test acc", "avg model", "wall time", f"time to {pct}",
                              "samples/s", "sent/peer", "consensus")
    killing = any("restart" in r for r in rows)
    if killing:
        heads += ("killed peer: died after step -> back at, after",)
    body = []
    for r in rows:
        name = r["policy"] + (" (1 process)" if r["peers"] == 1 else "")
        if r.get("failed"):   # the peers did not finish: no figure of theirs is final
            cells = (name, "failed", "-", "-", "-", "-", "-", "-")
        else:
            cells = (
                name,
                f"{r['final_accuracy'] * 100:.1f}%",
                "-" if r.get("averaged_model_accuracy") is None
                else f"{r['averaged_model_accuracy'] * 100:.1f}%",
                f"{r['train_seconds']:.1f} s",
                "not reached" if r["time_to_target"] is None
                else f"{r['time_to_target']:.1f} s",
                f"{r['throughput']:,.0f}",
                _bytes(r["bytes_per_peer"]),
                _consensus(r["consensus"]),
            )
        body.append(cells + ((_restart(r),) if killing else ()))
    width = [max(len(h), *(len(b[k]) for b in body)) for k, h in enumerate(heads)]
    fmt = "  ".join(f"{{:<{w}}}" if k == 0 else f"{{:>{w}}}" for k, w in enumerate(width))
    lines = [header, ""] if header else []
    lines += [fmt.format(*heads), fmt.format(*("-" * w for w in width))]
    lines += [fmt.format(*b) for b in body]
    lines += [
        "",
        "test acc: the peers' own models on the test set, averaged over the peers, after the "
        "last epoch; avg model: the",
        "model whose weights are the peers' average then (what a final allreduce would give).",
        "wall time: of training (the slowest peer's), the clock paused while evaluating; time "
        f"to {pct}: the first evaluation",
        f"at or above {pct}, on that clock. samples/s: training samples of all peers per "
        "second; sent/peer: bytes each peer",
        "sent while training (the evaluations send nothing); consensus: mean distance of the "
        "peers' weights to their average.",
    ]
    if any(r["peers"] == 1 for r in rows):
        lines.append("baseline: one process, plain SGD with the peers' total batch and as many "
                     "steps, trained after the peers")
        lines.append("finished (so alone on the machine).")
    if killing:
        lines.append("killed peer: the step it SIGKILLed itself after, the step its new process "
                     "took the state at, and the")
        lines.append("seconds between (its start, the admission at a step boundary, the state "
                     "transfer).")
        for r in rows:
            restart = r.get("restart")
            if restart is not None and restart["detail"]:
                lines.append(f"{r['policy']}: {_restart(r)}: {restart['detail']}")
    return "\n".join(lines)


def _clean(value: Any) -> Any:
    """JSON has no NaN or infinity: they become null."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: _clean(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_clean(v) for v in value]
    return value


def figures(rows: list[dict]) -> dict:
    """The data of every panel of the PNG, per policy."""
    acc, loss, consensus, sent = {}, {}, {}, {}
    for r in rows:
        h = r["history"]
        name = r["policy"]
        acc[name] = {"time": [p["time"] for p in h], "accuracy": [p["accuracy"] for p in h]}
        if any("averaged_accuracy" in p for p in h):   # (not the baseline's: one model)
            acc[name]["averaged_accuracy"] = [p.get("averaged_accuracy") for p in h]
        loss[name] = {"time": [p["time"] for p in h],
                      "train_loss": [p["train_loss"] for p in h],
                      "test_loss": [p["test_loss"] for p in h]}
        if r["consensus"] is not None:
            consensus[name] = {"step": [p["step"] for p in h],
                               "consensus": [p["consensus"] for p in h]}
            sent[name] = r["bytes_per_peer"]
    return {
        "test_accuracy_vs_wall_time": acc,
        "loss_vs_wall_time": loss,
        "consensus_distance_vs_round": consensus,
        "bytes_sent_per_peer": sent,
    }


def write_json(path: str | os.PathLike, rows: list[dict], info: dict) -> None:
    """Everything behind the table and the PNG: the run's settings, the rows, the figures."""
    table = [{k: v for k, v in r.items() if k != "history"} for r in rows]
    write_json_doc(path, {"run": info, "table": table, "figures": figures(rows)})


def write_json_doc(path: str | os.PathLike, doc: dict) -> None:
    """``doc`` as JSON (NaN and infinities as null), replacing ``path`` whole, never torn."""
    tmp = f"{os.fspath(path)}.tmp"
    with open(tmp, "w") as f:
        json.dump(_clean(doc), f, indent=1)
        f.write("\n")
    os.replace(tmp, path)


def write_png(path: str | os.PathLike, rows: list[dict], *, title: str = "",
              target: float = 0.95) -> None:
    """Test accuracy and loss against wall time, consensus distance per round and bytes sent
    per peer, one line (or bar) per policy."""
    import matplotlib

    matplotlib.use("Agg")  # files only; never needs a display
    import matplotlib.pyplot as plt

    data = figures(rows)
    colors = {r["policy"]: f"C{k}" for k, r in enumerate(rows)}
    fig, axes = plt.subplots(2, 2, figsize=(13, 9))
    try:
        ax = axes[0, 0]
        for name, d in data["test_accuracy_vs_wall_time"].items():
            ax.plot(d["time"], [a * 100 for a in d["accuracy"]], marker=".", ms=3, label=name,
                    color=colors[name], linestyle="--" if name == "baseline" else "-")
        ax.axhline(target * 100, color="gray", lw=0.8, ls=":")
        ax.set(xlabel="wall time of training (s)", ylabel="test accuracy (%)",
               title="test accuracy", ylim=(max(0.0, min(50.0, ax.get_ylim()[0])), 100.5))
        ax.legend(loc="lower right", fontsize=8)
        ax.grid(alpha=0.3)

        ax = axes[0, 1]
        for name, d in data["loss_vs_wall_time"].items():
            ax.plot(d["time"][1:], d["train_loss"][1:], color=colors[name], label=f"{name} train",
                    linestyle="--" if name == "baseline" else "-")
            ax.plot(d["time"], d["test_loss"], color=colors[name], linestyle=":", alpha=0.8)
        ax.set(xlabel="wall time of training (s)", ylabel="cross-entropy",
               title="loss (solid: training, dotted: test)", yscale="log")
        ax.legend(loc="upper right", fontsize=8)
        ax.grid(alpha=0.3)

        ax = axes[1, 0]
        for name, d in data["consensus_distance_vs_round"].items():
            # A log scale cannot show 0 (identical replicas: synchronous always, local SGD
            # right after averaging): those points are left out and the label says so.
            # Step 0 is 0 for every policy (same initial weights): not worth a mention.
            series = [(s, c) for s, c in zip(d["step"], d["consensus"]) if s > 0]
            points = [(s, c) for s, c in series if c and c > 0]
            zeros = len(series) - len(points)
            label = name if not zeros else (
                f"{name} (always 0: identical replicas)" if not points
                else f"{name} ({zeros} points at 0 not shown)")
            ax.plot([s for s, _ in points], [c for _, c in points], marker=".", ms=3,
                    color=colors[name], label=label)
        ax.set(xlabel="round (optimizer step)", ylabel="||x_i - mean x||, mean over peers",
               title="consensus distance", yscale="log")
        ax.legend(loc="best", fontsize=8)
        ax.grid(alpha=0.3)

        ax = axes[1, 1]
        sent = data["bytes_sent_per_peer"]
        names = list(sent)
        ax.bar(range(len(names)), [sent[k] / 1e6 for k in names],
               color=[colors[k] for k in names])
        ax.set_xticks(range(len(names)), names, rotation=20, fontsize=8)
        ax.set(ylabel="MB", title="bytes sent per peer")
        ax.grid(alpha=0.3, axis="y")

        if title:
            fig.suptitle(title)
        fig.tight_layout()
        fig.savefig(path, dpi=100)
    finally:
        plt.close(fig)
