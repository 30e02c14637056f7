"""Every ``ho-plan`` command shown in the README and in ``docs/`` parses: its subcommand exists, and its options
and arguments are the command's, of the right types (nothing runs). A renamed or removed option cannot leave a
page behind."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import click
import pytest

from planner.cli import main
from planner.cli.main import _is_graph_argument

ROOT = Path(__file__).resolve().parent.parent
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
# A synopsis (``ho-plan GRAPH --hbm 64GB [--planner cpsat] ...``) shows the grammar, not a command to run.
INLINE = re.compile(r"`(ho-plan [^`]+)`")
SYNOPSIS = re.compile(r"\[|\bGRAPH\b|\bSCHEDULE\b|\bWORKLOAD\b|\.\.\.|<[a-z]")


def shown_commands() -> list[tuple[str, int, str]]:
    """(page, line, command) for every ``ho-plan`` command of the pages: in fenced code blocks, and in inline code
    that starts with ``ho-plan`` (within one line)."""
    out = []
    for page in PAGES:
        in_block, pending, start = False, "", 0
        for n, line in enumerate(page.read_text().splitlines(), 1):
            if line.lstrip().startswith("```"):
                in_block = not in_block
                continue
            if not in_block:
                out.extend((page.relative_to(ROOT).as_posix(), n, span) for span in INLINE.findall(line)
                           if not SYNOPSIS.search(span))
                continue
            text = pending + line.strip()
            if text.endswith("\\"):
                pending, start = text[:-1] + " ", start or n
                continue
            pending, first = "", start or n
            start = 0
            for part in text.split("&&"):
                part = re.sub(r"\s+#.*$", "", part.strip())
                if part.startswith("ho-plan ") and not SYNOPSIS.search(part):
                    out.append((page.relative_to(ROOT).as_posix(), first, part))
    return out


COMMANDS = shown_commands()


def parse(args: list[str]) -> None:
    """Parse ``ho-plan ARGS`` as the CLI does, without running it; raise click's UsageError (or exit) if it
    does not parse."""
    group: click.Group = main
    if args and args[0] not in group.commands and not _is_graph_argument(args[0]):
        raise click.exceptions.UsageError(f"No such command {args[0]!r}")
    name = args[0] if args and args[0] in group.commands else "plan"
    rest = args[1:] if name == args[0] else args
    cmd = group.commands[name]
    while isinstance(cmd, click.Group) and rest and rest[0] in cmd.commands:
        name, cmd, rest = rest[0], cmd.commands[rest[0]], rest[1:]
    if not rest and args and args[-1] == name:
        return  # a mention of the (sub)command by name, such as `ho-plan validate`: it exists
    with cmd.make_context(name, list(rest)) as _ctx:
        pass


def test_the_pages_show_commands():
    pages = {page for page, _n, _cmd in COMMANDS}
    assert len(COMMANDS) >= 40 and {"README.md", "docs/cpsat.md", "docs/reports.md"} <= pages


@pytest.mark.parametrize(("page", "line", "command"), COMMANDS,
                         ids=[f"{p}:{n}" for p, n, _c in COMMANDS])
def test_a_command_shown_in_the_docs_parses(page, line, command):
    args = shlex.split(command)[1:]
    try:
        parse(args)
    except (click.exceptions.UsageError, SystemExit) as exc:
        pytest.fail(f"{page}:{line}: {command!r} does not parse: {exc}")


def test_a_wrong_command_does_not_parse():
    """The check can fail: an option that does not exist, or a value of the wrong type."""
    for bad in (["g.json", "--hbm", "1GB", "--no-such-option"], ["sweep", "budget", "g.json", "--jobs", "many"],
                ["valdate"]):
        with pytest.raises((click.exceptions.UsageError, SystemExit)):
            parse(bad)
