"""The generated parts of the reference pages (an mkdocs hook: mkdocs.yml's ``hooks:``).

A line ``<!-- generated: NAME -->`` in a page becomes ``GENERATORS[NAME]()``'s markdown when the
site is built, so these parts follow the code without an edit:

- ``cli``: every command of ``gossip`` and its arguments, from gossip/cli/main.py's
  build_parser (the parsers themselves, as ``--help`` reads them);
- ``environment``: every environment variable, from gossip.settings.ENVIRONMENT (which
  tests/docs/test_reference.py checks against the variables the code names);
- ``transport-config``: every field of collectives.TransportConfig, with its default and the
  comment above it in collectives/config.py;
- ``metrics``: every metric a peer exports, from gossip.metrics.METRICS (the catalog the
  collector fills);
- ``errors``: the error tree under GossipError (found by walking its subclasses) and the other
  errors and warnings a user meets, each with its docstring.

``python docs/hooks/generate.py NAME`` prints one part, to read it without a build.
"""
from __future__ import annotations

import argparse
import ast
import dataclasses
import inspect
import re
import sys
import textwrap
from pathlib import Path
from typing import Any, Callable, Iterator

REPO = Path(__file__).resolve().parents[2]
if str(REPO) not in sys.path:       # the build imports the packages from this checkout
    sys.path.insert(0, str(REPO))

_MARK = re.compile(r"^<!-- generated: ([\w-]+) -->[ \t]*$", re.MULTILINE)
USAGE_WIDTH = 96


def _md(text: str) -> str:
    """Plain text made safe for a markdown paragraph or table cell: no HTML tags, links,
    emphasis or cell breaks out of it."""
    text = text.replace("\\", "\\\\")
    for char in "|*[]`_":
        text = text.replace(char, "\\" + char)
    return text.replace("<", "&lt;").replace(">", "&gt;")


def _paragraph(text: str) -> str:
    """A docstring or help text as one markdown paragraph: lines joined, ``code`` kept."""
    words = " ".join(line.strip() for line in inspect.cleandoc(text).splitlines())
    parts = re.split(r"(``[^`]+``)", words)
    return "".join(f"`{p[2:-2]}`" if p.startswith("``") else _md(p) for p in parts)


def _docstring(obj: Any) -> str:
    doc = obj.__dict__.get("__doc__") if isinstance(obj, type) else obj.__doc__
    return " ".join(_paragraph(block) for block in (doc or "").split("\n\n") if block.strip())


# --- the command line -----------------------------------------------------------------------

def _subcommands(parser: argparse.ArgumentParser
                 ) -> Iterator[tuple[str, str, argparse.ArgumentParser]]:
    """(name, summary, parser) of each subcommand of ``parser``, in the order they were
    added."""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            helps = {a.dest: a.help or "" for a in action._choices_actions}
            for name, sub in action.choices.items():
                yield name, helps.get(name, ""), sub


def _usage(parser: argparse.ArgumentParser) -> str:
    formatter = parser.formatter_class(prog=parser.prog, width=USAGE_WIDTH)
    formatter.add_usage(parser.usage, parser._actions, parser._mutually_exclusive_groups)
    return formatter.format_help().strip()


def _raw(parser: argparse.ArgumentParser) -> bool:
    """Whether the parser keeps its description's and epilog's line breaks."""
    return issubclass(parser.formatter_class, argparse.RawDescriptionHelpFormatter)


def _text(parser: argparse.ArgumentParser, text: str | None) -> list[str]:
    if not text:
        return []
    if _raw(parser):
        return ["```text", text.strip("\n"), "```", ""]
    return [_paragraph(text), ""]


def _argument_rows(parser: argparse.ArgumentParser) -> list[str]:
    formatter = parser._get_formatter()
    rows = []
    for action in parser._actions:
        if isinstance(action, (argparse._SubParsersAction, argparse._HelpAction)) \
                or action.help == argparse.SUPPRESS:
            continue
        invocation = formatter._format_action_invocation(action)
        help_text = formatter._expand_help(action) if action.help else ""
        extra = []
        if action.choices is not None and not isinstance(action.choices, dict) \
                and not all(str(c) in help_text for c in action.choices):
            extra.append("one of " + ", ".join(map(str, action.choices)))
        default = action.default
        if action.option_strings and default not in (None, False, argparse.SUPPRESS) \
                and not isinstance(action, argparse._VersionAction) \
                and "default" not in help_text:
            extra.append(f"default {default}")
        cell = _paragraph(help_text) if help_text else ""
        if extra:
            cell += (" " if cell else "") + "(" + _md("; ".join(extra)) + ")"
        rows.append(f"| `{invocation}` | {cell} |")
    return rows


