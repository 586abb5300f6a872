"""The reference cannot fall behind the code: every public name (a package's ``__all__``, and
the public subpackages users import) is on its API page with a docstring; the generated parts
(docs/hooks/generate.py) cover every command and flag, every environment variable the code
names, every TransportConfig field and every error class."""
from __future__ import annotations

import argparse
import ast
import importlib
import importlib.util
import inspect
import os
import re
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

REPO = Path(__file__).resolve().parents[2]
API = REPO / "docs" / "reference" / "api"
PACKAGES = ("gossip", "collectives", "topologies")
# Module -> the API page that documents all of its __all__: the packages, and the public
# subpackages whose names users import (gossip.ddp_hooks is gossip.torch_backend.ddp_hooks).
DOCUMENTED = {
    "gossip": "gossip.md",
    "gossip.policies": "gossip.md",
    "gossip.testing": "gossip.md",
    "gossip.torch_backend": "gossip.md",
    "gossip.torch_backend.ddp_hooks": "gossip.md",
    "gossip.lightning": "gossip.md",
    "gossip.ray": "gossip.md",
    "gossip.simulation": "gossip.md",
    "collectives": "collectives.md",
    "collectives.codecs": "collectives.md",
    "collectives.arrays": "collectives.md",
    "topologies": "topologies.md",
}
_DIRECTIVE = re.compile(r"^:::[ \t]+([\w.]+)[ \t]*$((?:\n[ \t]+.*)*)", re.MULTILINE)


def _generator() -> ModuleType:
    spec = importlib.util.spec_from_file_location("docs_hooks_generate",
                                                  REPO / "docs" / "hooks" / "generate.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


GENERATE = _generator()


def _resolve(path: str) -> Any:
    """What ``::: path`` documents, as griffe finds it: a module when the path names one
    (``collectives.rendezvous`` is the module, not the function the package re-exports)."""
    try:
        return importlib.import_module(path)
    except ModuleNotFoundError:
        parent, _, name = path.rpartition(".")
        return getattr(_resolve(parent), name)


def _directives(page: str) -> list[str]:
    text = (API / page).read_text(encoding="utf-8")
    found = []
    for match in _DIRECTIVE.finditer(text):
        assert not re.search(r"^\s+members:", match.group(2), re.MULTILINE), (
            f"{page}: `::: {match.group(1)}` limits its members: this test counts a module's "
            "directive as all of its __all__; give the names their own directives instead")
        found.append(match.group(1))
    return found


def _covered(page: str) -> tuple[set[str], set[int]]:
    """The dotted paths a page documents, and the ids of the objects (classes, functions,
    modules) they are: a module's directive documents every name of its __all__."""
    paths, objects = set(), set()
    for path in _directives(page):
        obj = _resolve(path)
        paths.add(path)
        objects.add(id(obj))
        if isinstance(obj, ModuleType):
            for name in getattr(obj, "__all__", ()):
                paths.add(f"{path}.{name}")
                objects.add(id(getattr(obj, name)))
    return paths, objects


@pytest.mark.parametrize("module", sorted(DOCUMENTED))
def test_every_public_name_is_on_its_api_page(module: str) -> None:
    page = DOCUMENTED[module]
    paths, objects = _covered(page)
    mod = importlib.import_module(module)
    missing = []
    for name in mod.__all__:
        obj = getattr(mod, name)
        # Classes, functions and modules count by identity (re-exported under another path);
        # a constant only by its own path (two equal ints are not one documented name).
        named = isinstance(obj, (type, ModuleType)) or inspect.isroutine(obj)
        if f"{module}.{name}" not in paths and not (named and id(obj) in objects):
            missing.append(name)
    assert not missing, (f"docs/reference/api/{page} lacks {module}'s public names {missing}: "
                         f"add a `::: {module}.NAME` line for each")


def test_every_package_and_public_module_is_checked() -> None:
    """A module a package exports (gossip.policies) or loads on first use (gossip.testing,
    gossip.ddp_hooks) is in DOCUMENTED, so its names are checked too."""
    import gossip

    exported = {f"{pkg}.{name}" for pkg in PACKAGES for name in importlib.import_module(pkg).__all__
                if isinstance(getattr(importlib.import_module(pkg), name), ModuleType)}
    lazy = {module for module in gossip._LAZY.values()}
    assert exported | lazy | set(PACKAGES) <= set(DOCUMENTED)


def test_every_directive_names_something() -> None:
    for page in sorted({*DOCUMENTED.values()}):
        for path in _directives(page):
            _resolve(path)   # raises for a name that is gone


def test_every_public_name_has_a_docstring() -> None:
    """As the site's builder reads them (griffe, statically): a name without a docstring is
    left out of a module's section, and shows empty on its own."""
    griffe = pytest.importorskip("griffe", reason="the docs requirements (requirements-docs.txt) "
                                 "are not installed")
    loader = griffe.GriffeLoader(search_paths=[str(REPO)])
    for package in PACKAGES:
        loader.load(package)
    loader.resolve_aliases(implicit=False, external=None)
    bare = []
    for module in DOCUMENTED:
        node = loader.modules_collection[module]
        for name in importlib.import_module(module).__all__:
            docstring = node[name].docstring
            if docstring is None or not docstring.value.strip():
                bare.append(f"{module}.{name}")
    assert not bare, (f"public names without a docstring (a string right after an "
                      f"assignment documents a constant): {bare}")


# --- the generated parts ---------------------------------------------------------------------

@pytest.mark.parametrize("page, parts", [
    ("cli.md", ["cli"]), ("settings.md", ["environment", "transport-config"]),
    ("errors.md", ["errors"])])
def test_generated_pages_carry_their_parts(page: str, parts: list[str]) -> None:
    text = (REPO / "docs" / "reference" / page).read_text(encoding="utf-8")
    for part in parts:
        assert f"<!-- generated: {part} -->" in text
    expanded = GENERATE.expand(text, page)
    assert "<!-- generated:" not in expanded
    with pytest.raises(ValueError, match="no such part"):
        GENERATE.expand("<!-- generated: nothing -->\n", "x.md")
    config = (REPO / "mkdocs.yml").read_text(encoding="utf-8")
    assert "- docs/hooks/generate.py" in config


def _parsers(parser: argparse.ArgumentParser, name: str = "gossip"):
    yield name, parser
    for sub_name, _, sub in GENERATE._subcommands(parser):
        yield from _parsers(sub, f"{name} {sub_name}")


def test_cli_page_has_every_command_and_flag() -> None:
    from gossip.cli.main import build_parser

    text = GENERATE.cli_markdown()
    for name, parser in _parsers(build_parser()):
        section = text.split(f"\n## {name}\n", 1)
        assert len(section) == 2, f"no section for `{name}`"
        body = section[1].split("\n## ", 1)[0]
        for action in parser._actions:
            if isinstance(action, (argparse._HelpAction, argparse._SubParsersAction)):
                continue
            for flag in action.option_strings or [action.metavar or action.dest]:
                assert flag in body, f"`{name}`: {flag} is not on the page"


def _code_modules() -> dict[str, ast.Module]:
    out = {}
    for package in PACKAGES:
        for root, _, files in os.walk(REPO / package):
            for name in files:
                if name.endswith(".py"):
                    path = Path(root) / name
                    out[path.relative_to(REPO).as_posix()] = ast.parse(path.read_text("utf-8"))
    return out


def _strings(tree: ast.Module) -> set[str]:
    """The string constants of a module, but its docstrings."""
    docstrings = {id(node.body[0].value) for node in ast.walk(tree)
                  if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef,
                                       ast.AsyncFunctionDef))
                  and node.body and isinstance(node.body[0], ast.Expr)
                  and isinstance(node.body[0].value, ast.Constant)}
    return {node.value for node in ast.walk(tree) if isinstance(node, ast.Constant)
            and isinstance(node.value, str) and id(node) not in docstrings}


