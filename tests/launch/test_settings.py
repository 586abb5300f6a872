"""Launcher conventions: where rank, world size and the rendezvous address come from."""
import pytest

from collectives.errors import RendezvousError
from gossip.settings import first_slurm_host, resolve_settings


def test_world_of_one_without_variables():
    s = resolve_settings(env={})
    assert (s.rank, s.world_size, s.local_rank, s.rendezvous) == (0, 1, 0, "tcp://127.0.0.1:29500")


def test_torchrun():
    s = resolve_settings(env={"RANK": "3", "WORLD_SIZE": "8", "LOCAL_RANK": "1",
                              "MASTER_ADDR": "node7", "MASTER_PORT": "1234"})
    assert (s.rank, s.world_size, s.local_rank, s.master_addr, s.master_port, s.source) == \
        (3, 8, 1, "node7", 1234, "torchrun")
    assert not s.is_local


def test_torchrun_agent_store_keeps_master_port_so_gossip_takes_the_next():
    env = {"RANK": "0", "WORLD_SIZE": "2", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29400",
           "TORCHELASTIC_USE_AGENT_STORE": "True"}
    assert resolve_settings(env=env).master_port == 29401
    assert resolve_settings(env={**env, "GOSSIP_MASTER_PORT": "31000"}).master_port == 31000


def test_slurm_master_from_node_list():
    s = resolve_settings(env={"SLURM_PROCID": "5", "SLURM_NTASKS": "16", "SLURM_LOCALID": "1",
                              "SLURM_JOB_NODELIST": "gpu[07-10,12],cpu1", "SLURM_JOB_ID": "4242"})
    assert (s.rank, s.world_size, s.local_rank, s.master_addr, s.source) == \
        (5, 16, 1, "gpu07", "SLURM")
    assert s.master_port == 20000 + 4242 % 20000


def test_openmpi_single_node():
    s = resolve_settings(env={"OMPI_COMM_WORLD_RANK": "2", "OMPI_COMM_WORLD_SIZE": "4",
                              "OMPI_COMM_WORLD_LOCAL_RANK": "2",
                              "OMPI_COMM_WORLD_LOCAL_SIZE": "4"})
    assert (s.rank, s.world_size, s.local_rank, s.master_addr, s.source) == \
        (2, 4, 2, "127.0.0.1", "OpenMPI")


def test_openmpi_multi_node_needs_master_addr():
    with pytest.raises(RendezvousError, match="MASTER_ADDR"):
        resolve_settings(env={"OMPI_COMM_WORLD_RANK": "0", "OMPI_COMM_WORLD_SIZE": "8",
                              "OMPI_COMM_WORLD_LOCAL_SIZE": "4"})


def test_precedence_arguments_then_gossip_then_torchrun_then_slurm():
    env = {"GOSSIP_RANK": "1", "RANK": "2", "SLURM_PROCID": "3", "WORLD_SIZE": "4",
           "GOSSIP_WORLD_SIZE": "6", "SLURM_NTASKS": "9", "MASTER_ADDR": "a",
           "GOSSIP_MASTER_ADDR": "b", "MASTER_PORT": "1000", "GOSSIP_MASTER_PORT": "2000"}
    s = resolve_settings(env=env)
    assert (s.rank, s.world_size, s.master_addr, s.master_port, s.source) == \
        (1, 6, "b", 2000, "GOSSIP_*")
    s = resolve_settings(rank=5, world_size=7, rendezvous="tcp://10.1.2.3:555", env=env)
    assert (s.rank, s.world_size, s.rendezvous, s.source) == (5, 7, "tcp://10.1.2.3:555",
                                                                 "arguments")
    env.pop("GOSSIP_RANK")
    assert resolve_settings(env=env).rank == 2


@pytest.mark.parametrize("env, match", [
    ({"RANK": "x", "WORLD_SIZE": "2"}, "not an integer"),
    ({"RANK": "4", "WORLD_SIZE": "4"}, "outside world size"),
    ({"RANK": "0", "WORLD_SIZE": "0"}, "positive"),
    ({"GOSSIP_RENDEZVOUS": "nowhere"}, "tcp://HOST:PORT"),
    ({"MASTER_PORT": "70000"}, "valid TCP port"),
])
def test_bad_settings(env, match):
    with pytest.raises(RendezvousError, match=match):
        resolve_settings(env=env)


@pytest.mark.parametrize("nodes, first", [("n1", "n1"), ("n[1-4]", "n1"), ("a[003,7],b", "a003"),
                                          ("x-y[10-12]", "x-y10")])
def test_first_slurm_host(nodes, first):
    assert first_slurm_host(nodes) == first
