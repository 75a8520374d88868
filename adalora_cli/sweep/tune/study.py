"""A cell's Optuna study: kept in a journal file in the sweep directory (``tune/<cell>
.journal``; Optuna's file storage, no database server, safe on a shared filesystem), with a
small record beside it (``tune/<cell>.json``) that the trial runs read to report to it.

Exact on resume. Trials run one after another within a cell, and the sampler is built
afresh for each trial with the seed ``sampler.seed + trial number``: a trial's values then
depend only on the study's history and its number, never on how many processes the search
took, so a tune killed anywhere and rerun asks for exactly the values an uninterrupted one
would. A trial asked for but not told (``RUNNING``) is never asked again: its run directory
is started, resumed, or, when it already ended, only read.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

from ...config import ConfigError
from ...errors import writing
from ...rundir.layout import SUMMARY
from ...rundir.run import is_finished, is_pruned, write_text_atomic
from .cells import Cell
from .manifest import TuneSpec

FOLDER = "tune"
"""The studies' folder inside the sweep directory."""


def optuna():
    try:
        import optuna as module
    except ImportError:
        raise ConfigError("adalora tune needs optuna: pip install -e '.[tune]' in the adalora "
                          "checkout (make install includes it)") from None
    module.logging.set_verbosity(module.logging.WARNING)
    return module


def record_path(sweep_dir: Path, cell: Cell) -> Path:
    return sweep_dir / FOLDER / f"{cell.name}.json"


def write_record(sweep_dir: Path, cell: Cell, spec: TuneSpec) -> Path:
    """The record a trial reads (journal, study name, pruner, metric)."""
    path = record_path(sweep_dir, cell)
    path.parent.mkdir(parents=True, exist_ok=True)
    record = {"journal": f"{cell.name}.journal", "study": cell.name, "pruner": spec.pruner,
              "metric": cell.metric,
              "direction": "minimize" if cell.lower_is_better else "maximize"}
    with writing(path):
        write_text_atomic(path, json.dumps(record, indent=1) + "\n")
    return path


def _grid(cell: Cell) -> dict[str, list[Any]]:
    return {s.key: s.grid() for s in cell.spaces}


def n_trials(cell: Cell, spec: TuneSpec) -> int:
    if spec.sampler["name"] == "grid":
        return math.prod(len(v) for v in _grid(cell).values())
    return int(spec.sampler["trials"])


def distributions(cell: Cell) -> dict[str, Any]:
    dist = optuna().distributions
    out = {}
    for s in cell.spaces:
        if s.values is not None:
            out[s.key] = dist.CategoricalDistribution(list(s.values))
        elif s.integer:
            out[s.key] = dist.IntDistribution(int(s.low), int(s.high), log=s.log)
        else:
            out[s.key] = dist.FloatDistribution(s.low, s.high, log=s.log)
    return out