# The launchers' variable families: a string of the code that is one of these names a variable.
_VARIABLE = re.compile(r"(GOSSIP|SLURM|OMPI|PMIX|TORCHELASTIC)_[A-Za-z0-9_]+|RANK|WORLD_SIZE|"
                       r"LOCAL_RANK|LOCAL_WORLD_SIZE|GROUP_RANK|MASTER_ADDR|MASTER_PORT")


def test_every_environment_variable_is_in_the_registry() -> None:
    """Both ways: a variable the code names is in gossip.settings.ENVIRONMENT (so the settings
    page has it), and each module the registry says reads one names it."""
    from gossip.settings import ENVIRONMENT

    modules = _code_modules()
    named: dict[str, set[str]] = {}
    for path, tree in modules.items():
        for value in _strings(tree):
            if _VARIABLE.fullmatch(value):
                named.setdefault(value, set()).add(path)
    registered = {var.name: var for var in ENVIRONMENT}
    missing = {name: sorted(paths) for name, paths in named.items() if name not in registered}
    assert not missing, ("environment variables the code names that gossip.settings.ENVIRONMENT "
                         f"lacks (the settings page is generated from it): {missing}")
    stale = [(var.name, path) for var in ENVIRONMENT for path in var.read_in
             if path not in modules or var.name not in _strings(modules[path])]
    assert not stale, f"ENVIRONMENT says these modules read these variables; they do not: {stale}"
    assert len(registered) == len(ENVIRONMENT), "a variable registered twice"


def test_every_transport_setting_is_explained() -> None:
    import dataclasses

    from collectives.config import TransportConfig

    text = GENERATE.transport_config_markdown()
    rows = {line.split("|")[1].strip(" `"): line for line in text.splitlines()[2:] if line}
    assert set(rows) == {f.name for f in dataclasses.fields(TransportConfig)}
    # A field without a comment of its own shares the one of the field before it (shm_slots
    # and shm_chunk_bytes); the first of a group needs one.
    comments = list(GENERATE._field_comments(TransportConfig).items())
    bare = [name for i, (name, comment) in enumerate(comments)
            if not comment and (i == 0 or not comments[i - 1][1])]
    assert not bare, f"TransportConfig fields without a comment (collectives/config.py): {bare}"


def test_every_error_class_is_on_the_errors_page() -> None:
    """Every public class of the code that derives from an error of the tree (found in the
    source, so one in a module the page's generator does not import is found too)."""
    tree_names = {"GossipError"}
    classes: dict[str, list[str]] = {}
    for tree in _code_modules().values():
        for node in ast.walk(tree):
            if isinstance(node, ast.ClassDef):
                classes[node.name] = [b.id if isinstance(b, ast.Name) else
                                      b.attr if isinstance(b, ast.Attribute) else ""
                                      for b in node.bases]
    grown = True
    while grown:
        grown = False
        for name, bases in classes.items():
            if name not in tree_names and tree_names & set(bases):
                tree_names.add(name)
                grown = True
    text = GENERATE.errors_markdown()
    missing = sorted(n for n in tree_names if not n.startswith("_") and f"**{n}**" not in text)
    assert not missing, f"errors not on docs/reference/errors.md: {missing}"
