"""A peer that only meets the others: gossip.init() from the launcher's variables (its
timeout from --timeout), then close. For rendezvous failures: a held port, an absent rank 0,
settings that disagree (--topology differs between two launchers)."""
import gossip

with gossip.init() as peer:
    print("MET", peer.rank, peer.world_size, flush=True)
