"""``adalora eval``: score a finished run again, on its task's evaluation splits or other data.

The run is rebuilt with :func:`adalora_cli.weights.load_run`; ``key=value`` overrides may
change only where the data comes from and how it is read (``task.*``) and how it is run
(``train.eval_batch_size``, ``train.device``, ``train.precision``). It scores in the
precision the run's own scores came from, unless ``train.precision`` says otherwise
(:mod:`.scoring`), and says which. Results go to
``eval/<name>.json`` (and predictions to ``eval/<name>/``) inside the run directory; the
training results (``summary.json``, ``metrics.jsonl``, ``predictions.*``) are never touched.

Tasks load their training split together with the evaluation splits; an evaluation only
needs one training row, so ``task.max_train_samples`` is set to 1, and when the overrides
map only evaluation files (``task.data_files.validation=...``) the training split is read
from the run's own data source.
"""

from __future__ import annotations

import dataclasses
import re
import sys
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from ..config import ConfigError, RunConfig, load_config
from ..rundir.layout import CONFIG, EVAL
from ..rundir.run import write_json_atomic
from .export import check_run

EVAL_DIR = EVAL
ALLOWED = ("task.", "train.eval_batch_size", "train.device", "train.precision")
TRAINING_ONLY = {
    "task.name": "the model was trained for its task",
    "task.max_train_samples": "it picks training rows, and eval trains nothing",
    "task.packing": "it packs training rows, and eval trains nothing",
    "task.labels": "the model's head has the run's classes, recorded in its config.yaml",
    "task.regression": "the model's head is the run's classifier or regressor",
}
"""task.* keys eval refuses, and why: accepted, they would be silently ignored (or change
what the model is)."""


def check_overrides(overrides: list[str]) -> None:
    for item in overrides:
        key = item.split("=", 1)[0].strip()
        if "=" not in item or not key.startswith(ALLOWED):
            raise ConfigError(f"eval takes task.* and train.eval_batch_size/device/precision "
                              f"overrides, not {item!r}; the trained model stays as it was")
        if key in TRAINING_ONLY:
            raise ConfigError(f"{key} cannot change in eval: {TRAINING_ONLY[key]}")


def eval_name(cfg: RunConfig, overrides: list[str], name: str | None) -> str:
    """``--name``, else the stem of the first data file an override names, else the
    task's evaluation splits."""
    if name:
        chosen = name
    else:
        files = [o.split("=", 1)[1] for o in overrides if o.startswith("task.data_files.")]
        folder = [o.split("=", 1)[1] for o in overrides if o.startswith("task.data_dir=")]
        chosen = Path(files[0]).stem if files else Path(folder[0]).name if folder else "default"
    if not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9._-]*", chosen):
        raise ConfigError(f"eval name {chosen!r} is not a plain file name; pass --name NAME "
                          "(letters, digits, . _ -)")
    return chosen


def eval_config(run_dir: Path, overrides: list[str]) -> RunConfig:
    """The run's config with the overrides, reading just one training row."""
    from ..engine.build import resolve_resources

    trained = load_config(run_dir / CONFIG)
    keys = [o.partition("=")[0].strip() for o in overrides]
    if trained.task.revision is not None and "task.revision" not in keys and any(
            k == "task.data_dir" or k.startswith("task.data_files") for k in keys):
        # the run read a pinned hub revision; the files named here have none
        overrides = [*overrides, "task.revision=null"]
    cfg = resolve_resources(load_config(run_dir / CONFIG, overrides))
    task = cfg.task
    files = dict(task.data_files) if task.data_files else None
    if files is not None and "train" not in files:
        files["train"] = _train_source(resolve_resources(trained), files)
    task = dataclasses.replace(task, data_files=files, max_train_samples=1)
    return dataclasses.replace(cfg, task=task)


def _train_source(trained: RunConfig, files: dict[str, str]) -> str:
    """A file for the (unused) training split: the run's own, else a file the user gave."""
    from ..tasks.data import find_split_files

    t = trained.task
    if t.data_files and "train" in t.data_files:
        return t.data_files["train"]
    if t.data_dir:
        try:
            return str(find_split_files(t.data_dir, ["train"])["train"])
        except ConfigError:
            pass
    return next(iter(files.values()))


def rescore(run_dir: str | Path, overrides: list[str] | None = None,
            name: str | None = None, quiet: bool = False) -> Path:
    """Evaluate a finished run; returns the path of ``eval/<name>.json``."""
    from ..engine.build import pick_device
    from ..engine.precision import requested
    from ..engine.progress import PhaseLines, phase_seconds
    from ..errors import warning
    from ..tasks import get_task
    from ..tasks import progress as task_progress
    from .load import load_run
    from .scoring import choose

    run_dir, overrides = Path(run_dir), list(overrides or [])
    summary = check_run(run_dir)
    check_overrides(overrides)
    cfg = eval_config(run_dir, overrides)
    label = eval_name(cfg, overrides, name)
    asked = requested(cfg) if any(
        o.partition("=")[0].strip() == "train.precision" for o in overrides) else None
    scoring = choose(cfg, summary, pick_device(cfg.train.device), asked,
                     lambda value: f"train.precision={value}")
    device = scoring.device
    if not quiet:
        print(scoring.line, file=sys.stderr, flush=True)
    task = get_task(cfg)
    model, tokenizer, _ = load_run(run_dir, str(device), scoring.base_dtype)
    data = task.load_data(tokenizer)
    for line in data.notes:  # e.g. rows left out of the scored split
        warning(line)
    metrics: dict[str, dict[str, float]] = {}
    lines = PhaseLines(0.0 if quiet else phase_seconds())  # how far along, every interval
    for split, dataset in data.eval_splits.items():
        lines.begin(f"evaluating {split} ({len(dataset)} rows)", show=not quiet)
        with task_progress.listening(lines.report), lines.watching():
            scores = task.evaluate(model, split, dataset,
                                   batch_size=cfg.train.eval_batch_size, collate=data.collate,
                                   device=device, autocast=scoring.autocast)
        metrics[split] = {k: float(v) for k, v in scores.items()}
    return _write_result(run_dir, label, overrides, metrics, data.info, task,
                         scoring.record())


def _write_result(run_dir: Path, label: str, overrides: list[str],
                  metrics: dict[str, dict[str, float]], info: dict[str, Any], task,
                  precision: dict[str, Any]) -> Path:
    folder = run_dir / EVAL_DIR
    folder.mkdir(exist_ok=True)
    (folder / label).mkdir(exist_ok=True)  # SQuAD answers, summaries: beside the scores
    written = [str(p.relative_to(run_dir)) for p in task.save_predictions(folder / label)]
    if not any((folder / label).iterdir()):
        (folder / label).rmdir()  # a task without predictions leaves no empty folder
    data = {k: v for k, v in info.items() if not k.startswith("train_")}
    result = {"name": label, "overrides": overrides, "metrics": metrics, "data": data,
              "predictions": written, "precision": precision,
              "evaluated": datetime.now(timezone.utc).isoformat(timespec="seconds")}
    path = folder / f"{label}.json"
    write_json_atomic(path, result)
    return path
