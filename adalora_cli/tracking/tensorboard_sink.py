"""TensorBoard: scalars, the rank heatmap as an image, and the config as hparams.

Events go to ``<run dir>/tensorboard/`` (or ``<log.tensorboard_dir>/<run name>/``), so
``tensorboard --logdir runs/`` lists every run. A resumed run writes a new event file in
the same folder; its writer is opened at the first step it logs with ``purge_step`` set
to that step, so points the interrupted run logged past its last checkpoint are hidden
and the curve continues instead of doubling back.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from ..rundir.layout import TENSORBOARD_DIR
from .base import RunInfo, Sink

PACKAGES = ("tensorboard",)


def log_dir(info: RunInfo) -> Path:
    if info.log.tensorboard_dir:
        return Path(info.log.tensorboard_dir) / info.name
    return info.run_dir / TENSORBOARD_DIR


class TensorBoardSink(Sink):
    name = "tensorboard"

    def __init__(self, info: RunInfo):
        self.path = log_dir(info)  # a function of the config and run name, so not saved
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

    def _at(self, step: int):
        return self.writer or self._open(purge_step=step)

    def _write_hparams(self, finished: bool) -> None:
        """The session start (hparams) at open, its end (success) with the summary. No
        experiment summary: TensorBoard reads only the first one per run, and without one
        its HPARAMS tab takes every scalar of the run as a metric column by itself."""
        from torch.utils.tensorboard.summary import hparams

        _, start, end = hparams(self.hparams, {})
        self.writer.file_writer.add_summary(end if finished else start)

    def log_metrics(self, step: int, metrics: dict[str, float]) -> None:
        writer = self._at(step)
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


def open_sink(info: RunInfo) -> Sink:
    return TensorBoardSink(info)
