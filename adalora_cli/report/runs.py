"""Reading run directories for ``adalora report``: which tasks show which columns.

A run directory is any folder holding a ``status.json`` or ``summary.json``, at any depth,
so runs trained by hand, by several sweeps or on several machines mix freely. Only
finished runs are read; every other one is returned with the reason it is left out, and
a malformed file never raises. GLUE metrics are stored as fractions and shown x100 like
the paper; SQuAD and ROUGE are stored x100 already.
"""

from __future__ import annotations

import json
import math
import os
from dataclasses import dataclass
from pathlib import Path

import yaml

from ..rundir.layout import CONFIG, EVAL, STATUS, SUMMARY
from ..rundir.owner import owner_alive, read_heartbeat
from ..rundir.run import RunDir

VAL = ("validation",)
_FRACTIONS = {"accuracy", "f1", "matthews", "pearson", "spearman", "corr"}
# task -> (title, family, [(label, splits tried in order, metric, scale)]), paper order
TASKS: dict[str, tuple[str, str, list[tuple[str, tuple[str, ...], str, float]]]] = {
    "mnli": ("MNLI", "glue", [("m", ("validation_matched",), "accuracy", 100),
                              ("mm", ("validation_mismatched",), "accuracy", 100)]),
    "sst2": ("SST-2", "glue", [("Acc", VAL, "accuracy", 100)]),
    "cola": ("CoLA", "glue", [("Mcc", VAL, "matthews", 100)]),
    "qqp": ("QQP", "glue", [("Acc", VAL, "accuracy", 100), ("F1", VAL, "f1", 100)]),
    "qnli": ("QNLI", "glue", [("Acc", VAL, "accuracy", 100)]),
    "rte": ("RTE", "glue", [("Acc", VAL, "accuracy", 100)]),
    "mrpc": ("MRPC", "glue", [("Acc", VAL, "accuracy", 100)]),
    "stsb": ("STS-B", "glue", [("Corr", VAL, "corr", 100)]),
    "squad_v1": ("SQuADv1.1", "squad", [("EM", VAL, "exact_match", 1), ("F1", VAL, "f1", 1)]),
    "squad_v2": ("SQuADv2.0", "squad", [("EM", VAL, "exact_match", 1), ("F1", VAL, "f1", 1)]),
}
for _task, _title in (("xsum", "XSum"), ("cnn_dailymail", "CNN/DailyMail")):
    TASKS[_task] = (_title, "summarization", [
        (label, ("test", "validation"), metric, 1)
        for label, metric in (("R-1", "rouge1"), ("R-2", "rouge2"), ("R-L", "rougeL"))])


@dataclass(frozen=True)
class Column:
    key: str
    """'task:label', e.g. 'mnli:m' (the key of paper_results too)."""
    task: str
    title: str
    label: str


@dataclass
class Run:
    path: Path
    task: str
    method: str
    seed: int | None
    budget_level: int | None
    size: str
    params: float
    values: dict[str, float]
    """Column key -> value on the paper's scale."""
    train_seconds: float | None = None
    peak_memory_bytes: float | None = None
    epochs: float | None = None
    device: str = ""


# --------------------------------------------------------------------------- reading


def find_run_dirs(paths: list[Path]) -> list[Path]:
    """Every directory holding a status.json or summary.json, at any depth; a run's own
    subfolders (e.g. model/ of a full fine-tune) are not searched."""
    found = []
    for root in paths:
        for dirpath, dirnames, filenames in os.walk(root):
            if STATUS in filenames or SUMMARY in filenames:
                found.append(Path(dirpath))
                dirnames[:] = []
            else:
                dirnames[:] = sorted(d for d in dirnames if not d.startswith("."))
    return sorted(found)


def _columns_of(task: str, metrics: dict) -> list[tuple[Column, float | None]]:
    """The task's columns and their values from summary ``metrics`` ({split: {name: v}})."""
    if task in TASKS:
        title, _, specs = TASKS[task]
    else:  # an unknown task: every metric of its first split, fractions x100
        split = "validation" if "validation" in metrics else next(iter(metrics), "")
        title = task
        specs = [(m, (split,), m, 100 if m in _FRACTIONS else 1) for m in metrics.get(split, {})]
    out = []
    for label, splits, metric, scale in specs:
        split = next((s for s in splits if s in metrics), None)
        found = dict(metrics.get(split) or {})
        if metric == "corr" and "corr" not in found and {"pearson", "spearman"} <= set(found):
            found["corr"] = (found["pearson"] + found["spearman"]) / 2  # SPEC section 9
        value = found.get(metric)
        ok = isinstance(value, (int, float)) and math.isfinite(value)
        out.append((Column(f"{task}:{label}", task, title, label),
                    float(value) * scale if ok else None))
    return out


