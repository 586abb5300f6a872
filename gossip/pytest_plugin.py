"""A pytest plugin (registered as ``gossip`` through the pytest11 entry point): the
``gossip_spawn`` fixture runs a function in N real peer processes with gossip.testing.spawn.

    def check(peer):
        return peer.allreduce(np.ones(3)).tolist()

    def test_allreduce(gossip_spawn):
        assert gossip_spawn(check, n=4) == [[4.0] * 3] * 4

The deadline defaults to the test's own pytest-timeout, less a margin for the harness to report
every peer's traceback before pytest-timeout would cut it off.
"""
from __future__ import annotations

import functools

import pytest

from collectives import defaults
from gossip.testing import spawn

__all__ = ["gossip_spawn"]


@pytest.fixture
def gossip_spawn(request):
    """``gossip_spawn(fn, n=4, **kwargs)``: gossip.testing.spawn, its timeout by default 10 s inside
    the test's pytest-timeout (defaults.TIMEOUT without one)."""
    marker = request.node.get_closest_marker("timeout")
    test_timeout = marker.args[0] if marker and marker.args else None
    if test_timeout is None:
        try:  # pytest-timeout's ini option, when that plugin is installed
            test_timeout = request.config.getini("timeout") or None
        except ValueError:
            test_timeout = None
    # Ten seconds inside the test's own limit, so spawn's error (with every rank's traceback)
    # comes before pytest-timeout's.
    default = max(10.0, float(test_timeout) - 10.0) if test_timeout else defaults.TIMEOUT
    return functools.partial(_spawn_with_default, default)


def _spawn_with_default(default_timeout: float, fn, n: int = 4, **kwargs):
    kwargs.setdefault("timeout", default_timeout)
    return spawn(fn, n, **kwargs)
