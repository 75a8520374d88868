"""``adalora tune``'s work between parsing and the exit code: plan the cells, search each
(trials through the sweep's launchers, one trial per cell at a time, cells side by side),
then run each cell's chosen value on the manifest's seeds; or, with ``--status``, say where
every study stands.

Everything is decided from the sweep directory, so the command can be killed anywhere and
rerun: the studies' journals say which trials were asked for and told, the run directories
how each trial and seed run stands (:mod:`.study`). ``tune.json`` is the tune's record for
``adalora report`` (written after every round; reports import no Optuna).
"""

from __future__ import annotations

import json
import sys
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path

from rich.console import Console
from rich.live import Live
from rich.table import Table

from ...config import ConfigError, load_config
from ...errors import writing
from ...rundir.layout import SWEEP_LOGS
from ...rundir.run import write_text_atomic
from ..plan import PlannedRun, SweepSpec
from ..runs import Outcome
from .cells import Cell, check_holdout, plan_cells
from .manifest import TuneSpec, load_tune_manifest
from .study import (
    best,
    history,
    n_trials,
    next_trial,
    open_study,
    optuna,
    tell,
    untold,
    write_record,
)

RECORD = "tune.json"
"""The tune's record in its sweep directory, read by ``adalora report``."""


@dataclass(frozen=True)
class TuneRequest:
    """``adalora tune``'s arguments, as parsed."""

    manifest: Path
    overrides: list[str]
    jobs: int = 1
    sweep_dir: Path | None = None
    quiet: bool = False
    launcher: str = "local"
    slurm: list[str] | None = None
    status: bool = False


def run_tune(req: TuneRequest, out: Console, err: Console, launcher=None) -> int:
    """Do what ``req`` asks; returns the exit code (1 when a trial or a seed run failed or
    was stopped: rerunning the tune continues). ``launcher``: one of the sweep's launchers
    (by default the one ``req`` names)."""
    from ..command import check_not_a_run
    from ..launch import make_launcher

    spec = load_tune_manifest(req.manifest, req.overrides)
    optuna()  # the extra is installed, before any planning
    if launcher is None:
        launcher = make_launcher(req.launcher, req.slurm, req.jobs, wait=req.launcher == "slurm")
    if launcher.processes_per_run > 1:
        raise ConfigError("adalora tune runs each trial as one process: set --slurm "
                          "gpus_per_job=1 (a trial's study is told by one rank)")
    cells = plan_cells(spec)
    where = req.sweep_dir or Path("runs") / spec.name
    if where.exists() and not where.is_dir():
        raise ConfigError(f"--sweep-dir {where} is a file; pass a folder (it is created if "
                          "missing)")
    check_not_a_run(where, req.sweep_dir is None)
    if req.status:
        return print_status(spec, cells, where, out)
    _check_pruning(spec, cells)
    check_holdout(spec, cells)
    (where / SWEEP_LOGS).mkdir(parents=True, exist_ok=True)
    studies = {c.name: open_study(where, c, spec) for c in cells}
    records = {c.name: write_record(where, c, spec) for c in cells}
    # from the start, so that a report of the folder knows its runs for a tune's trials
    write_tune_record(spec, cells, studies, where)
    failed = search(spec, cells, studies, records, where, launcher, err, req.quiet)
    if not req.quiet:
        err.print()  # the live table ends without one
    write_tune_record(spec, cells, studies, where)
    if failed:
        for run, why in failed:
            err.print(f"trial {run.name}: {why} (log: {where}/{SWEEP_LOGS}/{run.name}.log); "
                      "rerun the tune to continue", highlight=False, soft_wrap=True)
        return 1
    return seed_phase(spec, cells, studies, where, launcher, out, err, req.quiet)


def _check_pruning(spec: TuneSpec, cells: list[Cell]) -> None:
    if spec.pruner["name"] == "none":
        return
    for cell in cells:
        cfg = load_config(cell.base.config, list(cell.base.overrides))
        if cfg.train.eval_every is None:
            raise ConfigError(f"{spec.source}: pruner {spec.pruner['name']} stops trials at "
                              f"their periodic evaluations, and {cell.name} has none; set "
                              "train.eval_every=N in the manifest's overrides (or pruner: "
                              "none)")


