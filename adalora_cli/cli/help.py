"""How every command's help reads: one notation for what a command takes, examples, a page.

Arguments and option values are named in capitals, as the docs write them (``RUN_DIR``,
``--nproc NPROC``), in the usage line, the panels and the error messages alike; a flag
shows no value. Left to itself typer writes ``[run_dir]`` in the usage line,
``<path>``/``<list[str]>`` in the panels and ``--dry-run <bool>`` for a flag. Every command
is built with :class:`Command` (a group with :class:`Group`); a command's docstring ends
with its examples and a ``Docs:`` line naming its page (tests/cli/test_help.py runs every
example through the parser and opens every page).
"""

from __future__ import annotations

import inspect
from typing import Any

import typer
from typer.core import TyperArgument, TyperCommand, TyperGroup, TyperOption


def _no_type(ctx: Any = None) -> None:
    return None


def plain(params: list[Any]) -> list[Any]:
    """Give every parameter without a metavar its capitals: an argument its name
    (``RUN_DIR``), an option taking a value its long name (``--batch-size BATCH_SIZE``),
    a flag none (``""`` hides typer's ``<bool>``)."""
    for param in params:
        if isinstance(param, TyperOption):
            if param.is_flag or param.count:
                param.metavar = ""
            elif param.metavar is None:
                longest = max(param.opts, key=len)
                param.metavar = longest.lstrip("-").replace("-", "_").upper()
        elif isinstance(param, TyperArgument):
            if param.metavar is None:
                param.metavar = (param.name or "").upper()
            # the capitals say what it is; typer's type column (<path>) would be a second
            # notation beside them, and TyperArgument shows it even with a metavar
            param.display_type_rich = _no_type
    return params


def usage(params: list[Any], options_metavar: str | None) -> list[str]:
    """The usage line's pieces: ``[OPTIONS] RUN_DIR [KEY=VALUE]...``, an optional argument
    in brackets and a required one bare (typer puts the latter in braces)."""
    pieces = [options_metavar] if options_metavar else []
    for param in params:
        if isinstance(param, TyperArgument):
            piece = param.metavar if param.required else f"[{param.metavar}]"
            pieces.append(piece + ("..." if param.nargs != 1 else ""))
    return pieces


def reflow(text: str | None) -> str | None:
    """A docstring's prose paragraphs as one line each, so that the help wraps them to the
    terminal (typer keeps every line break: prose written to 92 columns breaks in two at
    80); a paragraph with indented lines, such as the examples, keeps its lines."""
    if not text:
        return text
    paragraphs = inspect.cleandoc(text).split("\n\n")
    return "\n\n".join(p if any(line.startswith(" ") for line in p.splitlines()[1:])
                       else " ".join(line.strip() for line in p.splitlines())
                       for p in paragraphs)


class _Plain:
    """What a command and a group share: reflowed help text, plain parameter notation."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.help, self.epilog = reflow(self.help), reflow(self.epilog)

    def get_params(self, ctx: typer.Context) -> list[Any]:
        return plain(super().get_params(ctx))

    def collect_usage_pieces(self, ctx: typer.Context) -> list[str]:
        return usage(self.get_params(ctx), self.options_metavar)


class Command(_Plain, TyperCommand):
    pass


class Group(_Plain, TyperGroup):
    def collect_usage_pieces(self, ctx: typer.Context) -> list[str]:
        return [*super().collect_usage_pieces(ctx), self.subcommand_metavar]
