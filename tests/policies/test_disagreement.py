"""The gossip policy's consensus estimate (neighborhood/disagreement.py) against the real
consensus distance, on real peers: of its order (the estimate of a round against the real
distance the round started from), and shrinking with it as the peers mix."""
from __future__ import annotations

import numpy as np

from gossip.policies import make
from gossip.testing import spawn


def _mix(peer, rounds: int):
    rng = np.random.default_rng(peer.rank)
    w = rng.normal(size=5000).astype(np.float32)
    policy = make("gossip").attach(peer, [w])
    out = []
    truth = policy.consensus_distance()
    for _ in range(rounds):
        policy.after_step()          # a round without a gradient: pure mixing
        # The estimate is of the distance the round started from.
        stats = policy.stats(consensus=True)
        out.append((stats["consensus_distance_estimate"], truth))
        truth = stats["consensus_distance"]
    policy.close()
    return out


def test_the_estimate_follows_the_consensus_distance() -> None:
    results = spawn(_mix, n=4, timeout=120, args=(12,))
    for per_round in results:
        estimates = [e for e, _ in per_round]
        truths = [t for _, t in per_round]
        for estimate, truth in per_round:
            assert 0.5 * truth <= estimate <= 3.0 * truth, per_round
        # Both shrink as the peers mix (a ring of 4: every round by a constant factor).
        assert estimates[-1] < estimates[0] / 20 and truths[-1] < truths[0] / 20
