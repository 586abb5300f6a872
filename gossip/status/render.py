"""``gossip status``'s text: one table row per member, then who waits on whom, the straggler,
and (asked) each member's stacks."""
from __future__ import annotations

from typing import Any

from gossip.status.job_status import JobStatus

__all__ = ["render"]


def _rate(value: Any, scale: float = 1.0, digits: int = 1) -> str:
    return "-" if value is None else f"{value / scale:.{digits}f}"


def _now(status: dict[str, Any]) -> str:
    running = status.get("running") or []
    if not running:
        return "own code"
    call = running[0]
    more = f" (+{len(running) - 1})" if len(running) > 1 else ""
    return f"{call['op']} #{call['seq']} {call.get('waited', 0.0):.2f}s{more}"


def _consensus(status: dict[str, Any]) -> str:
    for policy in status.get("policies", []):
        if policy.get("consensus_distance_last") is not None:
            return f"{policy['consensus_distance_last']:.3g}"
        if policy.get("consensus_distance_estimate") is not None:
            return f"~{policy['consensus_distance_estimate']:.3g}"   # the round's estimate
    return "-"


def render(job: JobStatus, *, stacks: bool = False) -> str:
    """The status of ``job`` as text for a terminal."""
    first = next((m for m in job.members.values() if m), {})
    lines = [f"job {first.get('job') or '(unnamed)'} at {job.address}: view {job.view}, "
             f"{len(job.members)} members, answered in {job.seconds * 1e3:.0f} ms"]
    header = ("rank", "member", "host", "pid", "step", "steps/s", "MB/s", "now", "consensus")
    rows = [header]
    for rank, status in sorted(job.members.items()):
        if status is None:
            rows.append((str(rank), "-", "-", "-", "-", "-", "-",
                         "NO ANSWER: " + job.errors.get(rank, "?")[:60], "-"))
            continue
        member = f"{status.get('name', '?')}#{status.get('incarnation', '?')}"
        rows.append((str(rank), member, str(status.get("hostname", "")),
                     str(status.get("pid", "")), _rate(status.get("steps"), digits=0),
                     _rate(status.get("steps_per_s"), digits=2),
                     _rate(status.get("bytes_per_s"), 1e6), _now(status), _consensus(status)))
    widths = [max(len(row[i]) for row in rows) for i in range(len(header))]
    for row in rows:
        lines.append("  ".join(cell.ljust(w) for cell, w in zip(row, widths)).rstrip())
    graph = job.waits
    if graph.edges:
        lines.append("")
        by_waiter: dict[int, list] = {}
        for wait in graph.edges:
            by_waiter.setdefault(wait.rank, []).append(wait)
        for rank, waits in sorted(by_waiter.items()):
            on = ", ".join(f"rank {w.on} ({w.reason})" for w in waits)
            w = waits[0]
            lines.append(f"rank {rank} waiting on {on} in {w.op} #{w.seq} for "
                         f"{w.seconds:.1f} s")
        for root, what in sorted(graph.roots.items()):
            lines.append(f"root: rank {root} holds the others up: {what}")
    if job.straggler is not None:
        s = job.straggler
        lines.append(f"straggler: rank {s['rank']}: the others waited {s['seconds']:.2f} s on "
                     f"it ({s['share']:.0%} of all their waiting; next rank "
                     f"{s['next_seconds']:.2f} s)")
    if stacks:
        for rank, status in sorted(job.members.items()):
            if status and status.get("stacks"):
                lines.append(f"\n--- rank {rank} stacks ---\n{status['stacks']}")
    return "\n".join(lines)
