"""Simulation of many peers in one process.

``simulate_mixing`` runs the mixing dynamics alone, vectorised over sparse mixing matrices:
n peers' values, one ``x <- W_t x`` (gossip) or push-sum round per step, the consensus
distance after each, to 65,536 peers and beyond in seconds. It is the math the gossip and
push-sum policies' rounds carry out, checked against them on real peers
(tests/simulation/test_mixing.py); it does not run the policies' code, train a model, or
charge a network's time.
"""
from gossip.simulation.mixing import MIXING_RULES, MixingTrace, simulate_mixing

__all__ = ["simulate_mixing", "MixingTrace", "MIXING_RULES"]
