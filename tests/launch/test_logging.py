"""GOSSIP_LOG_LEVEL=DEBUG tells what the peers did to meet and talk: the rendezvous steps, the
connections made and accepted (addresses, ranks), the view formed (number, members), the
waits armed and timed out (operation, peer, deadline); INFO shows none of it. And no line per
chunk: a wait is logged once per operation and peer."""
from __future__ import annotations

import re

import pytest

from test_launcher import _lines, _run, _script

# What DEBUG shows of each rank, and INFO must not.
DEBUG_ONLY = [
    r"collectives DEBUG: rank {r}: listening at tcp://127\.0\.0\.1:\d+",
    r"collectives DEBUG: rank {r}: rendezvous of job '[^']+' at tcp://127\.0\.0\.1:\d+, 2 "
    r"peers, timeout 30s",
    r"collectives DEBUG: rank {r}: connecting to rank {o} at (ipc|tcp)://",
    r"collectives DEBUG: rank {r}: connected to rank {o} at (ipc|tcp)://\S+ \(handshake done\)",
    r"collectives DEBUG: rank {r}: accepted a connection from .+ on (ipc|tcp)://",
    r"gossip DEBUG: rank{r}: view 0 of job [^:]+: 2 members \[rank0#\d+, rank1#\d+\]",
]
RANK_0 = [r"rank 0: serving the rendezvous at tcp://127\.0\.0\.1:(\d+)",
          r"rank 0: rank 1 registered from tcp://127\.0\.0\.1:\d+ \(2 of 2\)",
          # The wait armed and fired: operation, peer, deadline.
          r"rank 0: recv from rank 1: waiting on rank 1 \(channel \d+, sequence 0\), "
          r"timeout in 0\.\d+s",
          r"rank 0: recv from rank 1: timed out waiting on rank 1"]
RANK_1 = [r"rank 1: registering at the rendezvous tcp://127\.0\.0\.1:\d+; waits up to 30\.5s",
          r"rank 1: got the table from the rendezvous at tcp://127\.0\.0\.1:\d+",
          r"rank 1: recv from rank 0: waiting on rank 0"]


@pytest.mark.timeout(120)
def test_debug_shows_the_rendezvous_connections_view_and_waits_that_info_does_not() -> None:
    runs = {level: _run("-n", "2", _script("late_sender.py"), GOSSIP_LOG_LEVEL=level)
            for level in ("DEBUG", "INFO")}
    for level, proc in runs.items():
        assert proc.returncode == 0, proc.stderr
        assert _lines(proc.stdout, 0) == ["TIMED OUT OperationTimeout"], proc.stdout
        assert _lines(proc.stdout, 1) == ["GOT 1.0"], proc.stdout
    debug, info = runs["DEBUG"].stderr, runs["INFO"].stderr
    assert "gossip INFO: rank 0/2 of job" in info, info
    for r in (0, 1):
        log = "\n".join(_lines(debug, r))
        for pattern in DEBUG_ONLY + (RANK_0 if r == 0 else RANK_1):
            pattern = pattern.format(r=r, o=1 - r)
            assert re.search(pattern, log), (pattern, log)
            assert not re.search(pattern, info), (pattern, info)
    assert " DEBUG: " not in info, info


@pytest.mark.timeout(120)
def test_a_wait_is_logged_once_per_operation_not_per_chunk(tmp_path) -> None:
    proc = _run("-n", "2", _script("chunked_allreduce.py"), GOSSIP_LOG_LEVEL="DEBUG",
                GOSSIP_TRANSPORT="tcp")
    assert proc.returncode == 0, proc.stderr[-3000:]
    for r in (0, 1):
        messages = int(_lines(proc.stdout, r)[0].split()[1])
        assert messages >= 3 * 8, proc.stdout    # each allreduce moved many chunks
        waits = [line for line in _lines(proc.stderr, r)
                 if "allreduce(" in line and "waiting on rank" in line]
        assert len(waits) <= 3, waits            # at most one per operation (one peer)
