"""``adalora configs``: the shipped configs and sweep manifests, listed and copied to edit."""

from __future__ import annotations

import typer

from .boundary import boundary, out
from .help import Command, Group

app = typer.Typer(
    cls=Group,
    add_completion=False,
    context_settings={"help_option_names": ["-h", "--help"]},
    pretty_exceptions_enable=False,
)


@app.callback(invoke_without_command=True)
def configs(ctx: typer.Context) -> None:
    """List the configs and sweep manifests that ship with adalora, or copy one to edit.

    Without a subcommand it lists them, one line each: the name, then the first sentence
    of the file's header. The files are the same whether adalora runs from a checkout or
    from an installed wheel.

    Examples:
      adalora configs
      adalora configs cp glue/rte my_rte.yaml
      adalora configs cp experiments/table1_glue.yaml my_sweeps/

    Docs: docs/training.md#shipped-configs"""
    if ctx.invoked_subcommand is None:
        list_configs()


@app.command("ls", cls=Command)
def list_configs() -> None:
    """List the shipped configs and manifests, one line each.

    Examples:
      adalora configs ls
      adalora configs ls | grep glue

    Docs: docs/training.md#shipped-configs"""
    from ..resources import describe, shipped_files

    with boundary(os_errors=True):
        rows = [(f.name, describe(f.path)) for f in shipped_files()]
    console = out()
    width = max(len(name) for name, _ in rows)
    for name, text in rows:
        line = f"{name:<{width}}  {text or '(no header comment)'}"
        if console.is_terminal and len(line) > console.width:  # one line each, whole in a pipe
            line = line[:console.width - 1] + "…"
        console.print(line, highlight=False, markup=False, soft_wrap=True)


@app.command("cp", cls=Command)
def copy_config(
    name: str = typer.Argument(
        ..., help="A shipped config or manifest: its path as listed (configs/glue/rte.yaml) "
                  "or short (glue/rte, table1_glue)"),
    dest: str = typer.Argument(
        ..., help="The new file, or a folder to put it in (kept name); never overwritten"),
) -> None:
    """Copy a shipped config or manifest to a new file, to edit and run.

    Examples:
      adalora configs cp glue/rte my_rte.yaml
      adalora configs cp configs/demo/rotten_tomatoes.yaml mine/
      adalora train my_rte.yaml

    Docs: docs/training.md#shipped-configs"""
    from ..resources import copy_shipped

    with boundary(os_errors=True):
        source, target = copy_shipped(name, dest)
    out().print(f"wrote {target}; run it with: adalora {source.command} {target}",
                highlight=False, soft_wrap=True)
