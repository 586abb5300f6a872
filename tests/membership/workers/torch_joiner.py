"""usage: torch_joiner.py SIZE TESTS_DIR  (GOSSIP_RENDEZVOUS, GOSSIP_MEMBER_NAME set)

A process joining a running Synchronous group with a DistributedOptimizer around SGD with
momentum (tests/membership/test_membership.py, whose torch_step it imports from TESTS_DIR):
it takes parameters, momentum and step, and prints PARAMS with its parameters' bytes."""
import sys, time, torch, gossip
sys.path.insert(0, sys.argv[2])
from test_membership import torch_step
from gossip.policies import Synchronous
peer = gossip.init(join=True, timeout=30)
torch.manual_seed(99)
model = torch.nn.Linear(8, 1)
opt = gossip.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.01,
                                                  momentum=0.9),
                                  peer=peer, policy=Synchronous())   # takes the state
while (opt.policy.step < 30 or peer.world_size < int(sys.argv[1])) \
        and opt.policy.step < 100_000:
    torch_step(model, opt, peer.rank, opt.policy.step)
    torch.ones(96, 96) @ torch.ones(96, 96)   # a step's compute
for _ in range(10):
    torch_step(model, opt, peer.rank, opt.policy.step)
print("PARAMS", b"".join(p.detach().numpy().tobytes() for p in model.parameters()).hex(),
      flush=True)
peer.close()
