"""TensorBoard: scalars, the rank heatmap as an image, and the config as hparams.

Events go to ``<run dir>/tensorboard/`` (or ``<log.tensorboard_dir>/<run name>/``), so
``tensorboard --logdir runs/`` lists every run. A resumed run writes a new event file in
the same folder; its writer is opened at the first step it logs with ``purge_step`` set
to that step, so points the interrupted run logged past its last checkpoint are hidden
and the curve continues instead of doubling back.

The purge hides every point at that step too, and the first step a resumed run logs can be
one the checkpoint already covers: the evaluation a stop cut short (the checkpoint holds
that step's training row, and the resumed run evaluates it again), or the final evaluation.
So the points the run directory holds at the purge step (its streams were cut back to the
checkpoint) are written again first; without them TensorBoard would lose that step's
training point while MLflow and W&B, which never purge, keep it. At one step the loop logs
ranks, then the training row, then evaluations, each to the run directory just before the
trackers; so only the kinds that come before the one being logged are written again (the
rest of that step is the resumed run's own to log).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from ..rundir.layout import METRICS, RANK_HISTORY, TENSORBOARD_DIR
from .base import RunInfo, Sink

PACKAGES = ("tensorboard",)
_ORDER = ("rank", "train", "eval")
"""The kinds of point the loop logs at one step, in its order."""


def log_dir(info: RunInfo) -> Path:
    if info.log.tensorboard_dir:
        return Path(info.log.tensorboard_dir) / info.name
    return info.run_dir / TENSORBOARD_DIR


class TensorBoardSink(Sink):
    name = "tensorboard"

    def __init__(self, info: RunInfo):
        self.path = log_dir(info)  # a function of the config and run name, so not saved
        self.run_dir = info.run_dir
        self.state = {"log_dir": str(self.path)}  # for people reading trackers.json
        self.hparams = info.hparams
        self.writer = None
        self.resumed = info.resumed and info.state is not None
        if not self.resumed:  # the first segment writes the hparams; a resume keeps them
            self._open(purge_step=None)
            self._write_hparams(finished=False)

    def _open(self, purge_step: int | None) -> Any:
        from torch.utils.tensorboard import SummaryWriter

        self.writer = SummaryWriter(str(self.path), purge_step=purge_step)
        return self.writer

    def _at(self, step: int, kind: str = ""):
        if self.writer is None:  # a resumed run's first point
            self._open(purge_step=step)
            self._replay(step, _ORDER.index(kind) if kind in _ORDER else len(_ORDER))
        return self.writer

    def _replay(self, step: int, before: int) -> None:
        """Write again the kinds of point the run directory holds at ``step`` that the loop
        logs before ``_ORDER[before]``: the purge just hid them."""
        from .fanout import eval_metrics, rank_metrics, train_metrics

        points: dict[str, float] = {}
        if before > 0:
            for row in _rows(self.run_dir / RANK_HISTORY, step):
                points.update(rank_metrics(row["ranks"]))
        for row in _rows(self.run_dir / METRICS, step):
            split = row.get("split")
            if not split and before > 1:
                points.update(train_metrics(row))
            elif split and before > 2:
                points.update(eval_metrics(split, {k: v for k, v in row.items()
                                                   if k not in ("step", "split")}))
        for key, value in points.items():
            self.writer.add_scalar(key, value, step)

    def _write_hparams(self, finished: bool) -> None:
        """The session start (hparams) at open, its end (success) with the summary. No
        experiment summary: TensorBoard reads only the first one per run, and without one
        its HPARAMS tab takes every scalar of the run as a metric column by itself."""
        from torch.utils.tensorboard.summary import hparams

        _, start, end = hparams(self.hparams, {})
        self.writer.file_writer.add_summary(end if finished else start)

    def log_metrics(self, step: int, metrics: dict[str, float]) -> None:
        writer = self._at(step, next(iter(metrics), "").split("/")[0])
        for key, value in metrics.items():
            writer.add_scalar(key, value, step)

    def log_image(self, step: int, key: str, image) -> None:
        import numpy as np

        self._at(step).add_image(key, np.asarray(image), step, dataformats="HWC")

    def log_summary(self, step: int, numbers: dict[str, float], texts: dict[str, str]) -> None:
        writer = self._at(step)
        for key, value in numbers.items():
            writer.add_scalar(key, value, step)
        writer.add_text("summary", "```\n" + json.dumps(texts, indent=2) + "\n```", step)
        self._write_hparams(finished=True)

    def close(self, finished: bool) -> None:
        if self.writer is not None:
            self.writer.close()
            self.writer = None


def _rows(path: Path, step: int) -> list[dict[str, Any]]:
    """The rows of a JSON-lines stream at ``step`` (none when it does not exist)."""
    try:
        lines = path.read_text().splitlines()
    except OSError:
        return []
    rows = []
    for line in lines:
        try:
            row = json.loads(line)
        except ValueError:  # a line cut short
            continue
        if row.get("step") == step:
            rows.append(row)
    return rows


def open_sink(info: RunInfo) -> Sink:
    return TensorBoardSink(info)
