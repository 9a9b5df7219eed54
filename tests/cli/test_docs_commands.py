"""Every `cuvil-edge ...` command the README and the docs show exists, with the options shown:
an operator following docs/DEPLOYMENT.md command by command must not meet "No such option"."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import click
import pytest
from typer.main import get_command

from cuvil_edge.cli import main as cli

ROOT = Path(__file__).resolve().parents[2]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]


def shown_commands(text: str) -> list[str]:
    """`cuvil-edge ...` lines of fenced blocks (continuations joined, comments cut) and inline code."""
    found = []
    for block in re.findall(r"```[a-z]*\n(.*?)```", text, re.S):
        for line in block.replace("\\\n", " ").splitlines():
            line = re.sub(r"\s#.*$", "", line)
            for part in re.split(r"&&|;|\|\|", line):
                m = re.search(r"(?<![\w/.-])cuvil-edge (?=-*[a-z])", part)
                if m and not part[:m.start()].rstrip().endswith("install"):  # `pip install cuvil-edge`
                    found.append(part[m.start():].strip())
    found += re.findall(r"`(cuvil-edge [^`]+)`", text)
    return found


def _root() -> click.Group:
    return get_command(cli.mounted_app())


def check(command: str) -> None:
    tokens = [t.strip("[]") for t in shlex.split(command.replace("|", " "))][1:]
    node: click.Command = _root()
    path = ["cuvil-edge"]
    for token in tokens:
        if isinstance(node, click.Group) and token in node.commands:
            node = node.commands[token]
            path.append(token)
        elif token.startswith("--"):
            names = {n for p in node.params for n in getattr(p, "opts", []) + getattr(p, "secondary_opts", [])}
            assert token.split("=")[0] in names | {"--help"}, f"{' '.join(path)} has no option {token} ({command})"
        elif isinstance(node, click.Group) and not token.startswith(("-", "<", ".", "/")) and token.isidentifier():
            raise AssertionError(f"{' '.join(path)} has no subcommand {token!r} ({command})")
    assert len(path) > 1, f"no subcommand in {command!r}"


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: p.name)
def test_every_command_the_docs_show_exists_with_its_options(doc):
    commands = shown_commands(doc.read_text(encoding="utf-8"))
    for command in commands:
        check(command)


def test_deployment_guide_walks_every_step():
    text = (ROOT / "docs" / "DEPLOYMENT.md").read_text(encoding="utf-8")
    shown = " ".join(shown_commands(text))
    for step in ("coordinator init", "coordinator certs", "agent init", "coordinator enroll", "coordinator serve",
                 "agent run", "cuvil-edge run", "cuvil-edge status", "keys rotate", "keys revoke", "--replace"):
        assert step in shown, step


def test_the_checker_catches_a_wrong_option():
    with pytest.raises(AssertionError, match="no option --adress"):
        check("cuvil-edge coordinator serve --adress 0.0.0.0:9093")
    with pytest.raises(AssertionError, match="no subcommand"):
        check("cuvil-edge coordinator serv --home x")
