"""Task families, looked up by the name written in ``task.name``.

:func:`get_task` is the one entry point the training loop and the CLI use. :data:`TASKS`
names every task and the module of its family, and a family module is imported only when
one of its tasks is asked for: a GLUE run never loads the SQuAD or summarization stack
(BART warm start, ROUGE), which cost seconds at start-up. Each family module's spec table
(``GLUE_SPECS`` ...) must list the same names; a test holds the two together. Building a
task reads no data and loads no model, so it is cheap and safe in a dry run.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from ..config import ConfigError, RunConfig

if TYPE_CHECKING:
    from .base import Task, TaskData

FAMILIES: dict[str, tuple[str, ...]] = {
    # factory "module:function" -> the task names it builds
    "glue:glue_task": ("cola", "sst2", "mrpc", "qqp", "stsb", "mnli", "qnli", "rte"),
    "rotten_tomatoes:rotten_tomatoes_task": ("rotten_tomatoes",),
    "bbc_topic:bbc_topic_task": ("bbc_topic",),
    "classification:classification_task": ("classification",),
    "squad:squad_task": ("squad_v1", "squad_v2"),
    "summarization:summarization_task": ("xsum", "cnn_dailymail", "bbc_news"),
    "causal_lm:causal_lm_task": ("causal_lm",),
    "bbc_topic_chat:bbc_topic_chat_task": ("bbc_topic_chat",),
    "gsm8k:gsm8k_metamath_task": ("gsm8k_metamath",),
}


class _LazyFactory:
    """``module:function`` under ``adalora_cli.tasks``, imported on first call."""

    def __init__(self, target: str):
        self.module, self.function = target.split(":")

    def __call__(self, cfg: RunConfig) -> Task:
        module = importlib.import_module(f"adalora_cli.tasks.{self.module}")
        return getattr(module, self.function)(cfg)

    def __repr__(self) -> str:
        return f"<task factory adalora_cli.tasks.{self.module}.{self.function}>"


TASKS: dict[str, Callable[[RunConfig], Task]] = {
    name: _LazyFactory(target) for target, names in FAMILIES.items() for name in names}
"""Task name -> factory taking the run config."""


def get_task(cfg: RunConfig) -> Task:
    """The task named by ``cfg.task.name``; an unknown name is a one-line ConfigError."""
    factory = TASKS.get(cfg.task.name)
    if factory is None:
        raise ConfigError(f"unknown task.name {cfg.task.name!r}; valid names: "
                          f"{', '.join(TASKS)}")
    task = factory(cfg)
    if cfg.task.holdout and not getattr(task, "holds_out", False):
        raise ConfigError(f"task.holdout: task {cfg.task.name} cannot hold out training rows "
                          "(the text classifications can: GLUE, classification, "
                          "rotten_tomatoes, bbc_topic; and gsm8k_metamath, from GSM8K's "
                          "train split); unset it, or tune on the validation "
                          "split (select_on: validation)")
    return task


__all__ = ["TASKS", "Task", "TaskData", "get_task"]


def __getattr__(name: str) -> Any:
    # Task and TaskData come from .base (torch) only when asked for, so the torch-free
    # .columns can be imported (by the report) without loading torch.
    if name in ("Task", "TaskData"):
        return getattr(importlib.import_module(f"{__name__}.base"), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
