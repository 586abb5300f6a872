"""gossip.testing.spawn's verdict: which failure its error message leads with; and the
harness reachable as ``gossip.testing`` after a plain ``import gossip``."""
import subprocess
import sys

import pytest

from gossip.testing import PeerOutcome, SpawnError, _verdict


def _headline(*outcomes: PeerOutcome, tolerate=frozenset()) -> str:
    with pytest.raises(SpawnError) as info:
        _verdict(list(outcomes), 60.0, frozenset(tolerate))
    return str(info.value).splitlines()[0]


def test_the_failure_seen_first_leads_not_the_lowest_rank() -> None:
    # Rank 1 died; rank 0 then raised PeerLost about it: the cause is rank 1.
    head = _headline(PeerOutcome(0, status="error", exitcode=1, noticed=5.0),
                     PeerOutcome(1, status="died", exitcode=7, noticed=4.0))
    assert head.startswith("rank 1 died (exit code 7)"), head


def test_seen_together_a_death_leads_an_error() -> None:
    head = _headline(PeerOutcome(0, status="error", exitcode=1, noticed=5.0),
                     PeerOutcome(1, status="died", exitcode=-9, noticed=5.0))
    assert head.startswith("rank 1 died"), head


def test_a_tolerated_death_never_leads() -> None:
    head = _headline(PeerOutcome(0, status="error", exitcode=1, noticed=5.0),
                     PeerOutcome(1, status="died", exitcode=-9, noticed=4.0), tolerate={1})
    assert head.startswith("rank 0 failed"), head


def test_gossip_testing_is_an_attribute_loaded_on_first_use() -> None:
    code = ("import sys, gossip; light = 'gossip.testing' not in sys.modules; "
            "spawn = gossip.testing.spawn; print(light, spawn.__module__)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["True", "gossip.testing"]
