"""The "gossip" torch.distributed backend for scripts that import gossip before torch.

``import gossip`` registers the backend when torch is already imported (gossip/__init__.py).
When it is not, importing torch then would leave ``dist.init_process_group("gossip")`` to fail
with torch's "Unknown backend type gossip". So ``import gossip`` installs a finder instead
that waits for ``torch.distributed`` (which ``import torch`` loads) and, once that module has
run, imports gossip.torch_backend, which registers the backend. The finder serves that one
import and removes itself; torch is never imported by it. If the registration fails, a
warning says so and how to do it by hand.
"""
from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import logging
import sys
from collections.abc import Sequence
from types import ModuleType

__all__ = ["register_when_torch_loads", "autoload"]

log = logging.getLogger("gossip")

_MODULE = "torch.distributed"


class _RegisteringLoader(importlib.abc.Loader):
    """torch.distributed's own loader, then the backend's registration."""

    def __init__(self, inner: importlib.abc.Loader) -> None:
        self.inner = inner

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType | None:
        return self.inner.create_module(spec)

    def exec_module(self, module: ModuleType) -> None:
        self.inner.exec_module(module)
        try:
            importlib.import_module("gossip.torch_backend")
        except Exception as exc:   # torch itself must still import
            log.warning("gossip: could not register the torch.distributed backend 'gossip' as "
                        "torch loaded (%s: %s): import gossip after torch, or import "
                        "gossip.torch_backend before dist.init_process_group('gossip')",
                        type(exc).__name__, exc)


class _TorchDistributedFinder(importlib.abc.MetaPathFinder):
    """Finds torch.distributed with the finders after it, once, and wraps its loader."""

    def find_spec(self, fullname: str, path: Sequence[str] | None,
                  target: ModuleType | None = None) -> importlib.machinery.ModuleSpec | None:
        if fullname != _MODULE:
            return None
        if self in sys.meta_path:
            sys.meta_path.remove(self)
        for finder in list(sys.meta_path):
            find = getattr(finder, "find_spec", None)
            spec = find(fullname, path, target) if find is not None else None
            if spec is not None:
                if spec.loader is not None and hasattr(spec.loader, "exec_module"):
                    spec.loader = _RegisteringLoader(spec.loader)
                return spec
        return None


def register_when_torch_loads() -> None:
    """Register the backend as soon as torch.distributed is imported (at once if it is)."""
    if _MODULE in sys.modules:
        importlib.import_module("gossip.torch_backend")
        return
    if not any(isinstance(f, _TorchDistributedFinder) for f in sys.meta_path):
        sys.meta_path.insert(0, _TorchDistributedFinder())


def autoload() -> None:
    """torch's entry point (group "torch.backends", setup.py): ``import torch`` calls it in
    every process where gossip is installed, so ``init_process_group("gossip")`` works in
    processes that never import gossip (Ray Train's workers, Lightning's, a plain script's).
    It never raises: torch's import must not fail because of gossip (torch's own switch,
    ``TORCH_DEVICE_BACKEND_AUTOLOAD=0``, turns every such entry point off)."""
    try:
        importlib.import_module("gossip.torch_backend")
    except Exception as exc:
        log.warning("gossip: could not register the torch.distributed backend 'gossip' as "
                    "torch loaded (%s: %s): import gossip.torch_backend before "
                    "dist.init_process_group('gossip')", type(exc).__name__, exc)
