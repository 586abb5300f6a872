"""Shared fixtures: leak checks for threads and ipc sockets; a cluster key for tests that start
processes beside a group."""
from __future__ import annotations

import os
import signal
import threading

import pytest

from collectives.security import write_cluster_key
from gossip.snapshot import crc
from gossip.testing import wait_until
from helpers import ipc_sockets


# A suite started in the background by a non-interactive shell (`pytest &`, nohup) inherits
# SIGINT ignored, and so would every process it starts (an ignored signal stays ignored
# across exec): the tests that send SIGINT to a launcher or a demo would wait out their
# timeouts and fail (4 of them, 420 s). The tests send it on purpose, so the suite takes it
# back: a Python handler is reset to the default in the children at exec.
if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)


def gossip_threads() -> list[str]:
    """The gossip threads alive, but the process's checksum pool (gossip/snapshot/crc.py):
    shared by every peer of the process and idle between sums, it lives as long as the
    process, as torch's intra-op threads do."""
    return [t.name for t in threading.enumerate() if t.name.startswith("gossip-")
            and not t.name.startswith(crc.THREAD_PREFIX)]


@pytest.fixture
def no_leaks():
    """Fail the test if it leaves a gossip thread or an ipc socket of this process."""
    before = ipc_sockets(os.getpid())
    yield
    try:
        wait_until(lambda: not gossip_threads(), 2.0, what="the end of gossip threads")
    except TimeoutError:
        pass
    assert gossip_threads() == []
    assert ipc_sockets(os.getpid()) - before == set()


@pytest.fixture
def group_key(tmp_path, monkeypatch):
    """A cluster key for the test's groups and for the processes it starts beside them (a
    joiner, a restarted member, a second `gossip run` node): written to tmp_path and set as
    GOSSIP_KEY in this process, which gossip.testing.spawn takes as its key and every process
    started with this environment inherits. Returns the key file's path."""
    path = tmp_path / "group.key"
    write_cluster_key(path)
    monkeypatch.setenv("GOSSIP_KEY", str(path))
    return str(path)


# ------------------------------------------------------------ tests that CI runs after the default
# The default run stays under 10 minutes on 2 cores (CONTRIBUTING.md). These tests are longer
# (6-18 s each: real launchers, 10 s waits, torch) and each shares its behaviour's default
# coverage with a shorter test or a docs block; .ci/run runs them after the default run with
# `pytest -m ci`, so every one of them still gates a merge. Listed here, by node id, so the
# choice is in one place.
CI_AFTER_DEFAULT = (
    "tests/examples/test_examples_restart.py::test_the_readme_quick_start_survives_a_restart",
    "tests/demo/test_demo.py::test_the_story_runs_each_scenario_and_writes_a_panel_for_each",
    "tests/backend/test_torch_backend.py::test_c10d_collectives_ddp_and_a_lost_rank_under_torchrun",
    "tests/examples/test_examples.py::test_examples_slurm_sbatch_under_a_real_sbatch",
    "tests/launch/test_logging.py::test_a_wait_longer_than_ten_seconds_names_what_it_waits_for_at_"
    "the_default_level[tcp]",
    "tests/launch/test_logging.py::test_a_rendezvous_missing_a_rank_says_so_before_its_timeout",
    "tests/membership/test_membership.py::test_a_joiner_with_another_model_is_told_which_of_its_"
    "own_parameters_differs[torch-named0]",
    "tests/membership/test_interrupted_steps.py::test_a_torch_step_cut_off_by_a_death_is_done_"
    "again_exactly_once",
    "tests/security/test_secure_by_default.py::test_gossip_run_peers_hold_a_key_of_the_job_and_"
    "only_its_holders_join",
    "tests/membership/test_snapshot.py::test_a_job_saved_by_two_peers_resumes_exactly_as_if_it_"
    "never_stopped",
    "tests/launch/test_netns.py::test_gossip_converges_over_slow_links[0.0]",
    "tests/security/test_hostile.py::test_flood_for_future_operations_is_bounded_and_cut",
    "tests/bench/test_bench.py::test_bench_vs_gloo",
    "tests/collectives/test_agreement.py::test_a_timeout_names_the_rank_that_never_started_the_call",
    "tests/security/test_hostile.py::test_ten_thousand_hostile_frames_during_allreduce",
    "tests/membership/test_membership.py::test_a_joiner_that_finds_no_job_waits_its_whole_timeout",
    "tests/policies/test_reliability.py::test_nan_guard_skips_the_step_everywhere_synchronous_and_"
    "keeps_neighbours_finite[synchronous]",
    "tests/membership/test_identity.py::test_a_member_replaced_while_stopped_stops_naming_its_"
    "replacement",
    "tests/launch/test_rendezvous.py::test_duplicate_rank",
    "tests/security/test_secure_by_default.py::test_init_warns_once_under_torchrun_variables_"
    "without_a_key",
    "tests/launch/test_netns.py::test_a_cut_host_is_dropped_and_training_converges[gossip-switch-"
    "False]",
    "tests/policies/test_policies_compression.py::test_synchronous_with_a_codec_keeps_replicas_"
    "identical_and_trains[int8]",
    "tests/membership/test_elastic_nodes.py::test_a_node_beyond_min_joins_the_running_job_and_one_"
    "beyond_max_is_refused",
    "tests/bench/test_bench_mpi.py::test_vs_mpi_prints_an_mpi_column_with_figures",
    # slow-marked, and gating CI all the same:
    "tests/examples/test_examples.py::test_train_torch_under_a_real_openmpi_mpirun",
    "tests/examples/test_examples.py::test_train_torch_under_gossip_run_with_four_peers",
    "tests/policies/test_policies_torch.py::test_every_policy_trains_digits_within_two_points_of_"
    "single_process_sgd",
    "tests/membership/test_interrupted_steps.py::test_no_sample_is_trained_twice_or_skipped_when_a_"
    "death_cuts_a_step_off[torch]",
)


def pytest_collection_modifyitems(config, items):
    """Mark the tests of CI_AFTER_DEFAULT `ci` (not in the default run: see pyproject's addopts)."""
    listed = set(CI_AFTER_DEFAULT)
    for item in items:
        if item.nodeid in listed:
            item.add_marker(pytest.mark.ci)
