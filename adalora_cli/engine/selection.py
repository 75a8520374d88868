"""``train.select=best``: a run that ends with the weights of its best evaluation.

Hugging Face's ``load_best_model_at_end`` with ``metric_for_best_model``, and its early
stopping callback: at every periodic evaluation (``train.eval_every``, and the final one)
:class:`Selection` reads one metric of one split (``train.select_metric``, by default the
task's main one: the first column of its report, in that column's direction). A strictly
better value makes that step the best, so the first step to reach a value keeps it; an
evaluation at step 0 (``train.eval_at_start``) scores the untrained model and is not a
candidate. ``train.early_stop_patience`` evaluations in a row without improvement end
training there.

When a step becomes the best, what ``adapter_model.safetensors`` would hold at that step
(the trained tensors and the frozen ones the method keeps) and the rank controller's state
(AdaLoRA's mask and importance averages) are published under ``best/step-N/`` by one
rename, as checkpoints are. The selection itself (metric, best step and value, evaluations
without improvement, where training stopped) goes into every checkpoint, and
``best/records.json`` says which best each kept checkpoint resumes to, so a best is deleted
only once no checkpoint could need it: a run killed anywhere and resumed chooses the same
step. At the end the loop puts the chosen step's tensors and controller state back and
scores them again (without logging: their rows are in ``metrics.jsonl`` already), so the
summary's metrics, the predictions, the weights and the rank pattern are that step's.
"""

from __future__ import annotations

import json
import math
import os
import shutil
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from safetensors.torch import load_file, save_file

from ..config import ConfigError, RunConfig
from ..errors import first_line, writing
from ..rundir.layout import BEST, BEST_CONTROLLER, BEST_RECORDS, BEST_TENSORS
from ..rundir.no_code import load_tensors
from ..rundir.run import follow_umask, fsync_path, write_json_atomic
from ..rundir.summary import TaskReport
from ..tasks.columns import LOWER_IS_BETTER, with_directions

if TYPE_CHECKING:
    from ..tasks.base import Task

KEY = "select"
"""The selection's record in a checkpoint's state."""


@dataclass
class Selection:
    """Which metric decides, and the best evaluation so far."""

    split: str | None
    """The evaluation split read; None until settled (a task that names its metrics only
    when it first reports them)."""
    metric: str | None
    lower_is_better: bool
    patience: int
    """Evaluations in a row without improvement that end training (0: never)."""
    step: int | None = None
    value: float | None = None
    since: int = 0
    """Evaluations since the best one that did not improve on it."""
    stopped_at: int | None = None
    """The step where early stopping ended training."""

    @property
    def name(self) -> str:
        return f"{self.split}/{self.metric}"

    # ------------------------------------------------------------ choosing
    def settle(self, report: TaskReport, splits: Sequence[str]) -> None:
        """Fill in the default metric (the report's first column), its direction and its
        split (the first of the column's splits that the run evaluates)."""
        columns = with_directions(report).columns
        if self.metric is None:
            if not columns:
                return  # the task's report names its columns from its first scores
            self.metric = columns[0].metric
        column = next((c for c in columns if c.metric == self.metric), None)
        self.lower_is_better = (bool(column.lower_is_better) if column is not None
                                else self.metric in LOWER_IS_BETTER)
        if self.split is None:
            present = [s for s in (column.splits if column is not None else ()) if s in splits]
            self.split = (present[0] if present else
                          "validation" if "validation" in splits else splits[0])

    def observe(self, step: int, results: dict[str, dict[str, float]], task: Task) -> bool:
        """Judge the evaluation at ``step``; True when it is the new best. A metric the
        task does not report is a one-line ConfigError (the check the build could not make
        for a task that names its metrics only by reporting them)."""
        if self.split is None or self.metric is None:
            self.settle(task.report(results), list(results))
        scores = results.get(self.split or "", {})
        if self.metric not in scores:
            reported = ", ".join(scores) or "nothing"
            raise ConfigError(f"train.select_metric {self.metric!r}: task {task.name} reports "
                              f"{reported} on {self.split}; name one of them")
        value = scores[self.metric]
        finite = value is not None and math.isfinite(value)
        better = finite and (self.value is None or (
            value < self.value if self.lower_is_better else value > self.value))
        if better:
            self.step, self.value, self.since = step, float(value), 0
        else:
            self.since += 1
        return better

    def stop_due(self) -> bool:
        return bool(self.patience) and self.since >= self.patience

    # ------------------------------------------------------------ records
    def record(self) -> dict[str, Any]:
        """What a checkpoint keeps (plain numbers and strings)."""
        return asdict(self)

    def restore(self, record: dict[str, Any]) -> None:
        for key, value in record.items():
            if hasattr(self, key):
                setattr(self, key, value)

    def summary(self, last_step: int) -> dict[str, Any]:
        """``summary.json``'s ``selected``; no step at all scored a number (every value
        NaN): the last one, as ``train.select=last`` would end."""
        step = self.step if self.step is not None else last_step
        return {"step": step, "split": self.split, "metric": self.metric,
                "value": self.value, "lower_is_better": self.lower_is_better,
                "from": "last" if step == last_step else "best",
                "stopped_early_at": self.stopped_at}


