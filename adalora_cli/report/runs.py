"""Reading run directories for ``adalora report``: each finished run as a typed :class:`Run`.

A run directory is any folder holding a ``status.json`` or ``summary.json``, at any depth,
so runs trained by hand, by several sweeps or on several machines mix freely. Only
finished runs are read; every other one is returned with the reason it is left out, and
a malformed file never raises. A run's summary is read as a
:class:`~adalora_cli.rundir.summary.Summary` and its config through ``load_config``; what an
older summary lacks (size label, report columns) is derived from them through the method
registry and ``adalora_cli.tasks.columns``, so no task or method is named here.
"""

from __future__ import annotations

import json
import math
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..config import ConfigError, RunConfig, flatten, load_config, safe_yaml
from ..config import digest as config_hash
from ..methods.registry import METHODS, comparable_config, config_digest
from ..rundir.layout import (
    CHECKPOINTS,
    CONFIG,
    EVAL,
    FULL_MODEL,
    HARNESS,
    HARNESS_SAMPLES,
    STATUS,
    SUMMARY,
    TENSORBOARD_DIR,
    WANDB_DIR,
)
from ..rundir.owner import owner_alive, read_heartbeat
from ..rundir.run import RunDir, resume_hint
from ..rundir.summary import Summary, TaskReport, read_summary
from ..tasks.columns import task_report, with_directions


@dataclass(frozen=True)
class Column:
    key: str
    """'task:label', e.g. 'mnli:m' (the key of paper_results too)."""
    task: str
    title: str
    label: str
    lower_is_better: bool = False
    """A loss or a perplexity: the lowest mean is the best."""


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
    report: TaskReport | None = None
    """The task's title, table and columns (from the summary, else declared by the task)."""
    digest: str = ""
    """Equal digests: seeds of one experiment (``methods.registry.config_digest``)."""
    config: dict[str, Any] = field(default_factory=dict)
    """The run's config as {dotted key: value}, without the seed and bookkeeping: what the
    report shows when runs of one method and size differ."""
    finished_at: float = 0.0
    """When summary.json was written (its mtime): the newest of duplicate seeds is kept."""
    variant: tuple[tuple[str, str], ...] = ()
    """Set by the report: (column, value) of the config keys that set this run apart from
    others of its method and size (e.g. (("lr", "0.001"),)); () when nothing does."""

    @property
    def family(self) -> str:
        return self.report.family if self.report else "other"


# --------------------------------------------------------------------------- reading


RUN_FOLDERS = {FULL_MODEL, CHECKPOINTS, EVAL, TENSORBOARD_DIR, WANDB_DIR, HARNESS_SAMPLES}
"""A run's own subfolders: never searched for runs."""


def find_run_dirs(paths: list[Path], links: list[Path] | None = None) -> list[Path]:
    """Every directory holding a status.json or summary.json, at any depth. Inside a run
    directory its own subfolders (``model/`` of a full fine-tune, ``checkpoints/`` ...)
    are not searched, but any other folder is: runs placed inside a run (a sweep started
    in a run's directory) are found, not hidden behind it.

    A symbolic link to a folder met on the way is not followed (a run reached through one
    could be counted twice, and links can loop); ``links`` collects them, for the report
    to say. A path given itself is read wherever it points."""
    found = []
    for root in paths:
        for dirpath, dirnames, filenames in os.walk(root):
            is_run = STATUS in filenames or SUMMARY in filenames
            if is_run:
                found.append(Path(dirpath))
            dirnames[:] = sorted(d for d in dirnames if not d.startswith(".")
                                 and not (is_run and d in RUN_FOLDERS))
            if links is not None:
                links.extend(Path(dirpath) / d for d in dirnames
                             if (Path(dirpath) / d).is_symlink())
    return sorted(found)


def link_reason(link: Path) -> str:
    """Why the report skipped a symbolic link, and how to include what it points to."""
    target = os.path.realpath(link)
    return (f"a symbolic link to {target}, not followed (a run reached through a link "
            f"could be counted twice); pass {target} itself to report it")


def nested_runs(found: list[Path]) -> list[tuple[Path, int]]:
    """Runs that hold other runs inside their folder, and how many: worth a warning."""
    out = []
    for outer in found:
        inner = sum(1 for p in found if p != outer and outer in p.parents)
        if inner:
            out.append((outer, inner))
    return out


def column_values(task: str, report: TaskReport, metrics: dict) -> dict[Column, float | None]:
    """The task's columns and their values from summary ``metrics`` ({split: {name: v}})."""
    out: dict[Column, float | None] = {}
    for spec in report.columns:
        split = next((s for s in spec.splits if s in metrics), None)
        found = dict(metrics.get(split) or {})
        if spec.metric == "corr" and "corr" not in found and {"pearson", "spearman"} <= set(
                found):
            # STS-B's Corr: the mean of Pearson and Spearman (docs/maths.md#tasks-and-metrics)
            found["corr"] = (found["pearson"] + found["spearman"]) / 2
        value = found.get(spec.metric)
        ok = isinstance(value, (int, float)) and math.isfinite(value)
        out[Column(f"{task}:{spec.label}", task, report.title, spec.label,
                   bool(spec.lower_is_better))] = (
            float(value) * spec.scale if ok else None)
    return out


