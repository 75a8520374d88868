"""The paper's configs are ready for a GPU run of many hours: a metrics row (a wait for the
GPU) every 10 steps or more, not every step, and a checkpoint every few thousand steps, so
a stopped 85,904-step MNLI run does not start over."""

from __future__ import annotations

import pytest

from adalora_cli.config import load_config
from tests.conftest import ROOT

PAPER = sorted(p.relative_to(ROOT).as_posix() for folder in ("glue", "squad", "summarization")
               for p in (ROOT / "configs" / folder).glob("*.yaml"))
AUTHORS_LOGGING_STEPS = {"mnli": 500, "qqp": 500, "sst2": 500, "qnli": 300, "mrpc": 100,
                         "stsb": 50, "cola": 10, "rte": 10}
"""``--logging_steps`` of the authors' NLU/scripts/run_debertav3_<task>.sh
(QingruZhang/AdaLoRA)."""


def test_every_paper_config_is_here():
    assert len(PAPER) == 13 and "configs/glue/mnli.yaml" in PAPER


@pytest.mark.parametrize("config", PAPER)
def test_logs_every_few_steps_and_checkpoints_on_the_way(config):
    train = load_config(ROOT / config).train
    assert train.log_every >= 10, train.log_every
    assert 0 < train.save_every <= 3000, train.save_every
    task = config.rsplit("/", 1)[-1].removesuffix(".yaml")
    if task in AUTHORS_LOGGING_STEPS:
        assert train.log_every == AUTHORS_LOGGING_STEPS[task]
