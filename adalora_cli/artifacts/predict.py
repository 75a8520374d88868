"""``adalora predict``: a finished run applied to new inputs, one JSON line out per row in.

The input is a jsonl/csv/tsv/json/parquet table in the task's columns (GLUE: its text
column(s); SQuAD: ``question``, ``context``; summarization: the source column); an ``id``
column is carried over, else the row index is. Rows go through in batches of
``--batch-size`` with a progress bar. What each row gets:

- classification: ``label`` (the class name) and ``scores`` (softmax probability per class);
  regression (STS-B): ``score``;
- question answering: ``answer`` ("" when a v2 model prefers no answer);
- summarization: ``summary`` (the task's generation settings: beams, lengths);
- causal_lm: ``response``, greedy, from a ``prompt`` (or chat ``messages``) column.

The output is written under a temporary name and renamed when complete, and an existing
file is never overwritten.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import torch
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from ..config import ConfigError
from ..errors import writing
from .export import check_run


def _ids(ds) -> list[Any]:
    return list(ds["id"]) if "id" in ds.column_names else list(range(len(ds)))


@torch.no_grad()
def _classify(task, model, tokenizer, ds, device) -> list[dict[str, Any]]:
    from transformers import DataCollatorWithPadding

    from ..tasks.data import require_columns

    require_columns(ds, list(task.spec.text_columns), "the input")
    batch = DataCollatorWithPadding(tokenizer)(list(task.encode(ds, tokenizer)))
    logits = model(**{k: v.to(device) for k, v in batch.items()}).logits.float().cpu()
    if task.spec.is_regression:
        return [{"score": float(x)} for x in logits[:, 0]]
    probs = logits.softmax(dim=-1)
    names = task.spec.label_names
    return [{"label": names[int(p.argmax())],
             "scores": {n: round(float(v), 6) for n, v in zip(names, p)}} for p in probs]


@torch.no_grad()
def _answer(task, model, tokenizer, ds, device) -> list[dict[str, Any]]:
    from transformers import DataCollatorWithPadding

    from ..tasks.data import require_columns
    from ..tasks.squad_features import QAExample, build_features

    require_columns(ds, ["question", "context"], "the input")
    ids = [str(i) for i in _ids(ds)]
    examples = [QAExample(id=i, question=str(q), context=str(c), answers=(), answer_starts=())
                for i, q, c in zip(ids, ds["question"], ds["context"])]
    t = task.cfg.task
    features = build_features(tokenizer, examples, max_length=t.max_length,
                              doc_stride=t.doc_stride, training=False)
    starts, ends = task.predict_logits(model, features, batch_size=len(features) or 1,
                                       collate=DataCollatorWithPadding(tokenizer), device=device,
                                       autocast=_no_autocast)
    answers = task.answers(features, starts, ends)
    return [{"answer": answers[i]} for i in ids]


@torch.no_grad()
def _summarize(task, model, tokenizer, ds, device) -> list[dict[str, Any]]:
    from ..tasks.data import require_columns

    column = task.spec.source_column
    require_columns(ds, [column], "the input")
    sources = task.source_texts(ds[column])  # with task.source_prefix (T5)
    enc = tokenizer(sources, max_length=task.cfg.task.max_length, truncation=True,
                    padding=True, return_tensors="pt")
    inputs = {k: enc[k].to(device) for k in ("input_ids", "attention_mask")}
    ids = model.generate(**inputs, **task.generation_kwargs())
    return [{"summary": s.strip()} for s in tokenizer.batch_decode(ids, skip_special_tokens=True)]


def _no_autocast():
    import contextlib

    return contextlib.nullcontext()


def _family(task):
    if hasattr(task, "predict_rows"):  # a task that knows its own predictions (causal_lm)
        return lambda task, model, tokenizer, ds, device: task.predict_rows(
            model, tokenizer, ds, device)
    from ..tasks.glue import TextClassificationTask
    from ..tasks.squad import SquadTask
    from ..tasks.summarization import SummarizationTask

    if isinstance(task, TextClassificationTask):
        return _classify
    if isinstance(task, SquadTask):
        return _answer
    if isinstance(task, SummarizationTask):
        return _summarize
    raise ConfigError(f"predict does not know task {task.name!r}")


def predict(run_dir: str | Path, input_path: str | Path, output_path: str | Path, *,
            batch_size: int = 32, device: str = "cpu", quiet: bool = False) -> int:
    """Write one prediction per input row to ``output_path`` (jsonl); returns the row count."""
    from ..engine.build import pick_device
    from ..tasks import get_task
    from ..tasks.data import read_table
    from .load import load_run

    run_dir, output_path = Path(run_dir), Path(output_path)
    check_run(run_dir)
    if batch_size < 1:
        raise ConfigError(f"--batch-size must be >= 1, got {batch_size}")
    if output_path.exists():
        raise ConfigError(f"{output_path} already exists; choose a new --output (predictions "
                          "never overwrite)")
    ds = read_table(input_path)
    dev = pick_device(device, setting="--device")
    model, tokenizer, cfg = load_run(run_dir, str(dev))
    model.eval()
    task = get_task(cfg)
    task.tokenizer = tokenizer
    run_rows = _family(task)
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
                rows = run_rows(task, model, tokenizer, chunk, dev)
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
