"""Fixtures of the launcher tests."""
from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from launched import Launcher


@pytest.fixture
def launcher(tmp_path: Path) -> Iterator[list[Launcher]]:
    """Launchers started by a test, killed (peers and all: their parent-death signal) if the
    test fails before they end."""
    started: list[Launcher] = []
    yield started
    for one in started:
        one.close()
