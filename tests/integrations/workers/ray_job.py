"""usage: ray_job.py OUT_DIR  (tests/integrations/test_ray.py)

A real Ray cluster of two nodes on this machine (ray.cluster_utils.Cluster: a head and a
second node, 2 CPUs each), then two jobs on it:

1. Ray Train: ``TorchTrainer(..., torch_config=TorchConfig(backend="gossip"))`` with 4 workers
   spread over both nodes, running DDP code (``local_hook``) with a ``GossipAverager`` after
   each optimizer step; rank 0 writes ``OUT_DIR/trainer.json``.
2. ``gossip.ray.run(train, num_workers=4, max_restarts=1)``: the README's quick-start loop in
   each actor; rank 1's first incarnation writes its pid to ``OUT_DIR/victim.pid`` at step
   KILL_STEP and waits there for the test's SIGKILL; Ray starts the actor again, it rejoins
   the running job; the others take slow steps (0.25 s) from a few steps before the kill until
   rank 1's new incarnation is a member of their view. Prints ``RAYRUN <json>``.
3. ``gossip.ray.run(grow, num_workers=(2, 4))`` with one "peer" resource per worker: the head
   has two, so two peers form the job; at rank 0's step 10 a third node with two more is
   added to the cluster, Ray starts the two waiting actors there and they join the running
   job; the members take slow steps until their view has all four. Prints
   ``ELASTIC <json>``.
"""
import json
import os
import subprocess
import sys
import threading
import time

import ray
from ray.cluster_utils import Cluster

from gossip.testing import wait_until

OUT = sys.argv[1]
STEPS, KILL_STEP = 60, 20


def ddp_loop(config):
    import torch
    import torch.distributed as dist
    import torch.nn.functional as F

    from gossip import ddp_hooks
    from gossip.torch_backend import GossipAverager
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(10, 16), torch.nn.ReLU(), torch.nn.Linear(16, 1))
    ddp = torch.nn.parallel.DistributedDataParallel(model)
    ddp.register_comm_hook(None, ddp_hooks.local_hook)
    averager = GossipAverager()
    optimizer = torch.optim.SGD(ddp.parameters(), lr=0.05)
    data = torch.Generator().manual_seed(rank)
    for _ in range(100):
        x = torch.randn(32, 10, generator=data)
        loss = F.mse_loss(ddp(x), x.sum(1, keepdim=True))
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        averager.average_parameters(ddp.parameters())
    distance = averager.consensus_distance(model.parameters())
    losses = [torch.zeros(1) for _ in range(world)]
    dist.all_gather(losses, loss.detach().reshape(1))
    if rank == 0:
        with open(os.path.join(config["out"], "trainer.json"), "w") as f:
            json.dump({"backend": dist.get_backend(), "world": world,
                       "topology": str(dist.group.WORLD.peer.topology),
                       "losses": [float(v) for v in losses], "consensus": distance}, f)


