"""``adalora predict``: a finished run's predictions for new rows, one JSON line each."""

from __future__ import annotations

from pathlib import Path

import typer

from .boundary import boundary, out, quiet_libraries


def predict(
    run_dir: Path = typer.Argument(..., help="A finished run directory"),
    input_path: Path = typer.Option(..., "--input", "-i", metavar="FILE",
                                    help="jsonl/csv/tsv/json/parquet in the task's columns"),
    output_path: Path = typer.Option(..., "--output", "-o", metavar="FILE",
                                     help="jsonl to write (new file)"),
    batch_size: int = typer.Option(32, "--batch-size", help="Rows per batch"),
    device: str | None = typer.Option(
        None, "--device", metavar="DEVICE",
        help="cpu, cuda, cuda:1, ... (default: the run's train.device, auto: CUDA when "
             "present)"),
    precision: str | None = typer.Option(
        None, "--precision", metavar="PRECISION",
        help="fp32, bf16, fp16 or auto (default: the precision the run's own scores came "
             "from, e.g. bf16 autocast; said on stderr)"),
    quiet: bool = typer.Option(False, "--quiet", "-q", help="No progress bar."),
) -> None:
    """A finished run's predictions for new rows: labels, answers, summaries or replies.

    Reads --input (jsonl, csv, tsv, json or parquet) in the columns the run's task reads
    and writes --output, one JSON line per row: its id (the file's id column, else the row
    number) and the prediction, by task family (causal_lm's chat: a messages, sharegpt
    conversations or alpaca instruction column, asked without its closing reply):

      family          reads                               writes
      classification  its text column(s), e.g. sentence   label, scores
      regression      its text column(s), e.g. sentence1  score
      squad           question, context                   answer
      summarization   its source column, e.g. document    summary
      causal_lm       prompt, text or a chat              response

    It runs on the run's device and in the precision the run's own scores came from (one
    line on stderr says which), so a row of the run's evaluation data gets the prediction
    its evaluation made; --device and --precision change them.

    Examples:
      adalora predict runs/sst2-lora-s0-... -i reviews.csv -o labels.jsonl
      adalora predict runs/squad_v2-adalora-s0-... -i qs.jsonl -o answers.jsonl

    Docs: docs/using-a-run.md"""
    from ..artifacts.predict import predict as predict_rows

    quiet_libraries()
    with boundary():
        n = predict_rows(run_dir, input_path, output_path, batch_size=batch_size,
                         device=device, precision=precision, quiet=quiet)
    out().print(f"wrote {n} predictions to {output_path}", highlight=False, soft_wrap=True)
