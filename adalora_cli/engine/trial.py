"""A run that is a trial of ``adalora tune`` (``tune.study`` set): at every periodic
evaluation it reports its tuning metric to its study and asks the study's pruner whether to
go on; a no ends the run ``pruned`` at that step (:class:`~adalora_cli.errors.Pruned`).

The study lives in Optuna's journal file in the tune's sweep directory, so a trial running
as a SLURM job on another node reports to the same study through the shared filesystem. The
study's record (``tune.study``, a small JSON file written by the tune) names the journal, the
study and its pruner; the trial builds the same pruner from it. The tune itself tells the
study how each trial ended (from its run directory), so a trial killed between a report and
its end changes nothing the rerun cannot redo: a resumed trial reports its evaluations again,
and Optuna keeps the first value of a step. A trial whose loss diverged ends ``pruned`` as
well (not ``failed``): a learning rate too large for a method is a result of the search.

Imported for every run, so Optuna is imported only inside a trial.
"""

from __future__ import annotations

import json
import math
import re
from pathlib import Path
from typing import Any

from ..config import ConfigError, RunConfig
from ..errors import Pruned

_STEP = re.compile(r"at step (\d+)")
_opened: dict[tuple[str, int], Any] = {}
"""The trial of this process, opened at its first report (one per run)."""


def _optuna():
    try:
        import optuna
    except ImportError:
        raise ConfigError("this run is a trial of adalora tune (tune.study is set), which "
                          "needs optuna: pip install -e '.[tune]' in the adalora checkout") \
            from None
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    return optuna


def make_pruner(spec: dict[str, Any]):
    """The pruner a study record names: ``none``, ``median`` or ``halving``."""
    optuna = _optuna()
    name = spec.get("name", "none")
    if name == "median":
        return optuna.pruners.MedianPruner(n_startup_trials=int(spec.get("startup_trials", 5)),
                                           n_warmup_steps=int(spec.get("warmup_steps", 0)))
    if name == "halving":
        return optuna.pruners.SuccessiveHalvingPruner(
            min_resource=spec.get("min_resource", "auto"),
            reduction_factor=int(spec.get("reduction_factor", 4)))
    return optuna.pruners.NopPruner()


def open_study(record: dict[str, Any], base: Path):
    """The study of a record (``base``: the folder its journal path is relative to)."""
    optuna = _optuna()
    from optuna.storages import JournalStorage
    from optuna.storages.journal import JournalFileBackend

    storage = JournalStorage(JournalFileBackend(str(base / record["journal"])))
    return optuna.load_study(study_name=record["study"], storage=storage,
                             pruner=make_pruner(record.get("pruner") or {}))


def _trial(cfg: RunConfig):
    key = (str(cfg.tune.study), int(cfg.tune.trial))
    if key not in _opened:
        path = Path(key[0])
        try:
            record = json.loads(path.read_text())
        except (OSError, ValueError) as err:
            raise ConfigError(f"tune.study {path} cannot be read ({err}); a trial is started "
                              "by adalora tune, which writes it") from None
        study = open_study(record, path.parent)
        trial_id = study._storage.get_trial_id_from_study_id_trial_number(
            study._study_id, key[1])
        _opened[key] = _optuna().trial.Trial(study, trial_id)
    return _opened[key]


def observe(cfg: RunConfig, step: int, results: dict[str, dict[str, float]]) -> None:
    """At a periodic evaluation: report the tuning metric, and stop the run (raise
    :class:`Pruned`) when it is not finite or the study's pruner says so. Nothing for a run
    that is not a trial."""
    if cfg.tune.study is None or step <= 0:
        return
    split, _, metric = str(cfg.tune.metric).rpartition("/")
    value = results.get(split, {}).get(metric)
    if value is None:
        have = ", ".join(f"{s}/{m}" for s, ms in results.items() for m in ms) or "nothing"
        raise ConfigError(f"tune.metric {cfg.tune.metric}: this run evaluates {have}; "
                          "name one of them in the tune manifest's metric:")
    if not math.isfinite(value):
        raise Pruned(f"pruned at step {step}: {cfg.tune.metric} diverged ({value})", step)
    trial = _trial(cfg)
    trial.report(float(value), step)
    if trial.should_prune():
        raise Pruned(f"pruned at step {step} by the study's pruner: {cfg.tune.metric} "
                     f"{value:.6g} ranks below the trials before it there", step)


def diverged(cfg: RunConfig, err: BaseException) -> BaseException:
    """A trial's non-finite loss (the step's FloatingPointError) as :class:`Pruned`: a
    learning rate too large for the method is what the search is there to find."""
    if cfg.tune.study is None or not isinstance(err, FloatingPointError):
        return err
    found = _STEP.search(str(err))
    step = int(found.group(1)) if found else 0
    return Pruned(f"pruned at step {step}: the loss diverged ({err})", step)
