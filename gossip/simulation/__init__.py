"""Simulation of many peers in one process.

``simulate_training`` runs the project's real policy classes (synchronous, local SGD and
DiLoCo, gossip, push-sum with or without overlap, asynchronous on virtual threads:
``Scheduler``) for N peers as threads of one process, each on a
SimHost (a PolicyHost over an in-memory fabric) with a virtual clock: each step's compute and
each message's latency and bytes are charged by the spec's models, and the results are the
same as a real multi-process run's (tests/simulation/test_training.py). ``simulate_mixing``
runs the mixing dynamics alone, vectorised over the sparse mixing matrices, to 65,536 peers
and beyond in seconds.
"""
from gossip.simulation.churn import Churn
from gossip.simulation.fabric import Fabric, collective_seconds
from gossip.simulation.links import Links
from gossip.simulation.mixing import MIXING_RULES, MixingTrace, simulate_mixing
from gossip.simulation.scheduler import Scheduler, SimulationDeadlock
from gossip.simulation.sim_host import SimHost
from gossip.simulation.training import (SIMULATED_POLICIES, PeerResult, TrainingResult,
                                        TrainingSpec, measure_step_seconds,
                                        simulate_training, train_peer)

__all__ = ["simulate_training", "TrainingSpec", "TrainingResult", "PeerResult", "train_peer",
           "SIMULATED_POLICIES", "SimHost", "Scheduler", "SimulationDeadlock", "Fabric", "Churn", "Links", "collective_seconds",
           "simulate_mixing", "MixingTrace", "MIXING_RULES", "measure_step_seconds"]