def quick_start(config):
    import torch

    import gossip
    first = os.environ["GOSSIP_INCARNATION"] == "0"
    peer = gossip.init()
    model = torch.nn.Linear(10, 1)
    gossip.broadcast_parameters(model, root=0, peer=peer)
    opt = gossip.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.05),
                                      peer=peer, policy="gossip")
    slot = os.environ["RANK"]

    def restarted_is_back():
        view = peer.view
        return view is not None and any(m.name == "rank1" and m.incarnation > 0
                                        for m in view.members)

    for step in range(STEPS):
        if first and slot == "1" and step == KILL_STEP:
            path = os.path.join(config["out"], "victim.pid")
            with open(path + ".tmp", "w") as f:
                f.write(str(os.getpid()))
            os.replace(path + ".tmp", path)
            time.sleep(120)   # the test SIGKILLs this process here
        elif step >= KILL_STEP - 10 and not restarted_is_back():
            time.sleep(0.25)
        x = torch.randn(32, 10)
        loss = ((model(x) - x.sum(1, keepdim=True)) ** 2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
    result = {"slot": int(slot), "incarnation": int(os.environ["GOSSIP_INCARNATION"]),
              "loss": float(loss), "node": ray.get_runtime_context().get_node_id(),
              "saw_restart": restarted_is_back() or not first}
    opt.close()
    peer.close()
    return result


def grow(config):
    import torch

    import gossip
    peer = gossip.init()
    model = torch.nn.Linear(10, 1)
    gossip.broadcast_parameters(model, root=0, peer=peer)   # (skipped on a joiner)
    opt = gossip.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.05),
                                      peer=peer, policy="gossip")
    slot, largest, waited = int(os.environ["RANK"]), 0, 0.0
    for step in range(4 * STEPS):
        size = len(peer.view.members) if peer.view is not None else peer.world_size
        largest = max(largest, size)
        if slot == 0 and step == 10:
            open(os.path.join(config["out"], "grow"), "w").close()
        if slot < 2 and step >= 10 and largest < 4 and waited < 150:
            time.sleep(0.25)   # a real model's step, while the new node and its peers start
            waited += 0.25
        x = torch.randn(32, 10)
        loss = ((model(x) - x.sum(1, keepdim=True)) ** 2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
    result = {"slot": slot, "joined": os.environ.get("GOSSIP_JOIN") == "1",
              "largest_view": largest, "loss": float(loss.detach()), "waited": waited,
              "node": ray.get_runtime_context().get_node_id()}
    opt.close()
    peer.close()
    return result


def main() -> None:
    cluster = Cluster(initialize_head=True,
                      head_node_args={"num_cpus": 2, "resources": {"peer": 2},
                                      "include_dashboard": False})
    cluster.add_node(num_cpus=2)
    env = {"PYTHONPATH": os.environ.get("PYTHONPATH", ""), "OMP_NUM_THREADS": "1",
           "GOSSIP_TIMEOUT": "60"}
    ray.init(address=cluster.address, runtime_env={"env_vars": env}, log_to_driver=True)
    grown: list = []
    try:
        from ray.train import RunConfig, ScalingConfig
        from ray.train.torch import TorchConfig, TorchTrainer
        TorchTrainer(ddp_loop, train_loop_config={"out": OUT},
                     torch_config=TorchConfig(backend="gossip"),
                     scaling_config=ScalingConfig(num_workers=4, placement_strategy="SPREAD"),
                     run_config=RunConfig(storage_path=os.path.join(OUT, "ray_results"))).fit()
        print("TRAINER", open(os.path.join(OUT, "trainer.json")).read(), flush=True)

        import gossip.ray
        results = gossip.ray.run(quick_start, num_workers=4, config={"out": OUT},
                                 max_restarts=1, timeout=400)
        print("RAYRUN", json.dumps(results), flush=True)

        def add_a_node_when_asked():   # (a node of its own process, as on a real machine:
            try:                           # Cluster.add_node needs the main thread)
                wait_until(lambda: os.path.exists(os.path.join(OUT, "grow")), 300,
                           what="rank 0 of the elastic job asking for a node")
            except TimeoutError:
                return
            grown.append(subprocess.Popen(
                [os.path.join(os.path.dirname(sys.executable), "ray"), "start", "--block",
                 f"--address={cluster.address}", "--num-cpus=2", '--resources={"peer": 2}',
                 "--disable-usage-stats"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                start_new_session=True))

        threading.Thread(target=add_a_node_when_asked, daemon=True).start()
        results = gossip.ray.run(grow, num_workers=(2, 4), config={"out": OUT},
                                 resources_per_worker={"CPU": 0.5, "peer": 1},
                                 placement_strategy="PACK", timeout=400)
        print("ELASTIC", json.dumps(results), flush=True)
        print("NODES", len([n for n in ray.nodes() if n["Alive"]]), flush=True)
        for node in grown:
            node.terminate()   # (ray start --block stops the node's processes)
            node.wait(timeout=60)
    finally:
        for node in grown:   # (its own session: the test's kill of this one would miss it)
            if node.poll() is None:
                node.kill()
        ray.shutdown()
        cluster.shutdown()
        # `ray start` (the grown node) wrote this cluster's address to /tmp/ray/
        # ray_current_cluster, where a later bare ray.init() would look for a cluster to join.
        address_file = ray._private.utils.get_ray_address_file(None)
        if os.path.exists(address_file) and open(address_file).read().strip() == cluster.address:
            os.remove(address_file)


if __name__ == "__main__":
    main()
