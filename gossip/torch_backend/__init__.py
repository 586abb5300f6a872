"""gossip inside torch.distributed: the c10d backend named "gossip" (process_group.py: each
process group a gossip Peer; c10d_work.py: the Work objects and futures its calls return) and
DDP's communication hooks over it (ddp_hooks.py, imported on first use: ``from gossip import
ddp_hooks``). Importing this package registers the backend; ``import gossip`` does so by
itself when torch is imported already.

    import torch, gossip                      # torch first: gossip registers the backend
    dist.init_process_group("gossip")         # (or: import gossip.torch_backend)
"""
from gossip.torch_backend.process_group import BACKEND_NAME, GossipProcessGroup, register
from gossip.torch_backend.c10d_work import GossipWork
from gossip.torch_backend.gossip_averager import GossipAverager

__all__ = ["BACKEND_NAME", "GossipProcessGroup", "register", "GossipWork", "GossipAverager"]
