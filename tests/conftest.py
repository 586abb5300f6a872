"""Shared fixtures: leak checks for threads and ipc sockets; a cluster key for tests that start
processes beside a group."""
from __future__ import annotations

import os
import signal
import threading
from collections import Counter

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
    *(f"tests/simulation/test_mixing.py::test_the_vectorised_mode_equals_the_per_peer_mode_at_"
      f"1024_peers[{c}]" for c in ("ring-gossip", "exponential-push-sum")),
    *(f"tests/simulation/test_training.py::test_the_simulated_peers_end_where_real_peers_end[{c}]"
      for c in ("synchronous-ring-8", "gossip-ring-8", "push-sum-exponential-8")),
    # (all three: the default run keeps the codec clock test)
    "tests/simulation/test_training.py::test_the_simulated_codecs_end_where_real_ones_end",
    "tests/simulation/test_simulate_cli.py::"
    "test_train_runs_each_policy_that_takes_a_codec_once_per_codec",
    *("tests/simulation/test_deaths.py::test_leaves_at_once_with_a_restart_and_a_join_the_same_"
      f"twice[{c}]" for c in ("synchronous-options0", "local-sgd-options1", "gossip-options2")),
    *(f"tests/simulation/test_mixing.py::test_consensus_decays_at_the_slem_at_1024_peers[{case}]"
      for case in ("Ring(1024)-100000", "Torus(32, 32)-2000", "Exponential(1024)-60",
                   "OnePeerExponential(1000)-60")),
    "tests/backend/test_ddp_dpsgd.py::test_dpsgd_in_ddp_code_trains_within_a_point_of_gloo_ddp",
    "tests/integrations/test_lightning.py::"
    "test_lightning_ddp_over_gossip_and_the_gossip_strategy_fit",
    "tests/integrations/test_ray.py::test_ray_train_backend_and_a_killed_actor_that_rejoins",
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
    # (the simulator's: the default run keeps test_deaths.py's churn, leaves and two-run checks)
    "tests/demo/test_demo_simulate.py::test_two_simulated_stories_write_the_same_json",
    "tests/simulation/test_simulate_cli.py::test_train_takes_deaths_from_a_churn_trace",
    "tests/simulation/test_deaths.py::test_a_leave_at_once_is_the_same_whichever_thread_lags",
    "tests/simulation/test_deaths.py::test_heavy_churn_with_restarts_gives_the_same_json_twice",
    "tests/simulation/test_training.py::test_the_simulated_peers_end_where_real_peers_end["
    "push-sum overlap-one-peer-exponential-4]",
    "tests/simulation/test_timing_fidelity.py::"
    "test_simulated_communication_time_is_within_20_percent_of_real_peers_on_shaped_links",
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


