"""``adalora predict``: a finished run applied to new inputs, one JSON line out per row in.

The input is a jsonl/csv/tsv/json/parquet table in the task's columns; an ``id`` column is
carried over, else the row index is. What each row gets is the task's to say
(``Task.predict_rows``; docs/using-a-run.md lists them): a class name and probabilities, an
answer, a summary, a response. Everything that can be wrong with the arguments (a missing
``--input``, its columns, a row with nothing to predict from, an existing ``--output``) is
said before the model loads. Rows go through in batches of ``--batch-size`` with a progress
bar, on the run's device and in the precision its own scores came from unless ``--device``
or ``--precision`` say otherwise (:mod:`.scoring`), so that a row of the run's evaluation
data gets the prediction the run's evaluation made.

The output is written under a temporary name and renamed when complete, and an existing
file is never overwritten.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from ..config import ConfigError, load_config
from ..errors import shown, writing
from ..rundir.layout import CONFIG
from .export import check_run


def _ids(ds) -> list[Any]:
    return list(ds["id"]) if "id" in ds.column_names else list(range(len(ds)))


def read_input(input_path: Path):
    """The ``--input`` table; a missing or unreadable file is a one-line error naming the
    option."""
    from ..tasks.data import EXTENSIONS, read_table

    if not input_path.is_file():
        what = "is a folder" if input_path.is_dir() else "does not exist"
        raise ConfigError(f"--input {input_path} {what}; pass a file of rows to predict "
                          f"({'/'.join(EXTENSIONS)}) in the task's columns")
    return read_table(input_path)


def check_filled(ds, columns: list[str], where: str) -> None:
    """Refuse, in one line naming the row, an input row that leaves a column the task reads
    null or empty: the model would answer it anyway (a causal LM continues an empty prompt
    with whatever it likes, a classifier scores the empty sentence) and nothing in the
    output would say the answer was about nothing."""
    for column in columns:
        for i, value in enumerate(ds[column]):
            if value is None or (isinstance(value, (str, list, dict))
                                 and not (value.strip() if isinstance(value, str) else value)):
                ident = f" (id {shown(ds['id'][i])})" if "id" in ds.column_names else ""
                what = "null" if value is None else "empty"
                raise ConfigError(f"{where}: row {i + 1}{ident} has {what} {column!r}; every "
                                  "row needs one to predict from: fill it in or drop the row")


def predict(run_dir: str | Path, input_path: str | Path, output_path: str | Path, *,
            batch_size: int = 32, device: str | None = None, precision: str | None = None,
            quiet: bool = False) -> int:
    """Write one prediction per input row to ``output_path`` (jsonl); returns the row count.
    ``device`` and ``precision`` (a ``train.precision`` value): None for the run's own."""
    from ..engine.build import resolve_resources
    from ..tasks import get_task
    from .load import check_weights, load_run
    from .scoring import check_precision, choose, predict_device

    run_dir, input_path, output_path = Path(run_dir), Path(input_path), Path(output_path)
    summary = check_run(run_dir)
    if batch_size < 1:
        raise ConfigError(f"--batch-size must be >= 1, got {batch_size}")
    if precision is not None:
        check_precision(precision, "--precision")
    if output_path.exists():
        raise ConfigError(f"{output_path} already exists; choose a new --output (predictions "
                          "never overwrite)")
    ds = read_input(input_path)
    cfg = resolve_resources(load_config(run_dir / CONFIG))
    task = get_task(cfg)
    where = f"--input {input_path}"
    check_filled(ds, task.predict_columns(list(ds.column_names), where), where)  # before the model
    check_weights(run_dir, cfg)  # a run without weights: its one line, before any other
    scoring = choose(cfg, summary, predict_device(cfg, device), precision,
                     lambda value: f"--precision {value}")
    dev = scoring.device
    if not quiet:
        print(scoring.line, file=sys.stderr, flush=True)
    model, tokenizer, _ = load_run(run_dir, str(dev), scoring.base_dtype)
    model.eval()
    task.tokenizer = tokenizer
    ids = _ids(ds)
    tmp = output_path.with_name(f".{output_path.name}.partial")
    output_path.parent.mkdir(parents=True, exist_ok=True)
    # a failed write (a full disk) names the output, not the hidden temporary file
    def written():
        return writing(output_path, written_as=tmp)

    handle = None
    try:
        with written():
            handle = tmp.open("w", encoding="utf-8")
        with _progress(quiet) as progress:
            bar = progress.add_task("predict", total=len(ds))
            for lo in range(0, len(ds), batch_size):
                chunk = ds.select(range(lo, min(lo + batch_size, len(ds))))
                # the tasks' own autocast is off in predict_rows; this one covers it all
                with scoring.autocast():
                    rows = task.predict_rows(model, tokenizer, chunk, dev)
                with written():
                    for key, row in zip(ids[lo:lo + batch_size], rows):
                        handle.write(json.dumps({"id": key, **row}, ensure_ascii=False) + "\n")
                progress.update(bar, advance=len(chunk))
        with written():
            handle.close()
        os.replace(tmp, output_path)
    except BaseException:
        _close_quietly(handle)  # its buffer cannot be flushed either (the disk is full)
        tmp.unlink(missing_ok=True)
        raise
    return len(ds)


def _close_quietly(handle) -> None:
    if handle is not None and not handle.closed:
        try:
            handle.close()
        except OSError:
            pass


def _progress(quiet: bool) -> Progress:
    return Progress(TextColumn("[bold]predict[/]"), BarColumn(), MofNCompleteColumn(),
                    TimeElapsedColumn(), console=Console(stderr=True), disable=quiet)
