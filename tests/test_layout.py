"""The layout's rules, read from the source: the layers import one way (topologies <- collectives
<- gossip, never back), no module imports itself in a circle (function-level imports count:
they only move the cycle to run time), and every module declares ``__all__``."""
from __future__ import annotations

import ast
import os

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PACKAGES = ("topologies", "collectives", "gossip")
# What each layer may import from the project: nothing above it.
ALLOWED = {"topologies": {"topologies"}, "collectives": {"collectives"},
           "gossip": {"gossip", "collectives", "topologies"}}


def _modules() -> dict[str, str]:
    found = {}
    for top in PACKAGES:
        for root, _, files in os.walk(os.path.join(REPO, top)):
            for name in files:
                if name.endswith(".py"):
                    path = os.path.join(root, name)
                    module = os.path.relpath(path, REPO)[:-3].replace(os.sep, ".")
                    found[module.removesuffix(".__init__")] = path
    return found


MODULES = _modules()


def _imports(path: str) -> set[str]:
    """The project modules ``path`` imports, anywhere in it (``from pkg import sub`` names
    the submodule when there is one)."""
    out = set()
    for node in ast.walk(ast.parse(open(path, encoding="utf-8").read())):
        if isinstance(node, ast.Import):
            out.update(a.name for a in node.names if a.name.split(".")[0] in PACKAGES)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module \
                and node.module.split(".")[0] in PACKAGES:
            for alias in node.names:
                sub = f"{node.module}.{alias.name}"
                out.add(sub if sub in MODULES else node.module)
    return out


def test_the_layers_import_one_way() -> None:
    wrong = [f"{module} imports {target}" for module, path in MODULES.items()
             for target in _imports(path)
             if target.split(".")[0] not in ALLOWED[module.split(".")[0]]]
    assert not wrong, wrong


def test_no_import_cycles() -> None:
    # A submodule importing its own package's __init__ is not a cycle: Python has run the
    # package first anyway.
    graph = {m: {t for t in _imports(p) if t in MODULES and t != m
                 and not (m.startswith(t + ".") and MODULES[t].endswith("__init__.py"))}
             for m, p in MODULES.items()}
    state: dict[str, int] = {}  # 1: on the current path, 2: done

    def visit(module: str, path: list[str]) -> list[str] | None:
        state[module] = 1
        for target in sorted(graph[module]):
            if state.get(target) == 1:
                return path + [module, target]
            if target not in state:
                cycle = visit(target, path + [module])
                if cycle:
                    return cycle
        state[module] = 2
        return None

    for module in sorted(graph):
        if module not in state:
            cycle = visit(module, [])
            assert cycle is None, " -> ".join(cycle[cycle.index(cycle[-1]):])


@pytest.mark.parametrize("module", sorted(MODULES))
def test_every_module_declares_all(module: str) -> None:
    tree = ast.parse(open(MODULES[module], encoding="utf-8").read())
    names = {t.id for node in tree.body if isinstance(node, (ast.Assign, ast.AnnAssign))
             for t in (node.targets if isinstance(node, ast.Assign) else [node.target])
             if isinstance(t, ast.Name)}
    assert "__all__" in names, f"{module} declares no __all__"