def _command_section(name: str, summary: str, parser: argparse.ArgumentParser,
                     level: int) -> list[str]:
    out = [f"{'#' * level} {name}", ""]
    if summary:
        out += [_paragraph(summary[0].upper() + summary[1:]) + ".", ""]
    out += ["```text", _usage(parser), "```", ""]
    out += _text(parser, parser.description)
    rows = _argument_rows(parser)
    if rows:
        out += ["| Argument | What it does |", "|---|---|", *rows, ""]
    out += _text(parser, parser.epilog)
    for sub_name, sub_summary, sub in _subcommands(parser):
        out += _command_section(f"{name} {sub_name}", sub_summary, sub, level)   # (flat)
    return out


def cli_markdown() -> str:
    """Every command of ``gossip``, from the parsers: a table of the commands, then a section
    per command (summary, usage, description, arguments, examples)."""
    from gossip.cli.main import build_parser

    parser = build_parser()
    commands = list(_subcommands(parser))
    out = ["| Command | What it does |", "|---|---|"]
    out += [f"| [`gossip {name}`](#gossip-{name}) | {_paragraph(summary)} |"
            for name, summary, _ in commands]
    out.append("")
    out += ["## gossip", "", "```text", _usage(parser), "```", ""]
    out += _text(parser, parser.description)
    rows = _argument_rows(parser)
    if rows:
        out += ["| Argument | What it does |", "|---|---|", *rows, ""]
    for name, summary, sub in commands:
        out += _command_section(f"gossip {name}", summary, sub, 2)
    return "\n".join(out)


# --- settings -------------------------------------------------------------------------------

def environment_markdown() -> str:
    """One table of every environment variable, from gossip.settings.ENVIRONMENT."""
    from gossip.settings import ENVIRONMENT

    out = ["| Variable | Default | What it does | Read in | Set by |", "|---|---|---|---|---|"]
    for var in ENVIRONMENT:
        name = f"`{var.name}`" + ("" if var.convention == "gossip" else f" ({var.convention})")
        read = ", ".join(f"`{path}`" for path in var.read_in) or "(not read)"
        out.append(f"| {name} | {_cell(var.default) or '-'} | {_cell(var.meaning)} | {read} | "
                   f"{_cell(var.set_by) or '-'} |")
    return "\n".join(out) + "\n"


def metrics_markdown() -> str:
    """One table of every metric a peer exports, from gossip.metrics.METRICS."""
    from gossip.metrics import markdown_table

    return markdown_table()


def _cell(text: str) -> str:
    """Registry text, already markdown (code spans allowed), made safe for a table cell."""
    return text.replace("|", "\\|").replace("<", "&lt;").replace(">", "&gt;")


def _field_comments(cls: type) -> dict[str, str]:
    """The comment lines right above each field of a dataclass, read from its source."""
    source = textwrap.dedent(inspect.getsource(cls))
    tree = ast.parse(source)
    lines = source.splitlines()
    comments = {}
    body = next(node for node in tree.body if isinstance(node, ast.ClassDef)).body
    for node in body:
        if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            above = []
            j = node.lineno - 2
            while j >= 0 and lines[j].strip().startswith("#"):
                above.insert(0, lines[j].strip().lstrip("#").strip())
                j -= 1
            comments[node.target.id] = " ".join(above)
    return comments


def _default(field: dataclasses.Field) -> str:
    if field.default is not dataclasses.MISSING:
        value = field.default
    elif field.default_factory is not dataclasses.MISSING:
        value = field.default_factory()
    else:
        return "(required)"
    if isinstance(value, int) and not isinstance(value, bool) and field.name.endswith("bytes") \
            and value >= 1 << 10:
        for unit, shift in (("GiB", 30), ("MiB", 20), ("KiB", 10)):
            if value % (1 << shift) == 0:
                return f"{value >> shift} {unit}"
    return repr(value)


def transport_config_markdown() -> str:
    """Every field of TransportConfig: its default and the comment above it."""
    from collectives.config import TransportConfig

    comments = _field_comments(TransportConfig)
    out = ["| Field | Default | What it does |", "|---|---|---|"]
    previous = ""
    for field in dataclasses.fields(TransportConfig):
        # Fields under one comment (shm_slots, shm_chunk_bytes) share it.
        what = _paragraph(comments.get(field.name, "")) or f"As `{previous}`, above."
        out.append(f"| `{field.name}` | `{_default(field)}` | {what} |")
        previous = field.name
    return "\n".join(out) + "\n"


