"""``adalora predict``: a finished run's predictions for new rows, one JSON line each."""

from __future__ import annotations

from pathlib import Path

import typer

from .boundary import boundary, out, quiet_libraries


def predict(
    run_dir: Path = typer.Argument(..., help="A finished run directory"),
    input_path: Path = typer.Option(..., "--input", "-i",
                                    help="jsonl/csv/tsv/json/parquet in the task's columns"),
    output_path: Path = typer.Option(..., "--output", "-o", help="jsonl to write (new file)"),
    batch_size: int = typer.Option(32, "--batch-size", help="Rows per batch"),
    device: str = typer.Option("cpu", "--device", help="cpu, cuda, cuda:1, ..."),
    quiet: bool = typer.Option(False, "--quiet", "-q", help="No progress bar."),
) -> None:
    """Labels and scores (classification), answers (QA) or summaries, one JSON line per row."""
    from ..artifacts.predict import predict as predict_rows

    quiet_libraries()
    with boundary():
        n = predict_rows(run_dir, input_path, output_path, batch_size=batch_size,
                         device=device, quiet=quiet)
    out().print(f"wrote {n} predictions to {output_path}", highlight=False, soft_wrap=True)