def plan(cfg: RunConfig, task: Task, splits: Sequence[str]) -> Selection | None:
    """The run's selection (None unless ``train.select=best``), checked against what the
    task reports before anything is written: an unknown split or metric is refused in one
    line naming the ones it has."""
    t = cfg.train
    if t.select != "best":
        return None
    splits = list(splits)
    if not splits:
        raise ConfigError(f"train.select=best chooses by an evaluation, and task "
                          f"{cfg.task.name} has no evaluation split here; use train.select=last")
    wanted = t.select_metric
    split, _, metric = wanted.rpartition("/") if wanted else ("", "", "")
    if split and split not in splits:
        raise ConfigError(f"train.select_metric {wanted}: task {cfg.task.name} evaluates no "
                          f"split {split!r} (it evaluates {', '.join(splits)}); name one of "
                          "them, or the metric alone")
    names = task.metric_names()
    if metric and names is not None and metric not in names:
        raise ConfigError(f"train.select_metric {wanted}: task {cfg.task.name} does not "
                          f"report {metric!r} (it reports {', '.join(names)}); name one of "
                          "them")
    selection = Selection(split or None, metric or None, False, t.early_stop_patience or 0)
    selection.settle(task.report({}), splits)
    return selection


# ---------------------------------------------------------------- best/ on disk
def _folder(run_path: Path, step: int) -> Path:
    return Path(run_path) / BEST / f"step-{step:07d}"


def _steps(run_path: Path) -> list[int]:
    root = Path(run_path) / BEST
    if not root.is_dir():
        return []
    return sorted(int(p.name[5:]) for p in root.iterdir()
                  if p.name.startswith("step-") and p.name[5:].isdigit())


def publish(run_path: Path, step: int, tensors: dict[str, torch.Tensor],
            controller: dict[str, Any] | None) -> Path:
    """Write step ``step``'s weights (and rank controller state) into ``best/step-N``: into
    a hidden folder first, flushed, then renamed, so the folder is whole or absent."""
    final = _folder(run_path, step)
    final.parent.mkdir(exist_ok=True)
    tmp = final.parent / f".partial-{final.name}-{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir()
    try:
        with writing(final / BEST_TENSORS, then="resume the run", written_as=tmp,
                     library=True):
            save_file(tensors, str(tmp / BEST_TENSORS))
            if controller is not None:
                torch.save(controller, tmp / BEST_CONTROLLER)
        follow_umask(tmp)
        for file in tmp.iterdir():
            fsync_path(file)
        shutil.rmtree(final, ignore_errors=True)  # the same step again (a resumed run)
        os.rename(tmp, final)
        fsync_path(final.parent)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return final


def load(run_path: Path, step: int) -> tuple[dict[str, torch.Tensor], dict[str, Any] | None]:
    """The tensors and controller state published for ``step``; a missing or damaged
    folder is a one-line ConfigError."""
    folder = _folder(run_path, step)
    try:
        tensors = load_file(str(folder / BEST_TENSORS))
        controller = (load_tensors(folder / BEST_CONTROLLER)
                      if (folder / BEST_CONTROLLER).is_file() else None)
    except Exception as err:  # noqa: BLE001 - each reader's own error: missing or damaged
        raise ConfigError(f"the best weights of {run_path} (step {step}) cannot be read from "
                          f"{folder} ({first_line(err)}); restore the folder, or train the "
                          "run again") from None
    return tensors, controller


def after_checkpoint(run_path: Path, checkpoint_step: int, best_step: int | None,
                     kept: Sequence[int]) -> None:
    """Checkpoint ``checkpoint_step`` was published (``kept``: the steps of every checkpoint
    now kept): record which best it resumes to, and delete the bests that no kept
    checkpoint and no later evaluation needs."""
    path = Path(run_path) / BEST / BEST_RECORDS
    records = _records(path)
    records[str(checkpoint_step)] = best_step
    records = {k: v for k, v in records.items() if int(k) in set(kept)}
    if (Path(run_path) / BEST).is_dir():
        write_json_atomic(path, records)
    needed = {v for v in records.values() if v is not None} | (
        {best_step} if best_step is not None else set())
    for step in _steps(run_path):
        if step not in needed:
            shutil.rmtree(_folder(run_path, step), ignore_errors=True)


def _records(path: Path) -> dict[str, int | None]:
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def rewind(run_path: Path, checkpoint_step: int, best_step: int | None) -> None:
    """On resuming from ``checkpoint_step``: forget the bests the killed attempt found
    after it (the resumed run finds them again), and make sure the one it resumes to is
    there."""
    for step in _steps(run_path):
        if step > checkpoint_step:
            shutil.rmtree(_folder(run_path, step), ignore_errors=True)
    folder = _folder(run_path, best_step) if best_step is not None else None
    if folder is not None and not (folder / BEST_TENSORS).is_file():
        raise ConfigError(f"{run_path} resumes to its best evaluation at step {best_step}, "
                          f"but {folder} is gone; restore it, or train the run again")


def remove(run_path: Path) -> None:
    """A finished run keeps the chosen weights as its own; a fresh start forgets old ones."""
    shutil.rmtree(Path(run_path) / BEST, ignore_errors=True)
