"""Compression state across a join: a process joining a running LocalSGD group that uses
DiLoCo's outer optimizer and top-k takes the replicas' shared state (parameters, anchors, the
outer momentum) and starts without an error-feedback residual (a donor's residual is what the
donor has not sent yet: taken over, it would be sent twice), then averages with the others
as one more bitwise replica. Real processes, real sockets."""
from __future__ import annotations

import hashlib
import subprocess
import sys

import numpy as np
import pytest

from test_membership import _env, _members_beside, _publish_address, _wait_address, _worker

# Processes the tests start beside their groups (joiners, restarted members, launchers) must
# hold the group's key: every test here gets one (tests/conftest.py's group_key).
pytestmark = pytest.mark.usefixtures("group_key")

COUNT = 2000
POLICY = 'LocalSGD(period=2, outer_optimizer="diloco", compression="topk:0.1")'


def members(peer, workdir, size):
    from gossip.policies import LocalSGD   # noqa: F401 (POLICY names it)
    _publish_address(peer, workdir)
    x = np.full(COUNT, float(peer.rank), dtype=np.float32)
    policy = eval(POLICY).attach(peer, [x])
    residuals = len(policy.state_dict()["residuals"])
    # The same condition on every replica; it ends right after an outer step.
    while (policy.step < 40 or peer.world_size < size or policy.step % 2) and \
            policy.step < 100_000:
        x += np.float32(0.01) * np.sin(np.arange(COUNT, dtype=np.float32) + peer.rank)
        policy.after_step()
        np.ones((96, 96)) @ np.ones((96, 96))   # a step's compute
    state = policy.state_dict()
    policy.close()
    return (peer.world_size, policy.step, residuals, len(state["residuals"]),
            hashlib.sha256(x.tobytes()).hexdigest())


def test_a_joiner_takes_the_outer_state_starts_without_a_residual_and_is_a_replica(tmp_path):
    workdir = str(tmp_path)
    box = {}

    def joiner():
        address = _wait_address(workdir)
        script = _worker("compression_joiner.py")
        proc = subprocess.Popen([sys.executable, script, "4", str(COUNT)],
                                stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                env=_env(GOSSIP_RENDEZVOUS=address,
                                         GOSSIP_MEMBER_NAME="joiner", POLICY=POLICY))
        box["out"], _ = proc.communicate(timeout=120)

    results, line = _members_beside(joiner, box, members, (workdir, 4), "JOINED",
                                    timeout=150)
    assert line, box.get("out")
    _, start, steps, anchors, buffers, residuals, digest = line[0].split()
    assert int(start) > 0                     # it entered at a boundary, with the state
    assert (int(anchors), int(buffers)) == (1, 1)   # the anchors and the outer momentum
    assert int(residuals) == 0                # no residual of the donor's
    for world, member_steps, _, member_residuals, member_digest in results:
        assert world == 4 and member_steps == int(steps)
        assert member_residuals == 1
        assert member_digest == digest        # one more bitwise replica
