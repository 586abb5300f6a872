"""After a run that included the pages' code blocks: how many ran, and every skip with its
reason (each skip is reviewed: it is a block no test runs)."""
from __future__ import annotations

from collections import Counter


def pytest_terminal_summary(terminalreporter) -> None:
    reports = [r for key in ("passed", "failed", "skipped", "error")
               for r in terminalreporter.stats.get(key, [])
               if "test_code_blocks.py::test_code_block[" in getattr(r, "nodeid", "")
               and r.when in ("call", "setup")]
    if not reports:
        return
    outcomes = Counter("skipped" if r.skipped else "failed" if r.failed else "passed"
                       for r in reports if r.when == "call" or r.skipped)
    terminalreporter.write_sep("-", "docs code blocks")
    terminalreporter.write_line(f"{outcomes['passed']} ran and passed, {outcomes['failed']} "
                                f"failed, {outcomes['skipped']} skipped")
    for r in reports:
        if r.skipped and isinstance(r.longrepr, tuple):
            terminalreporter.write_line(f"  skipped {r.longrepr[2].removeprefix('Skipped: ')}")
