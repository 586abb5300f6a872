"""gossip: a decentralized gossip / allreduce runtime for data-parallel training.

    import gossip
    with gossip.init() as peer:            # rank, world size, rendezvous from the launcher
        peer.allreduce(x, op="mean")
        peer.neighbor_average(params, step=t)

torch is imported only where torch objects are handled, so ``import gossip`` stays light;
``import gossip`` also registers the torch.distributed backend "gossip" (gossip/torch_backend/),
at once when torch is imported already, else as soon as it is (gossip/torch_import_hook.py:
the import order does not matter);
``gossip.testing`` (the multi-process harness) and ``gossip.ddp_hooks`` (DDP's communication
hooks, gossip/torch_backend/ddp_hooks.py) are imported on first use, for the same reason.
"""
from gossip.errors import (AuthenticationError, ExchangeIncomplete, GossipError,
                           OperationTimeout, PeerLost, ProtocolError, RendezvousError,
                           SnapshotCorrupt, SnapshotError, SnapshotMismatch, TopologyError,
                           UnsupportedDtype)
from collectives import Status
from gossip.peer import Peer
from gossip.runtime import init
from gossip import policies
from gossip.optim import DistributedOptimizer, broadcast_parameters
from gossip.optimizer_state import broadcast_optimizer_state
from gossip.sampler import ElasticSampler
from gossip.snapshot import Snapshot, SnapshotReceiver
from gossip.checkpoint import load_checkpoint, save_checkpoint

__version__ = "0.1.0"
"""The package's version (setup.py's)."""

# "gossip" becomes a c10d backend: now in a torch user's process, or when torch is imported.
from gossip.torch_import_hook import register_when_torch_loads as _register_when_torch_loads

_register_when_torch_loads()

__all__ = [
    "init", "Peer", "Status",
    "policies", "DistributedOptimizer", "broadcast_parameters", "broadcast_optimizer_state",
    "ElasticSampler",
    "GossipError", "PeerLost", "OperationTimeout", "RendezvousError", "ProtocolError",
    "AuthenticationError", "TopologyError", "ExchangeIncomplete", "UnsupportedDtype",
    "Snapshot", "SnapshotReceiver", "save_checkpoint", "load_checkpoint",
    "SnapshotError", "SnapshotMismatch", "SnapshotCorrupt",
    "__version__",
]


# ``gossip.testing.spawn(...)`` after a plain ``import gossip``, without every import of
# gossip paying for the harness (nor for torch: ``from gossip import ddp_hooks``): the module
# loads on first access (PEP 562).
_LAZY = {"testing": "gossip.testing", "ddp_hooks": "gossip.torch_backend.ddp_hooks"}


def __getattr__(name: str):
    if name in _LAZY:
        import importlib

        return importlib.import_module(_LAZY[name])
    raise AttributeError(f"module 'gossip' has no attribute {name!r}")