# --- errors ---------------------------------------------------------------------------------

# Errors and warnings outside the GossipError tree that a user meets.
OTHER_ERRORS = ("topologies.TopologyError", "collectives.security.InsecureWarning",
                "gossip.bench.BenchError")
# Where a user imports a class from, in this order of preference.
_HOMES = ("gossip", "gossip.errors", "collectives", "collectives.errors", "gossip.testing",
          "collectives.codecs", "collectives.rendezvous", "collectives.group", "topologies")


def _import(path: str) -> Any:
    import importlib

    module, _, name = path.rpartition(".")
    return getattr(importlib.import_module(module), name)


def _home(cls: type) -> str:
    import importlib

    for module in _HOMES:
        if getattr(importlib.import_module(module), cls.__name__, None) is cls:
            return f"{module}.{cls.__name__}"
    return f"{cls.__module__}.{cls.__name__}"


def gossip_error_tree() -> list[tuple[int, type, type | None]]:
    """(depth, class, parent in the tree) of GossipError and every public subclass, depth
    first; a private class (``_AboutAPeer``) is not listed, its subclasses take its place."""
    import gossip
    import gossip.testing  # noqa: F401  (loaded on first use: its errors are in the tree)

    out: list[tuple[int, type, type | None]] = []
    seen: set[type] = set()

    def children(cls: type) -> Iterator[type]:
        for sub in cls.__subclasses__():
            if sub.__module__.split(".")[0] not in ("gossip", "collectives", "topologies"):
                continue
            if sub.__name__.startswith("_"):
                yield from children(sub)
            else:
                yield sub

    def walk(cls: type, depth: int, parent: type | None) -> None:
        if cls in seen:        # a class with two bases in the tree: listed once
            return
        seen.add(cls)
        out.append((depth, cls, parent))
        for sub in sorted(children(cls), key=lambda c: c.__name__):
            walk(sub, depth + 1, cls)

    walk(gossip.GossipError, 0, None)
    return out


def _also(cls: type, root: type) -> str:
    """What else ``cls`` is, outside the tree under ``root`` (so other handlers catch it)."""
    other = [b for b in cls.__mro__[1:] if not issubclass(b, root)
             and not b.__name__.startswith("_") and b not in (Exception, BaseException, object)]
    names = [b.__name__ if b.__module__ == "builtins" else f"{b.__module__}.{b.__name__}"
             for b in other]
    return ", ".join(f"`{n}`" if "." in n else n for n in names) or "-"


def errors_markdown() -> str:
    """The GossipError tree, then the other errors and warnings, each with its docstring."""
    tree = gossip_error_tree()
    root = tree[0][1]
    out = ["| Error | Subclass of | Also a | Import | What it means |",
           "|---|---|---|---|---|"]
    for depth, cls, parent in tree:
        name = "&nbsp;&nbsp;&nbsp;" * depth + f"**{cls.__name__}**"
        out.append(f"| {name} | {parent.__name__ if parent else 'Exception'} | "
                   f"{_also(cls, root)} | `{_home(cls)}` | {_docstring(cls)} |")
    out += ["", "Outside the tree, errors and warnings a user meets:", "",
            "| Class | Subclass of | Import | What it means |", "|---|---|---|---|"]
    for path in OTHER_ERRORS:
        cls = _import(path)
        out.append(f"| **{cls.__name__}** | {cls.__mro__[1].__name__} | `{path}` | "
                   f"{_docstring(cls)} |")
    return "\n".join(out) + "\n"


GENERATORS: dict[str, Callable[[], str]] = {
    "cli": cli_markdown,
    "environment": environment_markdown,
    "transport-config": transport_config_markdown,
    "errors": errors_markdown,
    "metrics": metrics_markdown,
}


def expand(markdown: str, page: str = "") -> str:
    """``markdown`` with each ``<!-- generated: NAME -->`` line replaced by its part."""
    def part(match: re.Match) -> str:
        name = match.group(1)
        if name not in GENERATORS:
            raise ValueError(f"{page}: <!-- generated: {name} -->: no such part (known: "
                             f"{', '.join(GENERATORS)})")
        return GENERATORS[name]()
    return _MARK.sub(part, markdown)


def on_page_markdown(markdown: str, page: Any, config: Any, files: Any, **_: Any) -> str:
    """mkdocs' hook: the page's generated parts filled in."""
    from mkdocs.exceptions import PluginError

    try:
        return expand(markdown, page.file.src_uri)
    except ValueError as exc:
        raise PluginError(str(exc)) from None


if __name__ == "__main__":
    print(GENERATORS[sys.argv[1]]())