def harness_values(path: Path, task: str) -> dict[str, float]:
    """The adapted model's lm-evaluation-harness scores (``harness.json``, written by
    ``eval.harness`` or ``adalora eval --harness``) as columns of the run's task, labelled
    ``lm-eval <harness task> <metric>``, as lm-eval reports them (a fraction for its own
    accuracy tasks; x 100 for the tasks adalora ships, like the run's own scores)."""
    try:
        record = json.loads((path / HARNESS).read_text())
    except (OSError, ValueError):  # none, or unreadable: the run's own columns only
        return {}
    adapted = record.get("adapted") if isinstance(record, dict) else None
    out: dict[str, float] = {}
    for name, scores in (adapted if isinstance(adapted, dict) else {}).items():
        for metric, value in (scores if isinstance(scores, dict) else {}).items():
            if isinstance(value, (int, float)) and not isinstance(value, bool) \
                    and math.isfinite(value):
                out[f"{task}:lm-eval {name} {metric}"] = float(value)
    return out


def _size(summary: Summary, cfg: RunConfig | None, level: int | None) -> str:
    """The summary's size label; for an older summary, the registry's label of its config."""
    if summary.size is not None:
        return summary.size
    spec = METHODS.get(summary.method)
    return spec.size_label(cfg, level) if spec and cfg is not None else ""


def unfinished_reason(path: Path, status: dict) -> str:
    """Why a run is not in the tables, and what to do: still running, or resumable."""
    state = status.get("status")
    resume = f"; resume with {resume_hint(path, status)}"
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


def _config(path: Path) -> tuple[RunConfig | None, dict[str, Any]]:
    """The run's config, and its raw YAML sections when load_config refuses it (a config
    written by an older version, with keys since renamed)."""
    try:
        return load_config(path / CONFIG), {}
    except Exception:  # any unloadable config: fall back to its raw sections and the summary
        import yaml

        try:  # a config file that expands to millions of values is refused, not walked
            raw = safe_yaml((path / CONFIG).read_text(), str(path / CONFIG))
        except (OSError, yaml.YAMLError, ConfigError):
            raw = None
        return None, raw if isinstance(raw, dict) else {}


def load_run(path: Path, eval_name: str | None = None) -> Run | str:
    """A finished run, or the reason it is left out. ``eval_name``: show the metrics of
    ``eval/<eval_name>.json`` (written by ``adalora eval``) instead of the training's."""
    status = RunDir.read_status(path)
    if status is None:
        return "no readable status.json"
    if status.get("status") != "finished":
        return unfinished_reason(path, status)
    try:
        summary = read_summary(path)
    except OSError:
        return "finished but summary.json is missing"
    except json.JSONDecodeError:
        return "summary.json is not valid JSON"
    except UnicodeDecodeError:  # not text at all (a binary file put in its place)
        return "summary.json is not text (not written by a run)"
    except ValueError as err:
        return str(err)
    if eval_name is not None:  # scores from `adalora eval`
        try:
            summary.metrics = json.loads((path / EVAL / f"{eval_name}.json").read_text())[
                "metrics"]
        except (OSError, ValueError, KeyError, TypeError):
            return (f"no eval/{eval_name}.json (write it with `adalora eval RUN ... "
                    f"--name {eval_name}`)")
    if not isinstance(summary.metrics, dict):
        return "summary.json has no metrics mapping"
    task, method = summary.task, summary.method
    cfg, raw = _config(path)
    level = summary.budget_level
    if level is None:  # a summary older than the field: the level the sweep put in the config
        level = cfg.sweep.budget_level if cfg is not None else flatten(raw).get(
            "sweep.budget_level")
    params = (summary.final_adapter_params if summary.final_adapter_params is not None
              else summary.adapter_params)
    report = with_directions(summary.report if summary.report is not None and eval_name is None
                             else task_report(task, summary.metrics))
    values = {col.key: v for col, v in column_values(task, report, summary.metrics).items()
              if v is not None}
    if eval_name is None:
        values.update(harness_values(path, task))
    if not values:
        return f"no metrics for task {task!r} in summary.json"
    if cfg is not None:  # recomputed, so runs of every version compare by one definition
        identity, digest = comparable_config(cfg), config_digest(cfg)
    else:
        identity = {k: v for k, v in flatten(raw).items() if k != "train.seed"
                    and not k.startswith("sweep.")}
        digest = summary.config_digest or config_hash(identity)
    train = cfg.train if cfg is not None else None
    epochs = summary.epochs  # 0 for a run that took no step (method none): no time per epoch
    if epochs is None:  # a summary older than the field: the config's
        epochs = None if train is None or train.max_steps else train.epochs
    return Run(path, task, method, summary.seed, level, _size(summary, cfg, level),
               float(params) if isinstance(params, (int, float)) else math.nan, values,
               summary.train_seconds, summary.peak_memory_bytes, epochs, summary.device,
               report, digest, identity, (path / SUMMARY).stat().st_mtime)


def load_runs(paths: list[Path], eval_name: str | None = None,
              ) -> tuple[list[Run], list[tuple[Path, str]]]:
    """Finished runs, and (path, reason) for every run directory left out."""
    runs, skipped, links = [], [], []
    for path in find_run_dirs(paths, links):
        try:
            result = load_run(path, eval_name)
        except Exception as err:  # a malformed run must never stop the report
            result = f"malformed ({type(err).__name__}: {err})"
        if isinstance(result, Run):
            runs.append(result)
        else:
            skipped.append((path, result))
    skipped += [(link, link_reason(link)) for link in links]
    return runs, skipped
