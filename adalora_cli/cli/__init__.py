"""``adalora`` command line: parse, call one function, say where the results went.

One module per command; each hands its work to the layer that owns it (``engine`` trains,
``sweep`` sweeps, ``report`` reports, ``artifacts`` exports, scores and predicts) inside the
one error boundary (``boundary.py``): user errors (bad config, missing files, impossible
schedules) print one line starting with ``error:`` and exit 2; a run that breaks while
training exits 1 with one line and leaves its directory marked failed. ``ADALORA_DEBUG=1``
shows the full traceback.
"""

from __future__ import annotations

import sys

import typer

from .. import threads
from . import configs, doctor, export, predict, report, sweep, train, tune
from . import eval as eval_command
from .help import Command, Group

app = typer.Typer(
    cls=Group,
    add_completion=False,
    no_args_is_help=True,
    context_settings={"help_option_names": ["-h", "--help"]},
    pretty_exceptions_enable=False,
    help="AdaLoRA and its baselines (Zhang et al., ICLR 2023): train, sweep, report, "
         "export, eval, predict.",
    epilog="Examples:\n"
           "  adalora train configs/demo/rotten_tomatoes.yaml\n"
           "  adalora configs\n"
           "  adalora train -h\n\n"
           "Docs: README.md; every command's -h names its page under docs/",
)


def _version(value: bool) -> None:
    if value:
        from importlib.metadata import PackageNotFoundError, version

        from .boundary import out

        try:
            number = version("adalora")
        except PackageNotFoundError:  # run from a checkout that was never installed
            number = "unknown (not installed; run make install)"
        out().print(f"adalora {number}", highlight=False)
        raise typer.Exit(0)


@app.callback()
def main(
    show_version: bool = typer.Option(
        False, "--version", callback=_version, is_eager=True,
        help="Print adalora's version and exit."),
) -> None:
    """AdaLoRA experiment runner."""
    threads.apply_defaults()  # before torch loads: OpenMP reads its settings once


COMMANDS = {"train": train.train, "sweep": sweep.sweep, "tune": tune.tune,
            "report": report.report,
            "export": export.export, "eval": eval_command.eval_run, "predict": predict.predict,
            "doctor": doctor.doctor}
"""In the order ``adalora --help`` lists them."""

for name, command in COMMANDS.items():
    # no arguments beyond the declared ones: a stray word is an error, not ignored
    app.command(name, cls=Command, context_settings={"allow_extra_args": False})(command)
app.add_typer(configs.app, name="configs")


if __name__ == "__main__":  # pragma: no cover
    sys.exit(app())
