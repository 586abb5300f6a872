"""The fenced code blocks of README.md and docs/**/*.md, read and run as the pages say.

A block's language decides what is done with it, and the HTML comment on the line before its
fence (``<!-- test: ... -->``; blank lines between are allowed) says how:

- ```python: run. ``<!-- test: python -->`` (the default: ``python block.py``);
  ``<!-- test: gossip run -n 2 -->`` or ``<!-- test: torchrun ... -->`` (the block saved as
  block.py and run with that command; ``{script}`` in it stands for the file, else it goes
  last); ``<!-- test: continue -->`` (appended to the previous python block of the page, the
  chain run once, as its first block says); ``<!-- test: skip: REASON -->``.
- ```bash, ```sh, ```shell, ```console: run with ``bash -euo pipefail`` when marked
  ``<!-- test: sh -->``, else they must be marked ``<!-- test: skip: REASON -->``: an unmarked
  shell block is an error, so none goes unchecked by accident. In a console block the lines
  that start with ``$ `` are the commands (a line ending in ``\\`` goes on on the next), the
  rest is output, not compared.
- Any other language: not run (a test mark on one is an error: it would be a silent no-op).

Every run gets a fresh directory holding links to the repository's examples/, benchmarks/ and
scripts/, the repository on PYTHONPATH, an environment without GOSSIP_* or launcher
variables, ``python``/``python3``/``gossip``/``torchrun`` on PATH as this interpreter, and a
deadline (DEADLINE_S); its process group is killed after it.
"""
from __future__ import annotations

import os
import re
import shlex
import signal
import subprocess
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

__all__ = ["Block", "Item", "parse_page", "items_of", "collect", "run_item", "Outcome",
           "DEADLINE_S", "REPO"]

REPO = Path(__file__).resolve().parents[2]
DEADLINE_S = 90.0
# What a run's directory links to, so `python examples/x.py` works and nothing is written
# into the repository.
LINKED = ("examples", "benchmarks", "scripts")
PYTHON_LANGS = {"python", "py", "python3"}
SHELL_LANGS = {"bash", "sh", "shell", "console", "shell-session"}
# Launcher variables of the environment the tests run in must not reach a block's run.
_STRIPPED_PREFIXES = ("GOSSIP_", "SLURM_", "OMPI_", "PMI_", "PMIX_", "TORCHELASTIC_")
_STRIPPED_NAMES = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "GROUP_RANK",
                   "MASTER_ADDR", "MASTER_PORT")
_FENCE = re.compile(r"^(?P<indent>[ \t]*)(?P<fence>`{3,}|~{3,})(?P<info>.*)$")
_MARK = re.compile(r"^\s*<!--\s*test:\s*(?P<body>.*?)\s*-->\s*$")
# Commands a python block may be run with (the block's file goes where {script} is, or last).
_COMMANDS = ("gossip run", "torchrun")
OUTPUT_TAIL = 8000   # characters of a failed run's output shown


@dataclass
class Block:
    """One fenced block of a page: ``line`` is its opening fence's (1-based)."""
    page: str          # the page's path, relative to the repository
    line: int
    lang: str
    code: str
    mark: str | None   # the text of its ``<!-- test: ... -->``, or None


@dataclass
class Item:
    """What the test does for one block (or one chain of python blocks): run it, skip it, or
    fail with ``error`` (an unmarked shell block, a mark that makes no sense)."""
    page: str
    line: int
    kind: str                        # "python" | "command" | "sh" | "skip" | "error"
    code: str = ""
    command: str = ""                # kind "command": the mark, e.g. "gossip run -n 2"
    reason: str = ""                 # kind "skip": why; kind "error": what is wrong
    lang: str = ""
    # Lines of the page the code's lines come from (for a chain: several blocks).
    line_map: list[int] = field(default_factory=list)
    continued: list[int] = field(default_factory=list)   # lines of the chain's other blocks

    @property
    def id(self) -> str:
        return f"{self.page}:{self.line}"


def parse_page(text: str, page: str) -> list[Block]:
    """The fenced blocks of one markdown page, with their marks. A fence closes with the same
    character, at least as long (so a ```` fence can show ``` inside it); an unclosed fence is
    a block of kind error (see items_of), reported as lang "!unclosed"."""
    lines = text.splitlines()
    blocks: list[Block] = []
    i = 0
    while i < len(lines):
        match = _FENCE.match(lines[i])
        if not match:
            i += 1
            continue
        indent, fence, info = match.group("indent"), match.group("fence"), match.group("info")
        lang = _language(info)
        mark = _mark_before(lines, i)
        start = i
        body: list[str] = []
        i += 1
        closed = False
        while i < len(lines):
            close = _FENCE.match(lines[i])
            if close and close.group("fence")[0] == fence[0] \
                    and len(close.group("fence")) >= len(fence) and not close.group("info").strip():
                closed = True
                break
            line = lines[i]
            # Lines of a fence indented in a list item or an admonition lose that indent.
            body.append(line[len(indent):] if line.startswith(indent) else line.lstrip())
            i += 1
        i += 1
        blocks.append(Block(page, start + 1, lang if closed else "!unclosed",
                            "\n".join(body) + "\n" if body else "", mark))
    return blocks


