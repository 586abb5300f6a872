"""Reading and writing another process's memory (collectives/transport/cma.py), with real
processes: what the on-host allreduce reads of its peers' arrays (and a gather writes), and
the errors it turns into PeerLost or ProtocolError when a peer is gone or its memory is not
where it said."""
from __future__ import annotations

import ctypes
import multiprocessing as mp

import numpy as np
import pytest

from collectives.transport import cma

pytestmark = pytest.mark.skipif(not cma.available(), reason="no process_vm_readv here")


def _hold(conn) -> None:
    """A process with a known array: send its pid and address, wait to be told to end."""
    cma.allow_readers()
    x = np.arange(1 << 20, dtype=np.float32)
    import os
    conn.send((os.getpid(), x.ctypes.data))
    conn.recv()


def test_a_read_copies_the_other_process_memory_and_a_gone_process_is_esrch():
    ctx = mp.get_context("spawn")
    ours, theirs = ctx.Pipe()
    child = ctx.Process(target=_hold, args=(theirs,))
    child.start()
    try:
        assert ours.poll(60), "the child did not start"
        pid, address = ours.recv()
        reader = cma.Reader()
        into = np.empty(1 << 20, dtype=np.float32)
        reader.read(pid, address, into.ctypes.data, into.nbytes)
        assert np.array_equal(into, np.arange(1 << 20, dtype=np.float32))
        assert reader.probe(pid, address)
        # A write lands in its memory: read back what was written over its second half.
        half = np.full(1 << 19, -1.0, dtype=np.float32)
        reader.write(pid, address + half.nbytes, half.ctypes.data, half.nbytes)
        reader.read(pid, address, into.ctypes.data, into.nbytes)
        assert np.array_equal(into[:1 << 19], np.arange(1 << 19, dtype=np.float32))
        assert np.array_equal(into[1 << 19:], half)
        with pytest.raises(OSError) as err:   # nowhere mapped there: EFAULT
            reader.write(pid, 8, half.ctypes.data, 8)
        assert err.value.errno == 14
        # An address the other process does not map: EFAULT, nothing written here.
        probe = ctypes.c_int64(7)
        with pytest.raises(OSError) as err:
            reader.read(pid, 8, ctypes.addressof(probe), 8)
        assert err.value.errno == 14 and probe.value == 7
        assert not reader.probe(pid, 8)
        ours.send("end")
        child.join(30)
        assert child.exitcode == 0
        with pytest.raises(OSError) as err:   # the process is gone: ESRCH
            reader.read(pid, address, into.ctypes.data, 8)
        assert err.value.errno == 3
        with pytest.raises(OSError) as err:
            reader.write(pid, address, into.ctypes.data, 8)
        assert err.value.errno == 3
        assert not reader.probe(pid, address)
    finally:
        if child.is_alive():
            child.kill()
            child.join(10)
