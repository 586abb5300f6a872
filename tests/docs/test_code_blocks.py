"""Every fenced code block of README.md and docs/ runs as its page says (tests/docs/doc_blocks.py
holds the convention): one test per block, its id ``page.md:LINE``; a failure names the page,
the line and the command, and shows what the run printed. Below, the reader itself on small
pages written here."""
from __future__ import annotations

import os
import textwrap

import pytest

from doc_blocks import (Block, Item, collect, failure_message, items_of, parse_page, run_item,
                        slurm_node_up)

ITEMS = collect()


def _param(item: Item):
    """A block marked ci runs with pytest -m ci, under its own deadline (doc_blocks)."""
    marks = [pytest.mark.ci, pytest.mark.timeout(item.deadline + 60)] \
        if "ci" in item.flags else []
    return pytest.param(item, marks=marks, id=item.id)


@pytest.mark.parametrize("item", [_param(item) for item in ITEMS])
def test_code_block(item: Item) -> None:
    if item.kind == "error":
        pytest.fail(f"{item.id}: {item.reason}", pytrace=False)
    if item.kind == "skip":
        pytest.skip(f"{item.id}: {item.reason}")
    if "root" in item.flags and os.geteuid() != 0:
        pytest.skip(f"{item.id}: needs root (its mark says root or hosts)")
    if "slurm" in item.flags and (why := slurm_node_up()):
        pytest.skip(f"{item.id}: {why} (scripts/slurm-one-node.sh, as root, starts one)")
    outcome = run_item(item)
    if not outcome.ok:
        pytest.fail(failure_message(item, outcome), pytrace=False)


def test_the_pages_are_read() -> None:
    """README.md and the docs pages are where the reader looks (a moved docs_dir would
    otherwise make every block silently disappear)."""
    from doc_blocks import pages
    names = {path.name for path in pages()}
    assert "README.md" in names and "index.md" in names, names


# --- the reader, on pages written here ----------------------------------------------------

PAGE = textwrap.dedent("""\
    # A page

    ```python
    x = 1
    ```

    <!-- test: continue -->
    ```python
    print(x + 1)
    ```

    <!-- test: gossip run -n 2 -->
    ```python
    import gossip
    ```

    <!-- test: continue -->

    ```py
    print("same chain")
    ```

    <!-- test: skip: needs two machines -->
    ```bash
    ssh node2 true
    ```

    <!-- test: sh -->
    ```console
    $ echo one \\
        two
    one two
    $ gossip --help
    usage: gossip ...
    ```

    ```text
    not run
    ```

    ````markdown
    ```python
    not a block of its own
    ```
    ````

    1. In a list:

        <!-- test: sh -->
        ```sh
        echo indented
        ```
    """)


def _items(text: str) -> list[Item]:
    return items_of(parse_page(text, "page.md"))


def test_reader_finds_blocks_and_marks() -> None:
    blocks = parse_page(PAGE, "page.md")
    assert [(b.line, b.lang, b.mark) for b in blocks] == [
        (3, "python", None), (8, "python", "continue"), (13, "python", "gossip run -n 2"),
        (19, "py", "continue"), (24, "bash", "skip: needs two machines"),
        (29, "console", "sh"), (37, "text", None), (41, "markdown", None),
        (50, "sh", "sh")]
    assert blocks[-1].code == "echo indented\n"          # the list item's indent is gone
    assert "```python" in blocks[-2].code                 # a longer fence holds a short one


def test_reader_makes_one_item_per_chain() -> None:
    items = _items(PAGE)
    assert [(i.id, i.kind) for i in items] == [
        ("page.md:3", "python"), ("page.md:13", "command"), ("page.md:24", "skip"),
        ("page.md:29", "sh"), ("page.md:50", "sh")]
    first, command, skip, console, _ = items
    assert first.code == "x = 1\nprint(x + 1)\n" and first.continued == [8]
    assert first.line_map == [4, 9]                       # the script's lines on the page
    assert command.command == "gossip run -n 2" and command.continued == [19]
    assert command.code == 'import gossip\nprint("same chain")\n'
    assert skip.reason == "needs two machines"
    # console: the `$ ` lines and what a trailing backslash carries on; output is not run
    assert console.code == "echo one \\\n    two\ngossip --help\n"


@pytest.mark.parametrize("text, why", [
    ("```bash\nls\n```\n", "an unmarked ```bash block"),
    ("<!-- test: python -->\n```console\n$ ls\n```\n", "on a ```console block"),
    ("<!-- test: sh -->\n```python\nx = 1\n```\n", "on a python block"),
    ("<!-- test: continue -->\n```python\nx = 1\n```\n", "no python block before"),
    ("<!-- test: skip -->\n```python\nx = 1\n```\n", "skip: REASON"),
    ("<!-- test: sh -->\n```text\nx\n```\n", "never run"),
    ("<!-- test: mpirun -np 2 -->\n```python\nx = 1\n```\n", "a command starting with"),
    ("```python\nx = 1\n", "never closed"),
], ids=["unmarked-shell", "python-mark-on-console", "sh-mark-on-python", "continue-first",
        "skip-without-reason", "mark-on-text", "unknown-command", "unclosed"])
def test_reader_refuses_what_would_go_unchecked(text: str, why: str) -> None:
    (item,) = _items(text)
    assert item.kind == "error" and why in item.reason, item.reason


