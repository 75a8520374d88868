"""No host syncs between logging steps (docs/training.md#host-syncs).

On a GPU every ``.item()``, ``float(tensor)``, ``.tolist()`` or ``.cpu()`` makes the host wait
for the device. The loop, AdaLoRA's allocator and the loggers may read device values only
for a logged row, at a mask event, an evaluation or a checkpoint. Counted here on the CPU: the
tensor methods that read a value are wrapped, every call made directly by this package's
code is booked to the step being run, and the steps that are none of those must book none.
(torch's own reads, e.g. AdamW's of its step counters, are of CPU tensors on a GPU run too.)"""

from __future__ import annotations

import sys
import threading
from pathlib import Path

import pytest
import torch

from adalora_cli.config import load_config
from adalora_cli.engine import loggers as loggers_module
from adalora_cli.engine import loop as loop_module
from adalora_cli.rundir.run import read_metrics

from .conftest import ROOT, SMOKE

READS = ("item", "tolist", "cpu", "numpy", "__float__", "__int__", "__bool__", "__index__")
PACKAGE = str(ROOT / "adalora_cli")
# The data pipeline handles host tensors before they are moved to the device (a DataLoader
# worker's job on a GPU run): their reads wait for nothing.
HOST_SIDE = (str(ROOT / "adalora_cli" / "tasks"), str(ROOT / "adalora_cli" / "engine" / "split.py"),
             str(ROOT / "adalora_cli" / "engine" / "order.py"))


class SyncBook:
    """Reads of tensor values by this package, booked to the step that is running."""

    def __init__(self):
        self.step = 1  # the step being run: one past the last one logged
        self.by_step: dict[int, list[str]] = {}
        self.main = threading.main_thread()

    def record(self, name: str) -> None:
        if threading.current_thread() is not self.main:
            return  # the heartbeat's thread reads no tensor, and waits for nothing
        frame = sys._getframe(2)  # who called the tensor method
        where = frame.f_code.co_filename
        if where.startswith(PACKAGE) and not where.startswith(HOST_SIDE):
            self.by_step.setdefault(self.step, []).append(
                f"{name} at {Path(where).name}:{frame.f_lineno}")


@pytest.fixture()
def book(monkeypatch):
    book = SyncBook()
    for name in READS:
        original = getattr(torch.Tensor, name)

        def wrapped(self, *args, __name=name, __original=original, **kwargs):
            book.record(__name)
            return __original(self, *args, **kwargs)

        monkeypatch.setattr(torch.Tensor, name, wrapped)
    step = loggers_module.RunLogger.step

    def logged(self, n, log, row):
        step(self, n, log, row)
        book.step = n + 1

    monkeypatch.setattr(loggers_module.RunLogger, "step", logged)
    return book


@pytest.mark.parametrize("method", ["adalora", "lora"])
def test_steps_between_logging_steps_read_nothing_from_the_device(book, tmp_path, method):
    T, log_every = 32, 4
    cfg = load_config(str(SMOKE), [f"method.name={method}", f"train.log_every={log_every}",
                                   "train.eval_every=null", "train.save_every=10"])
    run = loop_module.train(cfg, tmp_path / "run", quiet=True)
    rows = [r for r in read_metrics(run) if "loss" in r]
    assert [r["step"] for r in rows] == list(range(log_every, T + 1, log_every))
    masks = set()
    if method == "adalora":  # smoke: t_init 4, delta_t 2, t_final 8 -> events 6..24, 25
        masks = set(range(6, 25, 2)) | {25}
    # the checkpoints after steps 10, 20, 30 come after those steps' logger call: booked
    # to the next step
    saves = {11, 21, 31}
    quiet = [t for t in range(1, T + 1) if t % log_every and t not in masks | saves]
    assert len(quiet) >= 10
    reads = {t: book.by_step.get(t, []) for t in quiet}
    assert {t: r for t, r in reads.items() if r} == {}
    # the book does see reads: a logged row reads the loss (and AdaLoRA's regularizer)
    assert any("__float__" in r for r in book.by_step[log_every])
