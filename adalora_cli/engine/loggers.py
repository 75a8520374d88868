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
from .signals import StopSignals
from .step import StepLog


class RunFiles(Protocol):
    """The part of ``rundir.run.RunDir`` (or of the loop's ``Silent`` stand-in on ranks
    other than 0) that the logger writes to."""

    def log(self, row: dict[str, Any]) -> None: ...
    def log_ranks(self, step: int, ranks: dict[str, int]) -> None: ...


def open_trackers(cfg: RunConfig, run_dir: Path, *, resumed: bool, main: bool,
                  stop: StopSignals) -> Trackers:
    """The trackers of ``log.to`` on rank 0 (a resumed run reattaches to its tracker runs);
    none on the other ranks, which write nothing. A tracker call in progress when ``stop``
    notes a signal is waited for only briefly, so the stop's checkpoint comes first."""
    if main:
        return Trackers.open(cfg, run_dir, resumed=resumed, warn=warning,
                             stopping=lambda: stop.received is not None)
    return Trackers([], warning, cfg, run_dir)


class RunLogger:
    """Fans each training event out to the run files, the trackers and the progress bar."""

    def __init__(self, files: RunFiles, trackers: Trackers, progress: TrainProgress,
                 log_every: int, steps: int):
        self.files, self.trackers, self.progress = files, trackers, progress
        self.log_every, self.steps = log_every, steps

    def row_due(self, step: int) -> bool:
        """Whether step ``step`` writes its training row: every ``log_every`` steps and
        the last one. Only these read the loss from the device."""
        return step % self.log_every == 0 or step == self.steps

    def step(self, step: int, log: StepLog, row: dict[str, Any] | None) -> None:
        """After optimizer step ``step``: a mask event is always recorded (the rank
        history must be complete for the heatmap), the training ``row`` when it is due
        (:meth:`row_due`, None otherwise); the progress bar moves on every step, its loss
        and rate as of the last row."""
        if log.ranks is not None:
            self.files.log_ranks(step, log.ranks)
            self.trackers.log_ranks(step, log.ranks)
        if row is not None:
            self.files.log(row)
            self.trackers.log_row(row)
        self.progress.advance(step, row)

    def evaluating(self, split: str) -> None:
        self.progress.note(f"evaluating {split}")

    def evaluated(self, step: int, split: str, metrics: dict[str, float]) -> None:
        self.files.log({"step": step, "split": split, **metrics})
        self.trackers.log_eval(step, split, metrics)
        self.progress.scores(step, split, metrics)

    def evaluations_done(self) -> None:
        self.progress.note("")
