"""What every tracker backend gets and implements, and the helpers they share.

A backend is a :class:`Sink`: it receives flat ``{name: number}`` metrics at a step, an
image at a step, and the final summary. Naming lives in the fan-out, so the three
trackers show the same curves under the same names.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..config import LogConfig, RunConfig, flatten


@dataclass(frozen=True)
class RunInfo:
    """Everything a backend needs to open (or reattach to) its run."""

    log: LogConfig
    run_dir: Path
    name: str
    """The run's name in the tracker."""
    project: str
    """W&B project / MLflow experiment."""
    config: dict[str, Any]
    """The resolved config, nested (W&B shows nested keys itself)."""
    hparams: dict[str, str | int | float | bool]
    """The same config flattened to dotted keys with scalar values."""
    tags: dict[str, str]
    """Where the run sits in the paper's tables: sweep, task, method, budget_level, seed."""
    resumed: bool
    state: dict[str, Any] | None
    """What this backend saved in trackers.json when the run first opened; None if new."""


class Sink:
    """One tracker backend. Methods may raise: the fan-out reports and drops the sink."""

    name = ""
    state: dict[str, Any] = {}
    """Saved to trackers.json so a resumed run finds the same tracker run."""

    def log_metrics(self, step: int, metrics: dict[str, float]) -> None:
        raise NotImplementedError

    def log_image(self, step: int, key: str, image) -> None:
        """``image`` is a PIL image (RGB)."""
        raise NotImplementedError

    def log_summary(self, step: int, numbers: dict[str, float], texts: dict[str, str]) -> None:
        raise NotImplementedError

    def close(self, finished: bool) -> None:
        """``finished`` is False when the run stops without a summary (failed or killed)."""
        raise NotImplementedError


def scalar(value: Any) -> str | int | float | bool:
    """A config value as a hyperparameter: numbers and booleans stay, the rest is text."""
    if isinstance(value, (bool, int, float, str)):
        return value
    return "none" if value is None else str(value)


def run_tags(cfg: RunConfig) -> dict[str, str]:
    """Tags that group runs the way the paper's tables do (empty sweep fields are left out)."""
    tags = {"task": cfg.task.name, "method": cfg.method.name, "seed": str(cfg.train.seed)}
    if cfg.sweep.name is not None:
        tags["sweep"] = cfg.sweep.name
    if cfg.sweep.budget_level is not None:
        tags["budget_level"] = str(cfg.sweep.budget_level)
    return tags


def run_info(cfg: RunConfig, run_dir: Path, resumed: bool,
             state: dict[str, Any] | None) -> RunInfo:
    config = cfg.to_dict()
    return RunInfo(
        log=cfg.log, run_dir=run_dir, name=cfg.log.run_name or run_dir.name,
        project=cfg.log.project or cfg.sweep.name or "adalora",
        config=config, hparams={k: scalar(v) for k, v in flatten(config).items()},
        tags=run_tags(cfg), resumed=resumed, state=state)