def test_reader_ignores_other_languages_and_plain_comments() -> None:
    text = "<!-- a comment -->\n```yaml\na: 1\n```\n\n```\nplain\n```\n"
    assert _items(text) == []
    assert parse_page(text, "p.md")[0] == Block("p.md", 2, "yaml", "a: 1\n", None)


# --- the runner ----------------------------------------------------------------------------

def test_runner_gives_a_clean_directory_and_environment(monkeypatch) -> None:
    monkeypatch.setenv("GOSSIP_TOPOLOGY", "torus:9x9")
    monkeypatch.setenv("RANK", "3")
    code = ("import os, gossip\n"
            "assert sorted(os.listdir('.')) == ['benchmarks', 'block.py', 'examples', "
            "'pyproject.toml', 'scripts', 'tests']\n"
            "assert not any(k.startswith('GOSSIP_') for k in os.environ), os.environ\n"
            "assert 'RANK' not in os.environ\n"
            "print(gossip.__file__)\n")
    item = Item("page.md", 3, "python", code=code, lang="python", line_map=[4, 5, 6, 7, 8])
    outcome = run_item(item)
    assert outcome.ok, failure_message(item, outcome)
    from doc_blocks import REPO
    assert outcome.output.strip() == str(REPO / "gossip" / "__init__.py")


def test_runner_failure_names_page_line_and_command() -> None:
    item = Item("docs/x.md", 10, "python", code="x = 1\nraise SystemExit('boom')\n",
                lang="python", line_map=[11, 12], continued=[20])
    item.code = "x = 1\n1 / 0\n"
    outcome = run_item(item)
    message = failure_message(item, outcome)
    assert not outcome.ok
    assert message.startswith("docs/x.md:10 (continued at lines 20): the ```python block run "
                              "as `python block.py` exited 1"), message
    assert 'File "docs/x.md", line 12' in message and "ZeroDivisionError" in message


def test_runner_sh_and_deadline() -> None:
    ok = Item("p.md", 1, "sh", code="gossip --help | head -n 1\ntest -d scripts\n", lang="sh")
    outcome = run_item(ok)
    assert outcome.ok and outcome.output.startswith("usage: gossip"), outcome.output
    failing = Item("p.md", 5, "sh", code="false\necho not reached\n", lang="bash")
    outcome = run_item(failing)
    assert outcome.returncode == 1 and "not reached" not in outcome.output   # set -e
    slow = Item("p.md", 9, "sh", code="echo started\nsleep 30\n", lang="bash")
    outcome = run_item(slow, deadline=1)
    message = failure_message(slow, outcome, deadline=1)
    assert outcome.returncode is None and "did not finish within 1 s (killed)" in message
    assert "started" in message and "bash -euo pipefail block.sh" in message


# --- flags ---------------------------------------------------------------------------------

def test_reader_takes_flags_and_refuses_unknown_ones() -> None:
    text = ("<!-- test: sh, checkout, ci -->\n```bash\npip install .\n```\n\n"
            "<!-- test: gossip run -n 2, ci -->\n```python\nimport gossip\n```\n\n"
            "<!-- test: sh, hosts a b -->\n```bash\ntrue\n# on a\nhostname\n# on b\nhostname\n```\n\n"
            "<!-- test: sh, fast -->\n```bash\ntrue\n```\n\n"
            "<!-- test: sh, hosts a b -->\n```bash\n# on a\ntrue\n```\n")
    install, command, hosts, unknown, half = _items(text)
    assert (install.kind, install.flags, install.deadline) == ("sh", {"checkout", "ci"}, 900.0)
    assert (command.kind, command.command, command.flags) == ("command", "gossip run -n 2", {"ci"})
    assert hosts.hosts == ["a", "b"] and hosts.flags == {"hosts", "root"}
    assert unknown.kind == "error" and "unknown flag 'fast'" in unknown.reason
    assert half.kind == "error" and "no '# on NAME' line for b" in half.reason


@pytest.mark.skipif(os.geteuid() != 0, reason="network namespaces need root")
def test_runner_runs_each_part_of_a_hosts_block_on_its_own_machine() -> None:
    # b reaches a at 10.0.0.1 (the first machine's address there), and the preamble's exports
    # reach both parts; a failing part fails the block.
    code = ("export WORD=hello\n"
            "# on a\n"
            "python -c \"import socket, os; s = socket.create_server(('10.0.0.1', 7077)); "
            "open('listening', 'w').close(); "
            "c, peer = s.accept(); c.sendall(os.environ['WORD'].encode()); "
            "print('a served', peer[0])\"\n"
            "# on b\n"
            "python -c \"import os, socket; from gossip.testing import wait_until\n"
            "wait_until(lambda: os.path.exists('listening'), 30, what='a listening')\n"
            "c = socket.create_connection(('10.0.0.1', 7077), timeout=30)\n"
            "print('b got', c.recv(5).decode())\"\n")
    text = f"<!-- test: sh, hosts a b -->\n```bash\n{code}```\n"
    (item,) = _items(text)
    outcome = run_item(item)
    assert outcome.ok, failure_message(item, outcome)
    assert "b got hello" in outcome.output and "a served 10.77.0.2" in outcome.output, \
        outcome.output
    failing = _items(text.replace("print('b got'", "raise SystemExit(3) or print('b got'"))[0]
    outcome = run_item(failing)
    assert outcome.returncode == 3 and "--- on b" in outcome.output, outcome.output
