"""A trial's report to its study at an evaluation, without training: the study's median
pruner stops a trial that scores below the trials before it there, and lets one at or above
the median go on; a non-finite score stops it as diverged."""

from __future__ import annotations

import json
import math

import pytest

from adalora_cli.config import RunConfig, TuneConfig
from adalora_cli.engine import trial as hook
from adalora_cli.errors import Pruned
from adalora_cli.sweep.tune.study import optuna


def study_with_history(tmp_path, values_at_4: list[float]) -> tuple[RunConfig, int]:
    """A study (journal in tmp_path) whose finished trials scored ``values_at_4`` at step 4,
    and a config for a new, running trial of it."""
    from optuna.storages import JournalStorage
    from optuna.storages.journal import JournalFileBackend

    opt = optuna()
    storage = JournalStorage(JournalFileBackend(str(tmp_path / "c.journal")))
    study = opt.create_study(storage=storage, study_name="c", direction="maximize")
    for value in values_at_4:
        t = study.ask()
        t.report(value, 4)
        study.tell(t, value)
    running = study.ask()
    record = {"journal": "c.journal", "study": "c", "metric": "heldout/accuracy",
              "pruner": {"name": "median", "startup_trials": 2}}
    (tmp_path / "c.json").write_text(json.dumps(record))
    tune = TuneConfig(str(tmp_path / "c.json"), running.number, "heldout/accuracy")
    return RunConfig(tune=tune), running.number


def test_the_median_pruner_stops_a_trial_below_the_median(tmp_path):
    cfg, number = study_with_history(tmp_path, [0.8, 0.7, 0.9])  # median 0.8
    with pytest.raises(Pruned) as stopped:
        hook.observe(cfg, 4, {"heldout": {"accuracy": 0.5}, "validation": {"accuracy": 0.9}})
    assert stopped.value.step == 4 and "pruner" in str(stopped.value)
    hook._opened.clear()


def test_a_trial_at_the_median_goes_on_and_its_score_is_recorded(tmp_path):
    cfg, number = study_with_history(tmp_path, [0.8, 0.7, 0.9])
    hook.observe(cfg, 4, {"heldout": {"accuracy": 0.8}})  # not below: no exception
    trial = hook._opened[(cfg.tune.study, number)]
    assert trial.study.trials[number].intermediate_values == {4: 0.8}
    hook._opened.clear()


def test_a_nan_score_is_pruned_as_diverged_and_other_runs_are_left_alone(tmp_path):
    cfg, _ = study_with_history(tmp_path, [])
    with pytest.raises(Pruned, match="diverged"):
        hook.observe(cfg, 8, {"heldout": {"accuracy": math.nan}})
    hook.observe(RunConfig(), 8, {"heldout": {"accuracy": math.nan}})  # not a trial
    err = FloatingPointError("loss became nan at step 3; likely causes: ...")
    assert hook.diverged(RunConfig(), err) is err
    assert hook.diverged(cfg, err).step == 3