def search(spec: TuneSpec, cells: list[Cell], studies: dict, records: dict, where: Path,
           launcher, err: Console, quiet: bool) -> list[tuple[PlannedRun, str]]:
    """Every cell's trials, one at a time per cell, cells side by side; the trials (with
    why) that did not end, which stop the search. A launcher that ``feeds`` starts a cell's
    next trial as soon as its last one is told; otherwise trials go in rounds of one per
    unfinished cell (a SLURM job array each)."""
    # the launcher's own lines (a trial done, pruned) are printed above the table
    view = Live(_View(spec, cells, studies, where), console=err, transient=False,
                auto_refresh=True, refresh_per_second=0.25, redirect_stderr=True,
                redirect_stdout=True)
    with view if not quiet else _Nothing():
        while True:
            batch = [t for t in (_next(spec, c, studies[c.name], records[c.name], where)
                                 for c in cells) if t is not None]
            if not batch:
                return []
            failed = _launch_trials(spec, cells, studies, records, where, launcher, batch)
            if not quiet:
                view.refresh()
            if failed:
                return failed


def _launch_trials(spec: TuneSpec, cells: list[Cell], studies: dict, records: dict,
                   where: Path, launcher, batch: list[tuple[Cell, int, PlannedRun]]
                   ) -> list[tuple[PlannedRun, str]]:
    """Launch ``batch`` (a trial per cell); each trial is told to its study as it ends
    and, where the launcher feeds, followed by its cell's next. The trials that did not
    end, with why."""
    feeds = getattr(launcher, "feeds", False)
    open_ = {run.name: (cell, number, run) for cell, number, run in batch}
    failed: list[tuple[PlannedRun, str]] = []

    def told(o: Outcome) -> list[PlannedRun]:
        """Tell the study how the trial ended; the cell's next trial, if any."""
        if o.run.name not in open_:
            return []
        cell, number, _ = open_.pop(o.run.name)
        if tell(studies[cell.name], number, where / o.run.name, cell) is None:
            failed.append((o.run, f"{o.status}: {o.error}"))
        write_tune_record(spec, cells, studies, where)
        if failed or not feeds:
            return []
        found = _next(spec, cell, studies[cell.name], records[cell.name], where)
        if found is None:
            return []
        open_[found[2].name] = found
        return [found[2]]

    runs = [run for _, _, run in batch]
    sweep = SweepSpec(spec.name, [], spec.source)
    if feeds:
        launcher.launch(sweep, runs, where, quiet=True, then=told)
    else:
        for o in launcher.launch(sweep, runs, where, quiet=True):
            told(o)
    return failed + [(run, "did not run") for _, _, run in open_.values()]


class _View:
    """The live table, built afresh at each redraw."""

    def __init__(self, spec: TuneSpec, cells: list[Cell], studies: dict, where: Path):
        self.args = (spec, cells, studies, where)
        self.last: Table | None = None

    def __rich__(self) -> Table:
        try:
            self.last = _table(*self.args)
        except OSError:  # a run directory mid-write: keep the last drawing
            if self.last is None:
                raise
        return self.last


class _Nothing:
    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        return None


def _next(spec: TuneSpec, cell: Cell, study, record: Path, where: Path
          ) -> tuple[Cell, int, PlannedRun] | None:
    """The cell's next trial to launch; one whose run directory already ended (a tune
    killed after the run, before telling the study) is only told."""
    while True:
        found = next_trial(study, cell, spec)
        if found is None:
            return None
        number, params = found
        run = cell.trial(spec, number, params, record)
        if tell(study, number, where / run.name, cell) is None:
            return cell, number, run


def seed_phase(spec: TuneSpec, cells: list[Cell], studies: dict, where: Path, launcher,
               out: Console, err: Console, quiet: bool) -> int:
    """Each cell's chosen values on every seed: ordinary sweep runs."""
    from ..command import print_outcomes

    runs: list[PlannedRun] = []
    for cell in cells:
        chosen = best(studies[cell.name])
        if chosen is None:
            raise ConfigError(f"no trial of {cell.name} ended with a score (every one was "
                              "pruned or diverged); widen or lower its search range")
        runs += cell.seed_runs(spec, chosen["params"])
    outcomes = launcher.launch(SweepSpec(spec.name, [], spec.source), runs, where, quiet=quiet)
    write_tune_record(spec, cells, studies, where)
    for cell in cells:
        chosen = best(studies[cell.name])
        words = ", ".join(f"{k}={v:g}" if isinstance(v, float) else f"{k}={v}"
                          for k, v in chosen["params"].items())
        out.print(f"{cell.name}: chose {words} ({cell.metric} {chosen['value']:.4g})",
                  highlight=False, soft_wrap=True)
    if launcher.name == "slurm":  # (waited for: every job has ended)
        from ..show import print_submitted

        print_submitted(outcomes, where, out)
        return 1 if any(o.status != "finished" for o in outcomes) else 0
    return print_outcomes(outcomes, where, out, err)