# The longest tests of the default run besides (3.4 s or more each in a default run of
# 2026-12-03 on 2 cores, about 180 s of its 614-733 s; CI's default run took 675 s): CI runs
# them after it, with the others above. The default run keeps a shorter test of each behaviour.
CI_LONGEST = (
    'tests/launch/test_launcher.py::test_first_failure_stops_the_others_with_its_exit_code',
    'tests/launch/test_launcher.py::test_keep_going_lets_the_others_finish_and_returns_the_fail'
    'ure',
    'tests/policies/test_reliability.py::test_gossip_policies_survive_a_killed_peer_and_heal_th'
    'e_ring[gossip]',
    'tests/security/test_secure_by_default.py::test_a_spawned_group_holds_a_key_of_its_own_and_'
    'refuses_a_keyless_joiner',
    'tests/membership/test_elastic_averaging_membership.py::test_a_death_part_way_through_a_rou'
    'nd_of_many_buckets_leaves_one_centre[delays0]',
    'tests/membership/test_elastic_sharded_membership.py::test_a_sharded_group_below_min_peers_'
    'raises_peer_lost_on_every_survivor',
    'tests/launch/test_launcher.py::test_peer_killed_by_a_signal_exits_128_plus_signal',
    'tests/membership/test_membership.py::test_a_donor_whose_share_is_not_the_state_is_named_an'
    'd_the_group_goes_on',
    'tests/membership/test_asynchronous_membership.py::test_a_joiner_enters_a_running_asynchron'
    'ous_group_and_the_mass_stays_exact',
    'tests/launch/test_netns.py::test_synchronous_survivors_raise_peer_lost_naming_the_cut_host'
    '[False]',
    'tests/membership/test_elastic_sharded_membership.py::test_survivors_between_rounds_below_m'
    'in_peers_raise_peer_lost_too',
    'tests/membership/test_membership.py::test_torchrun_max_restarts_re_forms_the_group',
    'tests/launch/test_rendezvous.py::test_rendezvous_under_each_launcher_convention[gossip]',
    'tests/security/test_hostile_senders.py::test_senders_of_bad_frames_are_disconnected_and_cu'
    't_again',
    'tests/membership/test_snapshot.py::test_every_policy_state_round_trips_with_torch_and_nump'
    'y',
    'tests/launch/test_shutdown.py::test_ctrl_c_on_gossip_run_ends_every_peer_and_leaves_nothin'
    'g',
    'tests/examples/test_examples.py::test_async_gossip_survivors_finish_after_a_peer_dies',
    'tests/membership/test_elastic_sharded_membership.py::test_a_killed_owners_shards_come_from'
    '_its_backup_bitwise[3]',
    'tests/policies/test_policies_faults.py::test_an_elastic_local_sgd_survivor_left_inside_the'
    '_averaging_takes_the_others_state[numpy]',
    'tests/launch/test_rendezvous.py::test_rendezvous_under_each_launcher_convention[torchrun]',
    'tests/launch/test_launcher.py::test_two_launchers_form_one_world_across_nodes',
    'tests/membership/test_left_out.py::test_a_member_stopped_past_the_timeout_is_left_out_and_'
    'comes_back_without_a_split',
    'tests/security/test_hostile_senders.py::test_flood_from_several_identities_is_bounded_in_t'
    'otal',
    'tests/launch/test_logging.py::test_debug_shows_the_rendezvous_connections_view_and_waits_t'
    'hat_info_does_not',
    'tests/launch/test_rendezvous.py::test_rendezvous_under_each_launcher_convention[openmpi]',
    'tests/launch/test_launcher.py::test_module_form',
    'tests/membership/test_jobs.py::test_a_peer_of_another_job_is_refused_at_the_rendezvous_nam'
    'ing_both',
    'tests/policies/test_policies.py::test_a_send_to_a_peer_dead_before_any_connection_raises_w'
    'ithin_the_timeout',
    'tests/collectives/test_transport.py::test_eight_peers_64_mib[tcp]',
    'tests/policies/test_policies_torch.py::test_distributed_optimizer_wraps_sgd_and_adam_and_r'
    'ound_trips_state',
    'tests/policies/test_reliability.py::test_asynchronous_fast_peers_keep_their_pace_beside_a_'
    'straggler',
    'tests/launch/test_launcher.py::test_signal_to_the_launcher_reaches_every_peer[SIGINT]',
    'tests/launch/test_launcher_failures.py::test_launchers_that_disagree_each_show_one_line_pe'
    'r_rank[job]',
    'tests/launch/test_rendezvous.py::test_rendezvous_under_each_launcher_convention[slurm]',
    'tests/membership/test_elastic_sharded_membership.py::test_a_joiner_enters_a_sharded_group_'
    'and_the_centre_is_conserved_bitwise',
    'tests/launch/test_launcher.py::test_bad_arguments_are_one_line_errors[gossip.run-args1-not'
    ' found]',
    'tests/launch/test_launcher.py::test_lines_of_many_peers_never_interleave',
    'tests/demo/test_demo.py::test_a_peer_raising_fails_the_demo_naming_the_error_and_policy',
    'tests/membership/test_membership.py::test_a_joiner_killed_midway_through_the_state_transfe'
    'r_leaves_the_donors_unharmed',
    'tests/launch/test_launcher.py::test_peers_do_not_outlive_a_killed_launcher',
    'tests/bench/test_bench_mpi.py::test_mpi_ranks_do_every_operation[allreduce]',
    'tests/membership/test_membership.py::test_no_sample_is_seen_twice_or_skipped_in_an_epoch_a'
    '_peer_joined_in',
    'tests/membership/test_push_sum_membership.py::test_two_joiners_from_one_donor_take_a_third'
    '_each',
    'tests/membership/test_elastic_sharded_membership.py::test_a_killed_owners_shards_come_from'
    '_its_backup_bitwise[0]',
    'tests/launch/test_launcher.py::test_bad_arguments_are_one_line_errors[gossip.run-args4-not'
    ' a valid TCP port]',
    'tests/launch/test_rendezvous.py::test_rank_zero_port_held_by_another_program',
    'tests/security/test_security.py::test_refused_rendezvous_handshakes_are_logged',
    'tests/launch/test_rendezvous.py::test_rank_zero_absent_fails_within_timeout_plus_one_secon'
    'd',
    'tests/launch/test_logging.py::test_deaths_and_view_changes_are_one_line_per_observer_at_th'
    'e_default_level[]',
    'tests/launch/test_netns.py::test_training_across_hosts_is_tcp_and_converges',
    'tests/examples/test_examples.py::test_async_gossip_with_a_slow_peer',
    'tests/launch/test_launcher_failures.py::test_a_held_rendezvous_port_is_one_line_per_rank_a'
    'nd_the_summary',
    'tests/membership/test_elastic_nodes.py::test_a_joiner_past_the_jobs_bound_is_refused_namin'
    'g_it',
    # (2026-12-06: CI39's default run took 672.6 s on a machine slower than CI38's 491.8 s;
    # these were its longest, 5-15 s each. The default run keeps gossip-ring-4 of the
    # simulator's fidelity, the asynchronous pairwise tests' first seeds and the other leaves.)
    'tests/membership/test_asynchronous_membership.py::test_a_member_leaves_an_asynchronous_gro'
    'up_and_the_others_go_on_in_a_smaller_view[False-pairwise]',
    'tests/backend/test_import_order.py::test_a_script_that_never_imports_gossip_gets_the_backe'
    'nd_from_torch',
    *(f"tests/simulation/test_training.py::test_the_simulated_peers_end_where_real_peers_end[{c}]"
      for c in ("synchronous-ring-4", "push-sum-one-peer-exponential-4", "local-sgd-ring-4")),
    'tests/policies/test_asynchronous_pairwise.py::test_pairwise_exchanges_keep_the_mass_and_br'
    'ing_the_peers_to_their_mean[3]',
    'tests/policies/test_asynchronous_pairwise.py::test_every_step_s_move_stays_in_the_sum_what'
    'ever_the_exchanges[3]',
    'tests/simulation/test_simulate_cli.py::test_train_measures_the_step_jitters_it_and_plots_t'
    'he_loss',
    'tests/simulation/test_simulate_cli.py::test_train_elastic_lets_the_lockstep_policies_survi'
    've_a_death',
)


