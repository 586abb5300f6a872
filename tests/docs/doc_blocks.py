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

After the mark, comma-separated flags: ``ci`` (a longer block: it runs with ``pytest -m ci``,
after the default run, with a deadline of CI_DEADLINE_S); ``root`` (needs root: skipped,
saying so, otherwise); ``checkout`` (for ``pip install .``: the run's directory is a copy
of the repository's tracked files, a fresh virtual environment is first on PATH, and the
repository is not on PYTHONPATH); ``hosts A B``
(a shell block for several machines: what comes before its first ``# on A`` line runs first,
on this machine, then each ``# on NAME`` part runs at once in a network namespace of its own
(tests/netfault.py), with 10.0.0.1 standing for the first host's address; needs root);
``slurm`` (needs a SLURM node up, as scripts/slurm-one-node.sh starts one: skipped, saying
so, otherwise).
E.g. ``<!-- test: sh, checkout, ci -->``, ``<!-- test: sh, hosts a b -->``.

Every run gets a fresh directory holding links to the repository's examples/, benchmarks/,
tests/, scripts/ and pyproject.toml (pytest's options), the repository on PYTHONPATH, an
environment without GOSSIP_* or launcher variables, ``python``/``python3``/``gossip``/
``torchrun`` on PATH as this interpreter (and ``sudo`` as the command itself, for root
without sudo), and a deadline (DEADLINE_S, or CI_DEADLINE_S for a ci block); its process
group is killed after it.
"""
from __future__ import annotations

import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

__all__ = ["Block", "Item", "parse_page", "items_of", "collect", "run_item", "Outcome",
           "DEADLINE_S", "CI_DEADLINE_S", "REPO", "train_script", "slurm_node_up"]

REPO = Path(__file__).resolve().parents[2]
DEADLINE_S = 90.0
CI_DEADLINE_S = 900.0   # the demo blocks took 341-376 s in CI's run here
FLAGS = ("ci", "root", "checkout", "slurm", "hosts")
# The first machine's address in a hosts block (the pages' example address).
FIRST_HOST = "10.0.0.1"
# What a run's directory links to, so `python examples/x.py` works and nothing is written
# into the repository.
LINKED = ("examples", "benchmarks", "scripts", "tests", "pyproject.toml")
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
    flags: set[str] = field(default_factory=set)          # the mark's flags (module docstring)
    hosts: list[str] = field(default_factory=list)        # a hosts block's machine names

    @property
    def deadline(self) -> float:
        return CI_DEADLINE_S if "ci" in self.flags else DEADLINE_S

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
    mark, flags, hosts, wrong = _flags(block.mark)
    if wrong:
        return _error(block, wrong)
    item = _item_of(Block(block.page, block.line, block.lang, block.code, mark), last_python)
    if item is not None and (flags or hosts):
        if item.kind not in ("python", "command", "sh"):
            return _error(block, f"flags {sorted(flags)} on a block of kind {item.kind}")
        if hosts and item.kind != "sh":
            return _error(block, "hosts on a block that is not a shell block")
        if hosts:
            flags.add("root")
            missing = set(hosts) - set(_sections(item.code, hosts)[1])
            if missing:
                return _error(block, f"hosts {' '.join(hosts)}: no '# on NAME' line for "
                                     f"{', '.join(sorted(missing))}")
        item.flags, item.hosts = flags, hosts
    return item


def _sections(code: str, hosts: list[str]) -> tuple[str, dict[str, str]]:
    """A hosts block's code: what comes before its first ``# on NAME`` line, and each named
    machine's part (from its ``# on NAME`` line to the next)."""
    preamble: list[str] = []
    parts: dict[str, list[str]] = {}
    current = preamble
    for line in code.splitlines(keepends=True):
        match = re.match(r"^#\s*on\s+(\S+)\s*$", line.strip())
        if match and match.group(1) in hosts:
            current = parts.setdefault(match.group(1), [])
            continue
        current.append(line)
    return "".join(preamble), {name: "".join(lines) for name, lines in parts.items()}


def _flags(mark: str | None) -> tuple[str | None, set[str], list[str], str]:
    """A mark's main part, its flags, a hosts flag's names, and what is wrong with them."""
    if mark is None or mark.startswith("skip") or "," not in mark:
        return mark, set(), [], ""
    head, *rest = [part.strip() for part in mark.split(",")]
    flags: set[str] = set()
    hosts: list[str] = []
    for part in rest:
        word, *names = part.split()
        if word not in FLAGS or names and word != "hosts":
            return head, flags, hosts, (f"<!-- test: {mark} -->: unknown flag {part!r} (flags: "
                                        f"{', '.join(FLAGS)})")
        if word == "hosts":
            if len(names) < 2:
                return head, flags, hosts, "hosts needs two names or more: hosts a b"
            hosts = names
        flags.add(word)
    return head, flags, hosts, ""


def _item_of(block: Block, last_python: Item | None) -> Item | None:
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


def block_env(bindir: Path, *, checkout: bool = False) -> dict[str, str]:
    """The environment of a block's run: this one without GOSSIP_* and launcher variables,
    the repository on PYTHONPATH (not for a ``checkout`` block, which installs it),
    ``bindir`` first on PATH."""
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(_STRIPPED_PREFIXES) and k not in _STRIPPED_NAMES
           and k not in ("VIRTUAL_ENV", "PYTHONPATH")}
    if not checkout:
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
    if os.geteuid() == 0 and not shutil.which("sudo"):   # root: sudo is the command itself
        tool = bindir / "sudo"
        tool.write_text('#!/bin/sh\nexec "$@"\n')
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


def run_item(item: Item, deadline: float | None = None) -> Outcome:
    """Run ``item`` in a fresh directory (module docstring); its process group is killed at the
    deadline (the item's by default) and after it ends. Traceback lines of the saved script
    name the page's lines."""
    deadline = item.deadline if deadline is None else deadline
    with tempfile.TemporaryDirectory(prefix="gossip-docs-") as tmp:
        work = Path(tmp) / "run"
        checkout = "checkout" in item.flags
        if checkout:
            _copy_checkout(work)
        else:
            work.mkdir()
            for name in LINKED:
                if (REPO / name).exists():
                    (work / name).symlink_to(REPO / name)
        bindir = Path(tmp) / "bin"
        _tools(bindir)
        env = block_env(bindir, checkout=checkout)
        if checkout:
            _fresh_venv(Path(tmp), env)
        if item.hosts:
            return _run_hosts(item, work, env, deadline)
        script = "block.sh" if item.kind == "sh" else "block.py"
        (work / script).write_text(item.code, encoding="utf-8")
        argv = command_of(item, script)
        returncode, output = _run(argv, work, env, deadline)
        if returncode != 0:
            output += _logs_left(work)
    return Outcome(shlex.join(argv), returncode, _page_lines(output, item, script))


def _run(argv: list[str], work: Path, env: dict[str, str],
         deadline: float) -> tuple[int | None, str]:
    """Run ``argv`` in ``work`` in a session of its own, killed at ``deadline``; its exit
    code (None if killed) and output."""
    log = work.parent / "output"
    with open(log, "wb") as out:
        proc = subprocess.Popen(argv, cwd=work, env=env, stdout=out,
                                stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                start_new_session=True)
        try:
            returncode: int | None = proc.wait(timeout=deadline)
        except subprocess.TimeoutExpired:
            returncode = None
        finally:
            _kill_group(proc)
    return returncode, log.read_text(encoding="utf-8", errors="replace")


def _logs_left(work: Path, lines: int = 40) -> str:
    """The last ``lines`` of every ``*.log`` a failed block left in its directory (the logs
    of the processes it started), so the failure shows what they said."""
    shown = []
    for log in sorted(work.glob("*.log")):
        tail = log.read_text(encoding="utf-8", errors="replace").splitlines()[-lines:]
        shown.append(f"--- {log.name} (last {len(tail)} lines) ---\n" + "\n".join(tail))
    return "".join("\n" + part for part in shown)


def _fresh_venv(tmp: Path, env: dict[str, str]) -> None:
    """A checkout block's environment: a virtual environment of its own, first on PATH, as a
    reader's would be, whose pip takes torch's CPU build as requirements-dev.txt pins it (a
    bare torch requirement would pull the CUDA build)."""
    venv = tmp / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=120)
    constraints = tmp / "constraints.txt"
    pinned = [line for line in (REPO / "requirements-dev.txt").read_text().splitlines()
              if line.startswith("torch==")]
    inherited = os.environ.get("PIP_CONSTRAINT") or _pip_config("global.constraint")
    if inherited and Path(inherited).exists():
        pinned.append(f"-c {inherited}")
    constraints.write_text("\n".join(pinned) + "\n")
    env["PIP_CONSTRAINT"] = str(constraints)
    env["VIRTUAL_ENV"] = str(venv)
    env["PATH"] = os.pathsep.join([str(venv / "bin"), env["PATH"]])