# ----------------------------------------------------------------------------- records


def _counts(study) -> dict[str, int]:
    rows = history(study)
    return {s: sum(r["state"] == s for r in rows) for s in ("complete", "pruned", "running",
                                                            "fail")}


def write_tune_record(spec: TuneSpec, cells: list[Cell], studies: dict, where: Path) -> None:
    """``tune.json``: what ``adalora report`` says about the tune (and nothing it must
    recompute with Optuna)."""
    data = {
        "name": spec.name, "source": str(spec.source),
        "command": " ".join(["adalora", *sys.argv[1:]]),
        "written": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "select_on": spec.select_on, "holdout": spec.holdout, "seeds": spec.seeds,
        "sampler": spec.sampler, "pruner": spec.pruner,
        "cells": [{
            "name": c.name, "method": c.method, "budget_level": c.budget_level,
            "config": str(c.base.config), "metric": c.metric, "holdout": c.holdout,
            "direction": "minimize" if c.lower_is_better else "maximize",
            "space": {s.key: s.words() for s in c.spaces},
            "trials_planned": n_trials(c, spec),
            "trials": [{**r, "run": f"{c.name}-t{r['number']:03d}"}
                       for r in history(studies[c.name])],
            "chosen": best(studies[c.name]),
        } for c in cells],
    }
    path = where / RECORD
    with writing(path):
        write_text_atomic(path, json.dumps(data, indent=1, default=str) + "\n")


def _table(spec: TuneSpec, cells: list[Cell], studies: dict, where: Path) -> Table:
    on = f"; choosing on {cells[0].metric}" if cells else ""
    table = Table(title=f"tune {spec.name} ({where}{on})")
    for name in ("cell", "trials", "pruned", "best", "at"):
        table.add_column(name, justify="right" if name in ("trials", "pruned", "best")
                         else "left", overflow="fold")
    for cell in cells:
        study = studies[cell.name]
        counts = _counts(study)
        chosen = best(study)
        # the trials of the round under way that ended already count (read from their runs)
        ended = untold(study, cell, where)
        params = {t.number: t.params for t in study.get_trials(deepcopy=False)}
        for number, (how, value) in sorted(ended.items()):
            counts["pruned" if how == "pruned" else "fail" if how == "failed"
                   else "complete"] += 1
            better = chosen is None or (value < chosen["value"] if cell.lower_is_better
                                        else value > chosen["value"])
            if how == "complete" and better:
                chosen = {"number": number, "params": dict(params[number]), "value": value}
        done = counts["complete"] + counts["pruned"] + counts["fail"]
        at = ", ".join(f"{k.split('.')[-1]}={v:.3g}" if isinstance(v, float) else
                       f"{k.split('.')[-1]}={v}" for k, v in (chosen or {}).get(
                           "params", {}).items())
        table.add_row(cell.name, f"{done}/{n_trials(cell, spec)}", str(counts["pruned"]),
                      f"{chosen['value']:.4g}" if chosen else "-", at or "-")
    return table


def print_status(spec: TuneSpec, cells: list[Cell], where: Path, out: Console) -> int:
    """Every study's trials and best so far, then the seed runs' states; starts nothing."""
    from ..show import print_status as print_runs
    from ..status import sweep_states
    from .study import FOLDER

    if not (where / FOLDER).is_dir():
        raise ConfigError(f"{where} holds no tune (no {FOLDER}/ folder); start it with "
                          f"adalora tune {spec.source}")
    started = [c for c in cells if (where / FOLDER / f"{c.name}.journal").is_file()]
    studies = {c.name: open_study(where, c, spec) for c in started}
    out.print(_table(spec, started, studies, where))
    for cell in cells:
        if cell not in started:
            out.print(f"{cell.name}: not started", highlight=False)
    runs = []
    for cell in started:
        rows = history(studies[cell.name])
        chosen = best(studies[cell.name])
        if chosen and sum(r["state"] != "running" for r in rows) >= n_trials(cell, spec):
            runs += cell.seed_runs(spec, chosen["params"])
    if runs:
        print_runs(sweep_states(runs, where), where, out)
    else:
        out.print("seed runs: none yet (they start once every cell's search is done)",
                  highlight=False)
    return 0
