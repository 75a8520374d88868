"""The run directory: everything one ``adalora train`` leaves behind.

Layout (all names fixed, so reports can rely on them)::

    config.yaml         resolved config
    status.json         {"status": running|failed|finished, ...}; failed runs carry the error
    metrics.jsonl       one JSON object per line: training rows and eval rows
    rank_history.jsonl  AdaLoRA: per-matrix ranks at every mask event
    rank_pattern.json   AdaLoRA: {module path: final rank}
    rank_heatmap.png    AdaLoRA: final rank per layer and matrix type (paper Figure 3)
    adapter_model.safetensors   trained adapter + head (or model/ for method 'full')
    summary.json        written last: its presence means the run finished
    trackers.json       with log.to: each tracker's run id, so a resumed run reattaches
    tensorboard/        with log.to=[tensorboard]: the event files
    wandb/              with log.to=[wandb]: W&B's local run folders

A run is finished only when ``summary.json`` exists and ``status.json`` says so; a crash
or a bad input leaves ``status: failed`` with the error, never a finished-looking run.
"""

from __future__ import annotations

import json
import os
import time
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from .config import ConfigError, RunConfig, dump_config

SUMMARY = "summary.json"
STATUS = "status.json"
METRICS = "metrics.jsonl"
CONFIG = "config.yaml"
RANK_PATTERN = "rank_pattern.json"
RANK_HISTORY = "rank_history.jsonl"
HEATMAP = "rank_heatmap.png"
WEIGHTS = "adapter_model.safetensors"
FULL_MODEL = "model"
TRACKERS = "trackers.json"       # tracking (issue 12)
TENSORBOARD_DIR = "tensorboard"
WANDB_DIR = "wandb"


def _write_json_atomic(path: Path, data: Any) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(data, indent=2, sort_keys=False) + "\n")
    os.replace(tmp, path)


def default_run_dir(cfg: RunConfig, root: str | Path = "runs") -> Path:
    stamp = datetime.now().strftime("%Y%m%d-%H%M%S")
    base = Path(root) / f"{cfg.task.name}-{cfg.method.name}-s{cfg.train.seed}-{stamp}"
    path, n = base, 1
    while path.exists():  # two runs started in the same second: never share a directory
        n += 1
        path = base.with_name(f"{base.name}-{n}")
    return path


class RunDir:
    """Writes one run directory; never overwrites an existing run."""

    def __init__(self, path: Path):
        self.path = path
        self._metrics = None
        self._ranks = None

    @classmethod
    def create(cls, path: str | Path, cfg: RunConfig) -> RunDir:
        path = Path(path)
        if path.exists() and (not path.is_dir() or any(path.iterdir())):
            raise ConfigError(
                f"run directory {path} already exists and is not empty; "
                "choose another --run-dir (runs are never overwritten)"
            )
        path.mkdir(parents=True, exist_ok=True)
        run = cls(path)
        (path / CONFIG).write_text(dump_config(cfg))
        run.set_status("running", started=_now(), pid=os.getpid())
        return run

    # ---------------------------------------------------------------- status
    def set_status(self, status: str, **fields: Any) -> None:
        current = self.read_status(self.path) or {}
        current.update(fields)
        current["status"] = status
        _write_json_atomic(self.path / STATUS, current)

    @staticmethod
    def read_status(path: Path) -> dict[str, Any] | None:
        try:
            return json.loads((Path(path) / STATUS).read_text())
        except (OSError, ValueError):
            return None

    def fail(self, error: str) -> None:
        self.close()
        self.set_status("failed", error=error, ended=_now())

    # ---------------------------------------------------------------- streams
    def log(self, row: dict[str, Any]) -> None:
        if self._metrics is None:
            self._metrics = open(self.path / METRICS, "a", buffering=1)
        self._metrics.write(json.dumps(row) + "\n")

    def log_ranks(self, step: int, ranks: dict[str, int]) -> None:
        if self._ranks is None:
            self._ranks = open(self.path / RANK_HISTORY, "a", buffering=1)
        self._ranks.write(json.dumps({"step": step, "ranks": ranks}) + "\n")

    def close(self) -> None:
        for stream in (self._metrics, self._ranks):
            if stream is not None:
                stream.close()
        self._metrics = self._ranks = None

    # ---------------------------------------------------------------- results
    def write_json(self, name: str, data: Any) -> Path:
        path = self.path / name
        _write_json_atomic(path, data)
        return path

    def finish(self, summary: dict[str, Any]) -> None:
        self.close()
        self.write_json(SUMMARY, summary)
        self.set_status("finished", ended=_now())


def is_finished(path: str | Path) -> bool:
    status = RunDir.read_status(Path(path)) or {}
    return status.get("status") == "finished" and (Path(path) / SUMMARY).is_file()


def read_metrics(path: str | Path) -> list[dict[str, Any]]:
    rows = []
    with open(Path(path) / METRICS) as f:
        for line in f:
            if line.strip():
                rows.append(json.loads(line))
    return rows


def _now() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="seconds")


def elapsed_since(start: float) -> float:
    return round(time.perf_counter() - start, 3)
