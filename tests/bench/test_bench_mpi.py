"""`gossip bench --vs mpi`: mpi4py under OpenMPI's mpirun in the same run, real processes;
shapes and messages only, never timings."""
from __future__ import annotations

import importlib
import os
import shutil
import subprocess
import sys

import pytest

from gossip.bench import BenchError, OPS
from gossip.bench.mpi import mpi_group

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _mpi_missing() -> str | None:
    try:
        importlib.import_module("mpi4py")
    except ImportError as exc:
        return f"mpi4py is not importable ({exc}): pip install mpi4py"
    if shutil.which("mpirun") is None:
        return "OpenMPI's mpirun is not on PATH: apt-get install openmpi-bin"
    return None


MISSING = _mpi_missing()
needs_mpi = pytest.mark.skipif(MISSING is not None, reason=MISSING or "")


def gossip(*args, env=None, timeout=120):
    return subprocess.run([sys.executable, "-m", "gossip", *args], capture_output=True,
                          text=True, timeout=timeout, cwd=ROOT, env=env)


def table_rows(stdout: str) -> list[list[str]]:
    return [line.split() for line in stdout.splitlines() if line.strip()
            and not line.startswith("#")]


@needs_mpi
def test_vs_mpi_prints_an_mpi_column_with_figures():
    out = gossip("bench", "allreduce", "-n", "2", "--sizes", "4K", "--iters", "3",
                 "--warmup", "1", "--vs", "mpi")
    assert out.returncode == 0, out.stderr
    header = [line for line in out.stdout.splitlines() if line.startswith("#")]
    assert "OpenMPI" in header[0]
    assert any("mpi time" in line and "mpi busbw" in line and "ratio" in line
               for line in header), header
    (row,) = table_rows(out.stdout)
    bar = row.index("|")
    mpi_us, mpi_busbw, ratio = (float(v) for v in row[bar + 1:])
    assert row[0] == "4096" and mpi_us > 0 and mpi_busbw > 0 and ratio > 0
    assert any(line.startswith("# mpi: Open MPI") and "vader" in line
               for line in header), header
    assert "; mpi " in out.stdout.splitlines()[-1]   # its average busbw


def test_vs_mpi_without_mpi4py_is_one_line_saying_how_to_install(tmp_path):
    shim = tmp_path / "mpi4py"
    shim.mkdir()
    (shim / "__init__.py").write_text("raise ImportError('no mpi4py in this test')\n")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(
        [str(tmp_path), *filter(None, [os.environ.get("PYTHONPATH")])]))
    out = gossip("bench", "allreduce", "-n", "2", "--sizes", "4K", "--vs", "gloo,mpi", env=env,
                 timeout=60)
    assert out.returncode == 2, (out.stdout, out.stderr)
    assert "Traceback" not in out.stderr and out.stdout == ""
    (line,) = out.stderr.strip().splitlines()
    assert "mpi4py" in line and "pip install mpi4py" in line and "libopenmpi-dev" in line


@needs_mpi
# allreduce in the default run; the other ops (an mpirun start each, 3-4 s) under -m slow.
@pytest.mark.parametrize("op", [op if op == "allreduce" else pytest.param(op, marks=pytest.mark.slow)
                                for op in OPS])
def test_mpi_ranks_do_every_operation(op):
    """Each operation's MPI step runs and checks its result in the ranks (n = 3: the rings'
    two neighbours differ; p2p: 2)."""
    n = 2 if op == "p2p" else 3
    group = mpi_group(op, n, reduce_op="mean")
    group.start()
    try:
        group.ready(60)
        per_rank = group.measure((3 * 4 * 16, 1, 2, 1), 60)
    finally:
        group.close(abort=True)
    assert len(per_rank) == n
    assert all(len(r["times"]) == 2 and min(r["times"]) > 0 for r in per_rank)
    assert group.hello[0]["library"].startswith("Open MPI")


@needs_mpi
def test_a_failing_rank_is_an_error_with_its_traceback_not_a_hang():
    group = mpi_group("frobnicate", 2, reduce_op="sum")
    group.start()
    try:
        group.ready(60)
        with pytest.raises(BenchError, match="unknown operation 'frobnicate'"):
            group.measure((4096, 0, 1, 1), 60)
    finally:
        group.close(abort=True)