def _size(method: str, config: dict, level: int | None) -> str:
    section = config.get({"adalora": "adalora", "lora": "lora"}.get(method, "adapter")) or {}
    if method == "adalora":
        return f"r0={section.get('init_rank')}" + (
            "" if level is not None else f" b(T)={section.get('budget')}")
    if method == "lora":
        return f"r={section.get('r')}"
    if method in ("houlsby", "pfeiffer"):
        return f"d={section.get('dim')}"
    return ""


def unfinished_reason(path: Path, status: dict) -> str:
    """Why a run is not in the tables, and what to do: still running, or resumable."""
    state = status.get("status")
    resume = f"; resume with adalora train --resume {path}"
    if state == "running":
        alive, why = owner_alive(path)  # a dead owner leaves 'running' behind
        if alive:
            beat = read_heartbeat(path) or {}
            step = f" at step {beat['step']}" if "step" in beat else ""
            return f"still running{step} ({why})"
        return f"died while running ({why}){resume}"
    if state == "preempted":
        return f"preempted at step {status.get('step')}{resume}"
    error = status.get("error")
    return f"status {state!r}" + (f" ({error})" if error else "") + (
        resume if state == "failed" else "")


def load_run(path: Path, eval_name: str | None = None) -> Run | str:
    """A finished run, or the reason it is left out. ``eval_name``: show the metrics of
    ``eval/<eval_name>.json`` (written by ``adalora eval``) instead of the training's."""
    status = RunDir.read_status(path)
    if status is None:
        return "no readable status.json"
    if status.get("status") != "finished":
        return unfinished_reason(path, status)
    try:
        summary = json.loads((path / SUMMARY).read_text())
    except OSError:
        return "finished but summary.json is missing"
    except ValueError:
        return "summary.json is not valid JSON"
    if not isinstance(summary, dict) or not isinstance(summary.get("metrics"), dict):
        return "summary.json has no metrics mapping"
    if eval_name is not None:  # issue 10: scores from `adalora eval`
        try:
            summary["metrics"] = json.loads((path / EVAL / f"{eval_name}.json").read_text())[
                "metrics"]
        except (OSError, ValueError, KeyError, TypeError):
            return (f"no eval/{eval_name}.json (write it with `adalora eval RUN ... "
                    f"--name {eval_name}`)")
    task, method = summary.get("task"), summary.get("method")
    if not isinstance(task, str) or not isinstance(method, str):
        return "summary.json lacks task or method"
    try:
        config = yaml.safe_load((path / CONFIG).read_text()) or {}
    except (OSError, yaml.YAMLError):
        config = {}
    level = summary.get("budget_level", (config.get("sweep") or {}).get("budget_level"))
    params = summary.get("final_adapter_params", summary.get("adapter_params"))
    values = {col.key: v for col, v in _columns_of(task, summary["metrics"]) if v is not None}
    if not values:
        return f"no metrics for task {task!r} in summary.json"
    return Run(path, task, method, summary.get("seed"), level, _size(method, config, level),
               float(params) if isinstance(params, (int, float)) else math.nan, values,
               summary.get("train_seconds"), summary.get("peak_memory_bytes"),
               summary.get("epochs") or _epochs_from_config(config), summary.get("device", ""))


def _epochs_from_config(config: dict) -> float | None:
    train = config.get("train") or {}
    return None if train.get("max_steps") else train.get("epochs")


def load_runs(paths: list[Path], eval_name: str | None = None,
              ) -> tuple[list[Run], list[tuple[Path, str]]]:
    """Finished runs, and (path, reason) for every run directory left out."""
    runs, skipped = [], []
    for path in find_run_dirs(paths):
        try:
            result = load_run(path, eval_name)
        except Exception as err:  # a malformed run must never stop the report
            result = f"malformed ({type(err).__name__}: {err})"
        if isinstance(result, Run):
            runs.append(result)
        else:
            skipped.append((path, result))
    return runs, skipped