def sampler_for(cell: Cell, spec: TuneSpec, number: int):
    """The sampler that picks trial ``number``: seeded by the trial's number (above), the
    grid by the manifest's seed alone."""
    opt = optuna()
    seed = int(spec.sampler.get("seed", 0)) + number
    name = spec.sampler["name"]
    if name == "grid":
        # one seed for every trial: Optuna shuffles the grid by it and gives trial k the
        # k-th point, so each point is tried once, in an order fixed by the seed alone
        class Grid(opt.samplers.GridSampler):
            # Optuna's grid stops an optimize() loop once every point was tried; here the
            # tune counts the trials itself (and has no such loop to stop)
            def after_trial(self, study, trial, state, values) -> None:
                pass
        # the grid holds each range's points; the distribution, the range itself
        return Grid(_grid(cell), seed=int(spec.sampler.get("seed", 0)))
    if name == "random":
        return opt.samplers.RandomSampler(seed=seed)
    return opt.samplers.TPESampler(seed=seed, n_startup_trials=min(
        10, max(1, n_trials(cell, spec) // 3)))


def open_study(sweep_dir: Path, cell: Cell, spec: TuneSpec):
    from optuna.storages import JournalStorage
    from optuna.storages.journal import JournalFileBackend

    from ...engine.trial import make_pruner

    opt = optuna()
    journal = sweep_dir / FOLDER / f"{cell.name}.journal"
    journal.parent.mkdir(parents=True, exist_ok=True)
    storage = JournalStorage(JournalFileBackend(str(journal)))
    study = opt.create_study(storage=storage, study_name=cell.name, load_if_exists=True,
                             direction="minimize" if cell.lower_is_better else "maximize",
                             pruner=make_pruner(spec.pruner))
    return study


def next_trial(study, cell: Cell, spec: TuneSpec) -> tuple[int, dict[str, Any]] | None:
    """The trial to run now, as (number, params): one asked for earlier and never told
    (its run directory decides what happens), else a new one; None when the cell has all
    its trials."""
    state = optuna().trial.TrialState
    trials = study.get_trials(deepcopy=False)
    open_ = [t for t in trials if t.state == state.RUNNING]
    if open_:
        return open_[0].number, dict(open_[0].params)
    if len([t for t in trials if t.state.is_finished()]) >= n_trials(cell, spec):
        return None
    study.sampler = sampler_for(cell, spec, len(trials))
    trial = study.ask(distributions(cell))
    return trial.number, dict(trial.params)


def outcome(run_dir: Path, cell: Cell) -> tuple[str, float | None] | None:
    """How the trial in ``run_dir`` ended, read from its files: ('complete', its final
    tuning metric), ('pruned', None), ('failed', None: no finite score), or None when the
    run has not ended."""
    if is_pruned(run_dir):
        return "pruned", None
    if not is_finished(run_dir):
        return None
    split, _, metric = cell.metric.rpartition("/")
    value = json.loads((run_dir / SUMMARY).read_text())["metrics"].get(split, {}).get(metric)
    if value is None or not math.isfinite(value):
        return "failed", None
    return "complete", float(value)


def tell(study, number: int, run_dir: Path, cell: Cell) -> str | None:
    """Tell the study how trial ``number`` ended, from its run directory: 'complete' (its
    final tuning metric), 'pruned', 'failed', or None when the run has not ended."""
    state = optuna().trial.TrialState
    ended = outcome(run_dir, cell)
    if ended is None:
        return None
    how, value = ended
    if how == "complete":
        study.tell(number, value)
    else:
        study.tell(number, state=state.PRUNED if how == "pruned" else state.FAIL)
    return how


def untold(study, cell: Cell, sweep_dir: Path) -> dict[int, tuple[str, float | None]]:
    """Trials the study still holds as running whose run directories have ended: a round of
    trials is told when its last trial ends, so meanwhile a view of the search reads these
    from their files (the study itself is not written)."""
    state = optuna().trial.TrialState
    found = {}
    for t in study.get_trials(deepcopy=False):
        if t.state == state.RUNNING:
            ended = outcome(sweep_dir / f"{cell.name}-t{t.number:03d}", cell)
            if ended is not None:
                found[t.number] = ended
    return found


def history(study) -> list[dict[str, Any]]:
    """Every trial as plain data: number, state, params, value, last reported step."""
    rows = []
    for t in study.get_trials(deepcopy=False):
        steps = sorted(t.intermediate_values)
        rows.append({"number": t.number, "state": t.state.name.lower(), "params": t.params,
                     "value": t.value, "last_step": steps[-1] if steps else None,
                     "reported": {str(s): t.intermediate_values[s] for s in steps}})
    return rows


def best(study) -> dict[str, Any] | None:
    """The best complete trial's params and value (the first of equals), or None."""
    state = optuna().trial.TrialState
    done = [t for t in study.get_trials(deepcopy=False) if t.state == state.COMPLETE]
    if not done:
        return None
    minimize = study.direction.name == "MINIMIZE"
    top = min(done, key=lambda t: (t.value if minimize else -t.value, t.number))
    return {"number": top.number, "params": dict(top.params), "value": top.value}