def pytest_collection_modifyitems(config, items):
    """Mark the tests of CI_AFTER_DEFAULT and CI_LONGEST `ci` (not in the default run: see
    pyproject's addopts); a test named without its parameters, every parameter of it."""
    listed = set(CI_AFTER_DEFAULT) | set(CI_LONGEST)
    for item in items:
        if item.nodeid in listed or item.nodeid.split("[", 1)[0] in listed:
            item.add_marker(pytest.mark.ci)


# ------------------------------------------------------------ the docs blocks' summary
# After a run that included the pages' code blocks: how many ran, and every skip with its
# reason (each skip is reviewed: it is a block no test runs). Here, not in tests/docs: with
# -n 2 the summary is written by the process that hands out the tests, which loads this file
# only.
def pytest_terminal_summary(terminalreporter) -> None:
    reports = [r for key in ("passed", "failed", "skipped", "error")
               for r in terminalreporter.stats.get(key, [])
               if "test_code_blocks.py::test_code_block[" in getattr(r, "nodeid", "")
               and r.when in ("call", "setup")]
    if not reports:
        return
    outcomes = Counter("skipped" if r.skipped else "failed" if r.failed else "passed"
                       for r in reports if r.when == "call" or r.skipped)
    terminalreporter.write_sep("-", "docs code blocks")
    terminalreporter.write_line(f"{outcomes['passed']} ran and passed, {outcomes['failed']} "
                                f"failed, {outcomes['skipped']} skipped")
    for r in reports:
        if r.skipped and isinstance(r.longrepr, tuple):
            terminalreporter.write_line(f"  skipped {r.longrepr[2].removeprefix('Skipped: ')}")
