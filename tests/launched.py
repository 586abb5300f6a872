"""`gossip run` started by a test, its output read while it runs (tests/launch/conftest.py's
``launcher`` fixture kills what a failed test left running; tests/observe uses it too)."""
from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path
from typing import IO

from gossip.testing import wait_until

__all__ = ["REPO", "WAIT_S", "Launcher", "launcher_env"]

REPO = Path(__file__).parents[1]
WAIT_S = 60   # every wait; a hang fails the test instead of stalling the run


def launcher_env(**extra: str) -> dict[str, str]:
    """This environment without a launcher's variables, this checkout on PYTHONPATH, and
    ``extra``."""
    env = {k: v for k, v in os.environ.items()
           if not k.startswith("GOSSIP_") and k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK",
                                                        "MASTER_ADDR", "MASTER_PORT")}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")]))
    env.update(extra)
    return env


class Launcher:
    """`gossip run ARGS` with its stdout and stderr in files, read while it runs."""

    def __init__(self, folder: Path, *args: str, **env: str) -> None:
        self.out_path, self.err_path = folder / "launcher.out", folder / "launcher.err"
        self._files: list[IO[bytes]] = [open(self.out_path, "wb"), open(self.err_path, "wb")]
        self.proc = subprocess.Popen([sys.executable, "-m", "gossip.run", *args],
                                     stdout=self._files[0], stderr=self._files[1],
                                     env=launcher_env(**env))

    @property
    def out(self) -> str:
        return self.out_path.read_text(errors="replace")

    @property
    def err(self) -> str:
        return self.err_path.read_text(errors="replace")

    @property
    def output(self) -> str:
        """stdout, then stderr."""
        return self.out + "\n" + self.err

    def wait_for(self, predicate, what: str):
        """Wait until ``predicate()`` is truthy; an AssertionError with the output if the
        launcher ends first or the wait runs out."""
        def ready():
            value = predicate()
            if not value and self.proc.poll() is not None:
                raise AssertionError(f"gossip run exited {self.proc.returncode} before "
                                     f"{what}\n{self.out}\n{self.err}")
            return value
        try:
            return wait_until(ready, WAIT_S, what=what)
        except TimeoutError as exc:
            raise AssertionError(f"{exc}\n{self.out}\n{self.err}") from None

    def running(self, count: int) -> dict[int, dict[str, str]]:
        """Each rank's RUNNING line (pid, job, rendezvous), once ``count`` have printed one."""
        def lines():
            found = {int(m.group(1)): dict(item.split("=", 1) for item in m.group(2).split())
                     for m in re.finditer(r"^\[rank (\d+)\] RUNNING (.*)$", self.out, re.MULTILINE)}
            return found if len(found) >= count else None
        return self.wait_for(lines, f"{count} peers running")

    def finish(self) -> int:
        try:
            return self.proc.wait(WAIT_S)
        finally:
            for f in self._files:
                f.close()

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.finish()
