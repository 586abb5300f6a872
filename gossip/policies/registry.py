"""Policies by name: ``gossip.policies.make("gossip")``, and what ``policy="..."`` accepts in
gossip.DistributedOptimizer. A class's ``aliases`` are accepted too (EASGD: "easgd" and
"elastic" name ElasticAveraging)."""
from __future__ import annotations

from typing import Any

from gossip.policies.asynchronous import Asynchronous
from gossip.policies.base import Policy
from gossip.policies.dpsgd import Choco, Gossip
from gossip.policies.easgd import ElasticAveraging
from gossip.policies.push_sum import PushSum
from gossip.policies.synchronous import LocalSGD, Synchronous

__all__ = ["POLICIES", "ALIASES", "make", "names", "policy_class", "resolve"]

POLICIES: dict[str, type[Policy]] = {cls.name: cls for cls in (
    Synchronous, LocalSGD, Gossip, Asynchronous, PushSum, ElasticAveraging, Choco)}
"""Canonical name -> policy class."""
ALIASES: dict[str, type[Policy]] = {alias: cls for cls in POLICIES.values()
                                    for alias in cls.aliases}
"""Other accepted name -> policy class."""


def names() -> list[str]:
    """The known policy names, in the order they are documented."""
    return list(POLICIES)


def policy_class(name: str) -> type[Policy]:
    """The policy class of the given name (case and ``_``/``-`` do not matter). Unknown
    names raise ValueError listing the known ones, non-strings TypeError."""
    if not isinstance(name, str):
        raise TypeError(f"policy name must be a string, got {type(name).__name__}")
    key = name.strip().lower().replace("_", "-")
    cls = POLICIES.get(key) or ALIASES.get(key)
    if cls is None:
        raise ValueError(f"unknown policy {name!r}; known policies: {', '.join(POLICIES)}")
    return cls


def make(name: str, **kwargs: Any) -> Policy:
    """A new policy of the given name (see policy_class), constructed with ``kwargs``."""
    return policy_class(name)(**kwargs)


def resolve(policy: Any) -> Policy:
    """A Policy instance from an instance or a name."""
    if isinstance(policy, Policy):
        return policy
    if isinstance(policy, str):
        return make(policy)
    if isinstance(policy, type) and issubclass(policy, Policy):
        raise TypeError(f"pass an instance, e.g. {policy.__name__}(), not the class")
    raise TypeError(f"policy must be a name ({', '.join(POLICIES)}) or a Policy instance, got "
                    f"{type(policy).__name__}")