def _pip_config(key: str) -> str:
    """A value of this machine's pip configuration (PIP_CONSTRAINT replaces it)."""
    listed = subprocess.run([sys.executable, "-m", "pip", "config", "get", key],
                            capture_output=True, text=True, timeout=60)
    return listed.stdout.strip() if listed.returncode == 0 else ""


def slurm_node_up() -> str:
    """"" if this machine's SLURM has a node that takes jobs, else why not."""
    if not shutil.which("sinfo"):
        return "no SLURM here (sinfo not found)"
    try:
        states = subprocess.run(["sinfo", "-h", "-o", "%T"], capture_output=True, text=True,
                                timeout=30)
    except subprocess.TimeoutExpired:
        return "sinfo did not answer in 30 s"
    if not {"idle", "mixed", "allocated"} & set(states.stdout.split()):
        return f"no SLURM node up (sinfo: {(states.stdout + states.stderr).strip()[:200]!r})"
    return ""


def _copy_checkout(work: Path) -> None:
    """The repository's tracked files (as a clean checkout has them) into ``work``."""
    listed = subprocess.run(["git", "-C", str(REPO), "ls-files", "-z"], capture_output=True,
                            check=True, timeout=60).stdout.decode().split("\0")
    for name in filter(None, listed):
        source = REPO / name
        if source.is_file():
            target = work / name
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, target)


