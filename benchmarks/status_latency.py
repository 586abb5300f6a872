#!/usr/bin/env python3
"""How fast `gossip status` answers and how soon it names a stalled rank.

Usage:
  python benchmarks/status_latency.py [--peers 16] [--repeats 3] [--polls 20]

Each repeat starts `gossip run -n PEERS tests/launch/workers/stalled_job.py DIR`: its last rank
stalls in its own function (``stall_in_user_code``) at step 5, writing the time it stalled,
while the others wait for it in the step's allreduce. This script asks the job's status
(gossip.status.job_status, as `gossip status` does) every 0.1 s from the moment the peers run;
it reports the time from the stall to the first answer whose root is the stalled rank in that
function ("named after"), and, once named, the time each of POLLS further answers took
("answer"). Then it lets the rank go and waits for the job to end (exit 0). Medians over the
repeats; the load (`uptime`) before and after, since other work on the machine moves these.
"""
from __future__ import annotations

import argparse
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(os.path.realpath(__file__)).parents[1]
JOB = REPO / "tests" / "launch" / "workers" / "stalled_job.py"
sys.path.insert(0, str(REPO))

from gossip.status import job_status  # noqa: E402


def _load() -> str:
    return " ".join(f"{x:.2f}" for x in os.getloadavg())


def one(peers: int, polls: int) -> tuple[float, list[float]]:
    """One job: (seconds from the stall to the status naming it, the answers' seconds)."""
    with tempfile.TemporaryDirectory() as folder:
        env = {k: v for k, v in os.environ.items() if not k.startswith("GOSSIP_")}
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")]))
        err_path = Path(folder) / "launcher.err"
        with open(err_path, "wb") as err, open(os.devnull, "wb") as out:
            proc = subprocess.Popen([sys.executable, "-m", "gossip.run", "-n", str(peers),
                                     str(JOB), folder], stdout=out, stderr=err, env=env)
        try:
            deadline = time.monotonic() + 300
            where = None
            while where is None:
                if time.monotonic() > deadline or proc.poll() is not None:
                    raise RuntimeError(f"no banner:\n{err_path.read_text()}")
                where = re.search(r"see it: gossip status (\S+) --job (\S+) --key (\S+)",
                                  err_path.read_text())
                time.sleep(0.1)
            address, job, key = where.groups()
            last = peers - 1
            named_at = None
            while named_at is None:
                if time.monotonic() > deadline or proc.poll() is not None:
                    raise RuntimeError(f"never named:\n{err_path.read_text()}")
                try:
                    status = job_status(address, job_id=job, key=key, timeout=2.0)
                except (TimeoutError, RuntimeError):   # not everyone up yet
                    time.sleep(0.1)
                    continue
                root = status.waits.roots.get(last, "")
                if "stall_in_user_code" in root and \
                        len({w.rank for w in status.waits.edges}) == peers - 1:
                    named_at = time.time()
                else:
                    time.sleep(0.1)
            stalled = float((Path(folder) / "stalled").read_text())
            answers = []
            for _ in range(polls):
                answers.append(job_status(address, job_id=job, key=key, timeout=2.0).seconds)
            (Path(folder) / "go").write_text("")
            if proc.wait(300) != 0:
                raise RuntimeError(f"the job exited {proc.returncode}:\n{err_path.read_text()}")
            return named_at - stalled, answers
        finally:
            if proc.poll() is None:
                proc.kill()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--peers", type=int, default=16)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--polls", type=int, default=20)
    args = parser.parse_args()
    print(f"# load before: {_load()}; {args.peers} peers, {os.cpu_count()} CPUs", flush=True)
    named, answers = [], []
    for repeat in range(args.repeats):
        after, took = one(args.peers, args.polls)
        named.append(after)
        answers.append(statistics.median(took))
        print(f"# repeat {repeat + 1}: named {after:.3f} s after the stall; answers median "
              f"{statistics.median(took) * 1e3:.0f} ms, max {max(took) * 1e3:.0f} ms",
              flush=True)
    print(f"# load after: {_load()}")
    print(f"peers {args.peers}: named after the stall, median {statistics.median(named):.3f} s "
          f"(max {max(named):.3f}); an answer, median {statistics.median(answers) * 1e3:.0f} ms")


if __name__ == "__main__":
    main()
