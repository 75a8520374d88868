"""``adalora`` command line: parse, call one function, say where the results went.

User errors (bad config, missing files, impossible schedules) print one line starting
with ``error:`` and exit 2; a run that breaks while training exits 1 with one line and
leaves its directory marked failed. ``ADALORA_DEBUG=1`` shows the full traceback.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import typer
from rich.console import Console
from rich.table import Table

from .config import ConfigError, load_config

app = typer.Typer(
    add_completion=False,
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    help="AdaLoRA and its baselines (Zhang et al., ICLR 2023): train, sweep, report.",
)


def out() -> Console:  # made per call so redirected or captured streams are honoured
    return Console()


def err() -> Console:
    return Console(stderr=True)


def _quiet_libraries() -> None:
    """Our progress bar and one-line errors only: silence the libraries' load reports,
    per-map progress bars and advisory warnings (real errors still raise)."""
    os.environ.setdefault("TRANSFORMERS_NO_ADVISORY_WARNINGS", "1")
    import datasets
    import transformers

    transformers.utils.logging.set_verbosity_error()
    transformers.utils.logging.disable_progress_bar()
    datasets.utils.logging.set_verbosity_error()
    datasets.disable_progress_bars()


@app.callback()
def main() -> None:
    """AdaLoRA experiment runner."""


def _fail(message: str, code: int) -> None:
    err().print(f"[bold red]error:[/] {message}", highlight=False, soft_wrap=True)
    raise typer.Exit(code)


def _debug() -> bool:
    return os.environ.get("ADALORA_DEBUG", "") not in ("", "0")


@app.command(context_settings={"allow_extra_args": False})
def train(
    config: Path = typer.Argument(..., help="YAML config, e.g. configs/glue/rte.yaml"),
    overrides: list[str] | None = typer.Argument(
        None, help="key=value overrides with dotted keys, e.g. method.name=lora lora.r=8"),
    run_dir: Path | None = typer.Option(
        None, "--run-dir", help="Output directory (default: runs/<task>-<method>-s<seed>-<time>); "
                                "must not hold an earlier run."),
    dry_run: bool = typer.Option(
        False, "--dry-run",
        help="Build model and method, print the parameter table, train nothing."),
    quiet: bool = typer.Option(False, "--quiet", "-q", help="No progress bar."),
) -> None:
    """Fine-tune one model with one method on one task and write a run directory."""
    from . import train as training  # heavy imports only once the arguments parse

    _quiet_libraries()
    try:
        cfg = load_config(config, overrides or [])
        if dry_run:
            _print_dry_run(training.dry_run(cfg))
            return
        path = training.train(cfg, run_dir, quiet=quiet)
    except ConfigError as e:
        if _debug():
            raise
        _fail(str(e), 2)
    except KeyboardInterrupt:
        _fail("interrupted; the run directory is marked failed", 130)
    except Exception as e:  # a run that broke mid-way: one line, the directory says failed
        if _debug():
            raise
        where = getattr(e, "run_dir", None)
        suffix = f" (run directory marked failed: {where})" if where else ""
        _fail(f"{type(e).__name__}: {training.first_line(e)}{suffix}; "
              "rerun with ADALORA_DEBUG=1 for the traceback", 1)
    _print_result(path)


def _print_dry_run(result: dict) -> None:
    table = Table(title="adapter modules", show_lines=False)
    table.add_column("module", overflow="fold")
    table.add_column("kind")
    table.add_column("adapter params", justify="right")
    table.add_column("trainable", justify="right")
    for row in result["table"]:
        table.add_row(row["module"], row["kind"], f"{row['adapter_params']:,}",
                      f"{row['trainable']:,}")
    console = out()
    console.print(table)
    info = result["info"]
    console.print(f"adapter params (the paper's # Params): {info['adapter_params']:,}  "
              f"head params: {info['head_params']:,}  matrices: {info['n_matrices']}")
    print(json.dumps(info), flush=True)  # last line: machine-readable


def _print_result(path: Path) -> None:
    summary = json.loads((path / "summary.json").read_text())
    console = out()
    for split, metrics in summary["metrics"].items():
        shown = "  ".join(f"{k} {v:.4f}" for k, v in metrics.items())
        console.print(f"{split}: {shown}")
    console.print(f"run directory: {path}")


if __name__ == "__main__":  # pragma: no cover
    sys.exit(app())
