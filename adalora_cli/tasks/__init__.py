"""Task families, looked up by the name written in ``task.name``.

:func:`get_task` is the one entry point the training loop and the CLI use; each family
module registers its task names in :data:`TASKS`. Building a task reads no data and loads
no model, so it is cheap and safe in a dry run.
"""

from __future__ import annotations

from collections.abc import Callable

from adalora_cli.config import ConfigError, RunConfig
from adalora_cli.tasks.base import Task, TaskData
from adalora_cli.tasks.glue import GLUE_SPECS, glue_task
from adalora_cli.tasks.rotten_tomatoes import rotten_tomatoes_task
from adalora_cli.tasks.squad import SQUAD_SPECS, squad_task
from adalora_cli.tasks.summarization import SUMMARIZATION_SPECS, summarization_task

TASKS: dict[str, Callable[[RunConfig], Task]] = {
    **{name: glue_task for name in GLUE_SPECS},
    "rotten_tomatoes": rotten_tomatoes_task,
    **{name: squad_task for name in SQUAD_SPECS},
    **{name: summarization_task for name in SUMMARIZATION_SPECS},
}
"""Task name -> factory taking the run config."""


def get_task(cfg: RunConfig) -> Task:
    """The task named by ``cfg.task.name``; an unknown name is a one-line ConfigError."""
    factory = TASKS.get(cfg.task.name)
    if factory is None:
        raise ConfigError(f"unknown task.name {cfg.task.name!r}; valid names: "
                          f"{', '.join(TASKS)}")
    return factory(cfg)


__all__ = ["TASKS", "Task", "TaskData", "get_task"]