def _run_hosts(item: Item, work: Path, env: dict[str, str], deadline: float) -> Outcome:
    """A hosts block: its preamble here, then each machine's part at once in a namespace of
    its own, FIRST_HOST standing for the first one's address (module docstring). A block
    that names train.py finds train_script(item) there."""
    if str(REPO / "tests") not in sys.path:
        sys.path.append(str(REPO / "tests"))   # after the packages: tests/collectives is no package
    from netfault import Network
    ends = time.monotonic() + deadline
    preamble, parts = _sections(item.code, item.hosts)
    if "train.py" in item.code and not (work / "train.py").exists():
        (work / "train.py").write_text(train_script(item), encoding="utf-8")
    command = f"bash -euo pipefail block.sh, then block-NAME.sh on hosts {' '.join(item.hosts)}"
    with Network(len(item.hosts)) as net:
        first = net.hosts[0].addr

        exported = work.parent / "exported"

        def script(name: str, code: str) -> Path:
            path = work / name
            path.write_text(f"cd {shlex.quote(str(work))}\n" + code.replace(FIRST_HOST, first),
                            encoding="utf-8")
            return path
        # What the preamble exports reaches every machine's part, as if typed in its shell.
        preamble += f"\nexport -p > {shlex.quote(str(exported))}\n"
        returncode, output = _run(["bash", "-euo", "pipefail", str(script("block.sh", preamble))],
                                  work, env, deadline)
        outputs = [f"--- here ---\n{output}"]
        if returncode != 0:
            return Outcome(command, returncode, "".join(outputs))
        runs = []
        for host, name in zip(net.hosts, item.hosts):
            log = work.parent / f"output-{name}"
            part = f"source {shlex.quote(str(exported))}\n" + parts[name]
            argv = ["bash", "-euo", "pipefail", str(script(f"block-{name}.sh", part))]
            runs.append((name, host, net.run(host, argv, env, log_path=str(log)), log))
        codes: list[int | None] = []
        for name, host, proc, log in runs:
            try:
                codes.append(proc.wait(timeout=max(0.1, ends - time.monotonic())))
            except subprocess.TimeoutExpired:
                codes.append(None)
        net.close()
        for (name, host, _, log), code in zip(runs, codes):
            outputs.append(f"--- on {name} ({host.addr}, exit {code}) ---\n"
                           + log.read_text(encoding="utf-8", errors="replace"))
    bad = [c for c in codes if c != 0]
    return Outcome(command, bad[0] if bad else 0, "".join(outputs))


def train_script(item: Item) -> str:
    """The train.py a hosts block runs: the nearest python block above it on its page that
    starts with a ``# train.py`` line, else the script docs/getting-started/first-job.md
    saves as train.py (its first python block)."""
    blocks = parse_page((REPO / item.page).read_text(encoding="utf-8"), item.page)
    named = [b for b in blocks if b.line < item.line and b.lang in PYTHON_LANGS
             and b.code.startswith("# train.py")]
    if named:
        return named[-1].code
    page = "docs/getting-started/first-job.md"
    blocks = parse_page((REPO / page).read_text(encoding="utf-8"), page)
    return next(b.code for b in blocks if b.lang in PYTHON_LANGS)


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


def failure_message(item: Item, outcome: Outcome, deadline: float | None = None) -> str:
    """What a failed run says: the page and line, the command, and the output's tail."""
    deadline = item.deadline if deadline is None else deadline
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