def _language(info: str) -> str:
    """The language of a fence's info string: ```python title="x" and ```{.python} alike."""
    word = info.strip().split(maxsplit=1)[0] if info.strip() else ""
    return word.strip("{}").lstrip(".").lower()


def _mark_before(lines: list[str], fence: int) -> str | None:
    """The ``<!-- test: ... -->`` on the nearest non-blank line above line ``fence``."""
    j = fence - 1
    while j >= 0 and not lines[j].strip():
        j -= 1
    if j < 0:
        return None
    match = _MARK.match(lines[j])
    return match.group("body") if match else None


def items_of(blocks: list[Block]) -> list[Item]:
    """What to do for each block of one page; a continue block joins the item of the previous
    python block of the page instead of making its own."""
    items: list[Item] = []
    last_python: Item | None = None
    for block in blocks:
        item = _item(block, last_python)
        if item is None:          # a continue block, appended to last_python
            continue
        if block.lang in PYTHON_LANGS:
            last_python = item
        items.append(item)
    return [item for item in items if item.kind != "none"]


def _error(block: Block, why: str) -> Item:
    return Item(block.page, block.line, "error", reason=why, lang=block.lang)


def _item(block: Block, last_python: Item | None) -> Item | None:
    mark, lang = block.mark, block.lang
    if lang == "!unclosed":
        return _error(block, "a fence that is never closed")
    if mark is not None and mark.startswith("skip"):
        reason = mark[len("skip"):].lstrip(" :").strip()
        if not mark.startswith("skip:") or not reason:
            return _error(block, f"<!-- test: {mark} -->: write <!-- test: skip: REASON -->")
        if lang not in PYTHON_LANGS | SHELL_LANGS:
            return _error(block, f"a skip mark on a ```{lang} block, which is never run")
        item = Item(block.page, block.line, "skip", reason=reason, lang=lang)
        return item
    if lang in PYTHON_LANGS:
        lines = list(range(block.line + 1, block.line + 1 + block.code.count("\n")))
        if mark is None or mark == "python":
            return Item(block.page, block.line, "python", code=block.code, lang=lang,
                        line_map=lines)
        if mark == "continue":
            if last_python is None:
                return _error(block, "<!-- test: continue --> with no python block before it "
                                     "on the page")
            last_python.code += block.code
            last_python.line_map += lines
            last_python.continued.append(block.line)
            return None
        if any(mark == c or mark.startswith(c + " ") for c in _COMMANDS):
            return Item(block.page, block.line, "command", code=block.code, command=mark,
                        lang=lang, line_map=lines)
        return _error(block, f"<!-- test: {mark} --> on a python block: expected python, "
                             "continue, skip: REASON, or a command starting with "
                             + " or ".join(_COMMANDS))
    if lang in SHELL_LANGS:
        if mark is None:
            return _error(block, f"an unmarked ```{lang} block: mark it <!-- test: sh --> (run "
                                 "with bash -euo pipefail) or <!-- test: skip: REASON -->")
        if mark != "sh":
            return _error(block, f"<!-- test: {mark} --> on a ```{lang} block: expected sh or "
                                 "skip: REASON")
        code = _console_commands(block.code) if lang in ("console", "shell-session") \
            else block.code
        return Item(block.page, block.line, "sh", code=code, lang=lang)
    if mark is not None:
        return _error(block, f"<!-- test: {mark} --> on a ```{lang or '(no language)'} block, "
                             "which is never run")
    return Item(block.page, block.line, "none")


def _console_commands(text: str) -> str:
    """The commands of a console block: its ``$ `` lines, with the lines a trailing ``\\``
    carries on; the rest is output."""
    out: list[str] = []
    going_on = False
    for line in text.splitlines():
        if going_on:
            out.append(line)
        elif line.startswith("$ "):
            out.append(line[2:])
        else:
            continue
        going_on = line.rstrip().endswith("\\")
    return "\n".join(out) + "\n" if out else ""


def pages() -> list[Path]:
    """README.md and every page under docs/."""
    found = [REPO / "README.md"] if (REPO / "README.md").exists() else []
    return found + sorted((REPO / "docs").rglob("*.md"))


def collect() -> list[Item]:
    """Every item of every page, in page order."""
    items: list[Item] = []
    for path in pages():
        page = path.relative_to(REPO).as_posix()
        items += items_of(parse_page(path.read_text(encoding="utf-8"), page))
    return items


