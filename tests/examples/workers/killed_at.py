"""usage: killed_at.py SCRIPT [ARGS...]  (under `gossip run --max-restarts 1`; KILL_RANK,
KILL_STEP, KILL_FILE set)

Runs SCRIPT as its own __main__ with ARGS (tests/examples/test_examples_restart.py), with
two faults of the test's own around every policy's after_step():

- the first incarnation of rank KILL_RANK, at its KILL_STEP-th after_step(), writes its
  process id to KILL_FILE and waits there for the test's SIGKILL, mid-training; the
  launcher starts the rank again, and that incarnation prints RESTARTED ... FINISHED once
  SCRIPT returned;
- the other ranks, from a few steps before then until the restarted rank is a member of
  their view again, take steps of a real model's length (STEP_SECONDS, default 0.25 s)
  instead of the examples' microseconds, so the job is still running when the restart
  comes back (a process takes seconds to start and import torch). The slow steps begin
  before the kill so that the coordinator, which proposes a joiner's boundary as many
  steps ahead as 20 ms of its recent steps (collectives/group/margin.py), times slow steps.
"""
import os, runpy, sys, time

script, args = sys.argv[1], sys.argv[2:]
incarnation = os.environ.get("GOSSIP_INCARNATION", "0")
victim = os.environ["KILL_RANK"]
kill_file = os.environ["KILL_FILE"]
step_seconds = float(os.environ.get("STEP_SECONDS", "0.25"))

from gossip.policies.base.policy import Policy  # noqa: E402

after_step, calls = Policy.after_step, [0]


def restarted_is_back(policy) -> bool:
    view = policy.peer.view
    return view is not None and any(m.name == f"rank{victim}" and m.incarnation >= 1
                                    for m in view.members)


def faulty_after_step(self):
    calls[0] += 1
    if incarnation == "0" and os.environ.get("RANK") == victim:
        if calls[0] == int(os.environ["KILL_STEP"]):
            with open(kill_file + ".tmp", "w") as f:
                f.write(str(os.getpid()))
            os.replace(kill_file + ".tmp", kill_file)
            time.sleep(120)   # the test SIGKILLs this process here
    elif calls[0] >= int(os.environ["KILL_STEP"]) - 10 and not restarted_is_back(self):
        time.sleep(step_seconds)
    return after_step(self)


Policy.after_step = faulty_after_step
sys.argv = [script, *args]
runpy.run_path(script, run_name="__main__")
if incarnation != "0":
    print(f"RESTARTED rank {os.environ['RANK']} incarnation {incarnation} FINISHED", flush=True)
