"""The run's one logger: every event goes, in one call from the loop, to the run directory's
files (``metrics.jsonl``, ``rank_history.jsonl``), the trackers and the progress bar.

The run directory is written first and is the source of truth; trackers only mirror it
(a failing tracker is dropped with a warning, see ``tracking/fanout.py``).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Protocol

from ..config import RunConfig
from ..errors import warning
from ..tracking import Trackers
from .progress import TrainProgress
from .step import StepLog


class RunFiles(Protocol):
    """The part of ``rundir.run.RunDir`` (or of the loop's ``Silent`` stand-in on ranks
    other than 0) that the logger writes to."""

    def log(self, row: dict[str, Any]) -> None: ...
    def log_ranks(self, step: int, ranks: dict[str, int]) -> None: ...


def open_trackers(cfg: RunConfig, run_dir: Path, *, resumed: bool, main: bool) -> Trackers:
    """The trackers of ``log.to`` on rank 0 (a resumed run reattaches to its tracker runs);
    none on the other ranks, which write nothing."""
    if main:
        return Trackers.open(cfg, run_dir, resumed=resumed, warn=warning)
    return Trackers([], warning, cfg, run_dir)


class RunLogger:
    """Fans each training event out to the run files, the trackers and the progress bar."""

    def __init__(self, files: RunFiles, trackers: Trackers, progress: TrainProgress,
                 log_every: int, steps: int):
        self.files, self.trackers, self.progress = files, trackers, progress
        self.log_every, self.steps = log_every, steps

    def step(self, row: dict[str, Any], log: StepLog) -> None:
        """After optimizer step ``row["step"]``: a mask event is always recorded (the rank
        history must be complete for the heatmap), the training row every ``log_every``
        steps and at the last step; the progress bar moves on every step."""
        step = row["step"]
        if log.ranks is not None:
            self.files.log_ranks(step, log.ranks)
            self.trackers.log_ranks(step, log.ranks)
        if step % self.log_every == 0 or step == self.steps:
            self.files.log(row)
            self.trackers.log_row(row)
        self.progress.advance(row)

    def evaluating(self, split: str) -> None:
        self.progress.note(f"evaluating {split}")

    def evaluated(self, step: int, split: str, metrics: dict[str, float]) -> None:
        self.files.log({"step": step, "split": split, **metrics})
        self.trackers.log_eval(step, split, metrics)
        self.progress.scores(step, split, metrics)

    def evaluations_done(self) -> None:
        self.progress.note("")