@dataclass
class Outcome:
    """A run's end: ``returncode`` None when the deadline killed it."""
    command: str
    returncode: int | None
    output: str

    @property
    def ok(self) -> bool:
        return self.returncode == 0


def block_env(bindir: Path) -> dict[str, str]:
    """The environment of a block's run: this one without GOSSIP_* and launcher variables,
    the repository on PYTHONPATH, ``bindir`` first on PATH."""
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(_STRIPPED_PREFIXES) and k not in _STRIPPED_NAMES}
    env["PYTHONPATH"] = str(REPO)
    env["PATH"] = os.pathsep.join([str(bindir), env.get("PATH", "")])
    env["PYTHONUNBUFFERED"] = "1"
    return env


def _tools(bindir: Path) -> None:
    """``python``, ``python3``, ``gossip`` and ``torchrun`` in ``bindir``, all this
    interpreter (so the repository's gossip runs, not an installed one's)."""
    bindir.mkdir()
    # Scripts, not links: a link to a virtual environment's python is not in that environment.
    for name, args in (("python", ""), ("python3", ""), ("gossip", " -m gossip"),
                       ("torchrun", " -m torch.distributed.run")):
        tool = bindir / name
        tool.write_text(f'#!/bin/sh\nexec "{sys.executable}"{args} "$@"\n')
        tool.chmod(0o755)


def command_of(item: Item, script: str) -> list[str]:
    """The argv that runs ``item`` with its code saved as ``script``."""
    if item.kind == "python":
        return ["python", script]
    if item.kind == "sh":
        return ["bash", "-euo", "pipefail", script]
    if item.kind == "command":
        argv = shlex.split(item.command)
        if "{script}" in argv:
            return [script if word == "{script}" else word for word in argv]
        return argv + [script]
    raise ValueError(f"{item.id}: nothing to run for kind {item.kind!r}")


def run_item(item: Item, deadline: float = DEADLINE_S) -> Outcome:
    """Run ``item`` in a fresh directory (module docstring); its process group is killed at the
    deadline and after it ends. Traceback lines of the saved script name the page's lines."""
    with tempfile.TemporaryDirectory(prefix="gossip-docs-") as tmp:
        work = Path(tmp) / "run"
        work.mkdir()
        for name in LINKED:
            if (REPO / name).exists():
                (work / name).symlink_to(REPO / name)
        bindir = Path(tmp) / "bin"
        _tools(bindir)
        script = "block.sh" if item.kind == "sh" else "block.py"
        (work / script).write_text(item.code, encoding="utf-8")
        argv = command_of(item, script)
        log = Path(tmp) / "output"
        with open(log, "wb") as out:
            proc = subprocess.Popen(argv, cwd=work, env=block_env(bindir), stdout=out,
                                    stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                    start_new_session=True)
            try:
                returncode: int | None = proc.wait(timeout=deadline)
            except subprocess.TimeoutExpired:
                returncode = None
            finally:
                _kill_group(proc)
        output = log.read_text(encoding="utf-8", errors="replace")
    return Outcome(shlex.join(argv), returncode, _page_lines(output, item, script))


def _kill_group(proc: subprocess.Popen) -> None:
    """Kill what the run left (its session's process group), then reap it."""
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    proc.wait()


def _page_lines(output: str, item: Item, script: str) -> str:
    """``File ".../block.py", line N`` in a traceback, as the page's file and line."""
    if not item.line_map:
        return output

    def page_line(match: re.Match) -> str:
        n = int(match.group(1))
        if 1 <= n <= len(item.line_map):
            return f'File "{item.page}", line {item.line_map[n - 1]}'
        return match.group(0)
    return re.sub(r'File "[^"]*' + re.escape(script) + r'", line (\d+)', page_line, output)


def failure_message(item: Item, outcome: Outcome, deadline: float = DEADLINE_S) -> str:
    """What a failed run says: the page and line, the command, and the output's tail."""
    where = item.id
    if item.continued:
        where += " (continued at lines " + ", ".join(map(str, item.continued)) + ")"
    if outcome.returncode is None:
        what = f"did not finish within {deadline:g} s (killed)"
    else:
        what = f"exited {outcome.returncode}"
        if outcome.returncode == 141 and item.kind == "sh":
            what += " (SIGPIPE: under pipefail, `cmd | head` fails when head stops reading)"
    output = outcome.output
    if len(output) > OUTPUT_TAIL:
        output = "[...]\n" + output[-OUTPUT_TAIL:]
    return (f"{where}: the ```{item.lang} block run as `{outcome.command}` {what}\n"
            f"--- output (stdout and stderr) ---\n{output}--- end of output ---")
