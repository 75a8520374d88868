"""Weights & Biases: the config, every curve, the heatmap as an image, the summary.

Sweeps are grouped the way the paper's tables are: ``group`` is the sweep, ``job_type``
the task, method and budget level, and each of those plus the seed is a tag. The run id
is saved in trackers.json; a resumed run reattaches with ``resume="must"`` (online) and
skips steps W&B already holds, so the curve continues. Offline, W&B keeps each segment
as its own folder under ``<run dir>/wandb/`` with the same run id, and ``wandb sync``
joins them into one run.

``wandb.init`` waits for W&B's server at most ``log.tracker_timeout_s`` (W&B's
``init_timeout``). W&B's service process outlives a failed init: at exit the process
waits for it to shut down (12 s after an init against a server that never answered).
"""

from __future__ import annotations

import os
from typing import Any

from ..rundir.layout import WANDB_DIR
from .base import RunInfo, Sink

PACKAGES = ("wandb",)


class WandbSink(Sink):
    name = "wandb"

    def __init__(self, info: RunInfo):
        import wandb

        saved = info.state or {}
        resume = None
        if saved.get("id") and info.resumed:
            resume = "allow" if self._offline(info) else "must"
        tags = info.tags
        folder = info.run_dir / WANDB_DIR
        folder.mkdir(exist_ok=True)
        self.run = wandb.init(
            project=saved.get("project", info.project), entity=info.log.wandb_entity,
            name=info.name, id=saved.get("id") if resume else None, resume=resume,
            dir=str(info.run_dir), mode=info.log.wandb_mode, config=info.config,
            group=tags.get("sweep"), job_type=_job_type(tags),
            tags=[f"{k}:{v}" for k, v in tags.items()], reinit="create_new",
            # console off: our progress bar stays ours; W&B's own wait for its server ends
            # with the run's (its default, 90 s, was longer), so it gives up with its reason
            settings=wandb.Settings(console="off", init_timeout=info.log.tracker_timeout_s))
        self.state = {"id": self.run.id, "project": self.run.project}
        # W&B refuses steps below the one it holds; a resumed run skips those quietly.
        self.floor = int(self.run.step or 0) if resume else 0

    @staticmethod
    def _offline(info: RunInfo) -> bool:
        mode = info.log.wandb_mode or os.environ.get("WANDB_MODE", "")
        return mode in ("offline", "dryrun", "disabled")

    def log_metrics(self, step: int, metrics: dict[str, float]) -> None:
        if step >= self.floor:
            self.run.log(metrics, step=step)

    def log_image(self, step: int, key: str, image) -> None:
        import wandb

        if step >= self.floor:
            self.run.log({key: wandb.Image(image, caption=f"ranks at step {step}")}, step=step)

    def log_summary(self, step: int, numbers: dict[str, float], texts: dict[str, Any]) -> None:
        self.run.summary.update({**numbers, **{f"final/{k}": v for k, v in texts.items()}})

    def close(self, finished: bool) -> None:
        self.run.finish(exit_code=0 if finished else 1)


def _job_type(tags: dict[str, str]) -> str:
    level = f"/b{tags['budget_level']}" if "budget_level" in tags else ""
    return f"{tags['task']}/{tags['method']}{level}"


def open_sink(info: RunInfo) -> Sink:
    return WandbSink(info)
