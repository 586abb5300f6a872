"""A peer started by hand with a launcher's variables (tests/security/test_secure_by_default.py):
gossip.init() from them, a barrier, MET with its rank and whether it holds a key."""
import gossip
peer = gossip.init(timeout=30)
peer.barrier()
print("MET", peer.rank, peer.transport.config.key is not None, flush=True)
peer.close()
