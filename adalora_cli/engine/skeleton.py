"""A model's module tree from its ``config.json`` alone: what planning needs, no weights.

A sweep matches every method's size to a budget level through n, the number of matrices
AdaLoRA adapts (docs/maths.md; the paper's b(T) = n * rbar). n depends only on the
architecture, so the planner, ``sweep --status`` and a SLURM submission build the model on
PyTorch's ``meta`` device from its config: every module exists with its shapes, no tensor
has storage, and no weight file is opened. A login node without the model cache, or a
machine offline with only the config, can plan and submit; the jobs load the weights.

The task builds the skeleton (``Task.skeleton``): the head class it trains (paths from the
model root must match ``method.target_modules`` exactly as in training), and a BERT
checkpoint under a summarization task becomes the BART it is warm-started into.
"""

from __future__ import annotations

from typing import Any

from torch import nn

from ..config import ConfigError, RunConfig
from ..errors import first_line
from ..methods.inject import resolve_targets
from ..tasks import TASKS, get_task
from ..tasks.pretrained import load_config


def read_model_config(path: str) -> Any:
    """The checkpoint's ``config.json`` (local folder, or the hub cache), or a GGUF file's
    metadata; nothing else."""
    from .build import check_model_folder

    check_model_folder(path)
    try:
        return load_config(path)
    except ConfigError:  # said already (a GGUF file without the gguf extra)
        raise
    except (OSError, ValueError) as err:  # no folder, no config.json, not in the cache
        first = first_line(err)[:200]
        raise ConfigError(f"could not read the config of model {path!r} ({first}); set "
                          "model.name_or_path to a folder holding config.json, or a hub id "
                          "whose config is cached") from None


def task_family(task_name: str) -> str:
    """The task family module (``glue``, ``squad``, ``summarization`` ...): with the model
    and the target modules, what decides the architecture and so n."""
    factory = TASKS.get(task_name)
    if factory is None:
        raise ConfigError(f"unknown task.name {task_name!r}; valid names: {', '.join(TASKS)}")
    return factory.module


def model_skeleton(cfg: RunConfig) -> nn.Module:
    """The task's model for ``cfg`` on the meta device (``cfg``'s paths already resolved)."""
    task = get_task(cfg)  # an unknown task.name is a one-line error before any file is read
    return task.skeleton(read_model_config(cfg.model.name_or_path))


def count_adapted(cfg: RunConfig) -> int:
    """n: the matrices ``method.target_modules`` (or the model type's defaults) select, as
    :func:`~adalora_cli.methods.apply_method` would adapt them; no weights are read."""
    return len(resolve_targets(model_skeleton(cfg), cfg.method.target_modules))
