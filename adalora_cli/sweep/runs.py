"""What a sweep knows about its runs, shared by both launchers (the local process pool in
:mod:`.local`, the SLURM array in :mod:`.slurm`): each run directory's state and the right to
start its process (``launch.json``), the sweep's manifest and event log, a run's last error
line, each run's outcome, and the ``--dry-run`` listing.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path

import yaml

from ..config import load_config
from ..errors import writing
from ..rundir.layout import CONFIG, LAUNCH, SWEEP_LOG, SWEEP_MANIFEST
from ..rundir.owner import identity, launch_alive, owner_alive
from ..rundir.run import is_finished, is_pruned, locked
from .plan import PlannedRun, SweepSpec


@dataclass
class Outcome:
    run: PlannedRun
    status: str
    """'finished', 'failed', 'preempted' (stopped with a checkpoint), 'skipped' (finished
    earlier), 'busy' (running elsewhere) or 'pruned' (a tune trial its study stopped)."""
    seconds: float = 0.0
    error: str = ""
    job: str = ""
    """SLURM launcher: the run's scheduler job id."""
    source: str = ""
    """SLURM launcher: which tool told the job's state (sacct, squeue, ...)."""


def run_state(path: Path) -> str:
    """'finished', 'pruned' (a tune trial its study stopped: over, never resumed), 'running'
    (a live process owns it), 'unfinished' (resumable), 'empty' (a directory holding no run)
    or 'missing'."""
    if is_finished(path):
        return "finished"
    if is_pruned(path):
        return "pruned"
    if not path.exists():
        return "missing"
    if owner_alive(path)[0] or launch_alive(path):
        return "running"
    if not (path / CONFIG).is_file():
        return "empty"
    return "unfinished"


def claim_launch(path: Path) -> str | None:
    """Atomically take the right to start ``path``'s process: its state if taken (then
    ``launch.json`` names this sweep until :func:`release_launch`), None if another process
    finished it or is running it meanwhile."""
    path.mkdir(parents=True, exist_ok=True)
    with locked(path):
        state = run_state(path)
        if state in ("finished", "running", "pruned"):
            return None
        with writing(path / LAUNCH):
            (path / LAUNCH).write_text(json.dumps(identity()) + "\n")
        return state


def release_launch(path: Path) -> None:
    """Remove this sweep's ``launch.json`` (never another sweep's)."""
    try:
        record = json.loads((path / LAUNCH).read_text())
    except (OSError, ValueError):
        return
    if record.get("pid") == os.getpid():
        (path / LAUNCH).unlink(missing_ok=True)


def refresh_launches(paths: list[Path]) -> None:
    """Touch the ``launch.json`` of runs this sweep is running: its modification time is the
    sweep's heartbeat for other hosts while the run's own process starts up."""
    for path in paths:
        try:
            os.utime(path / LAUNCH)
        except OSError:
            pass


def config_drift(run: PlannedRun, path: Path) -> bool:
    """True when a finished run was made with a different config than the plan's now.

    The stored config is loaded, not just read, so keys added to the config schema since
    the run (at their defaults) do not count as a difference; nor do what the run settled
    from its data where the plan leaves it open (a classifier's labels)."""
    try:
        stored = load_config(path / CONFIG)
        return stored != load_config(run.config, list(run.overrides)).settled_as(stored)
    except Exception:  # an unreadable config counts as different
        return True


class SweepLog:
    def __init__(self, sweep_dir: Path):
        self.path = sweep_dir / SWEEP_LOG

    def event(self, run: str, event: str, **fields: object) -> None:
        row = {"time": datetime.now(timezone.utc).isoformat(timespec="seconds"),
               "run": run, "event": event, **fields}
        with writing(self.path), open(self.path, "a") as f:
            f.write(json.dumps(row) + "\n")


def write_manifest(spec: SweepSpec, runs: list[PlannedRun], sweep_dir: Path) -> None:
    data = {"name": spec.name, "source": str(spec.source),
            "command": " ".join(["adalora", *sys.argv[1:]]),
            "written": datetime.now(timezone.utc).isoformat(timespec="seconds"),
            "runs": [{"name": r.name, "config": str(r.config), "method": r.method,
                      "budget_level": r.budget_level, "seed": r.seed, "size": r.size,
                      "overrides": list(r.overrides)} for r in runs]}
    with writing(sweep_dir / SWEEP_MANIFEST):
        (sweep_dir / SWEEP_MANIFEST).write_text(yaml.safe_dump(data, sort_keys=False))


def last_error(log: Path) -> str:
    """The run's own one-line error (its last ``error:`` line), whole: a child's error is
    one line by the CLI's promise, and cutting it at a length lost the fix at its end."""
    try:
        lines = [line.strip() for line in log.read_text(errors="replace").splitlines()
                 if line.strip()]
    except OSError:
        return "no log"
    errors = [line for line in lines if line.startswith("error:")]
    return (errors or lines or ["exited without output"])[-1]


def clear_empty(path: Path) -> None:
    """Empty a claimed directory that holds no run (e.g. a start cut short); shared with
    the SLURM launcher's jobs."""
    for child in path.iterdir():
        if child.name not in (LAUNCH, ".lock"):
            if child.is_dir():
                shutil.rmtree(child)
            else:
                child.unlink()


def describe(runs: list[PlannedRun], sweep_dir: Path) -> list[dict]:
    """What ``--dry-run`` lists: each run, its size, parameter counts and what would happen.

    Counts come from an in-process dry run, cached across seeds (they never change them)."""
    from ..engine.dryrun import dry_run

    cache: dict[tuple, dict] = {}
    action = {"finished": "skip (finished)", "running": "skip (running elsewhere)",
              "pruned": "skip (pruned)",
              "unfinished": "resume (unfinished)", "empty": "run", "missing": "run"}
    rows = []
    for run in runs:
        key = (run.config, tuple(o for o in run.overrides
                                 if not o.startswith(("train.seed=", "sweep."))))
        if key not in cache:
            cache[key] = dry_run(load_config(run.config, list(run.overrides)))
        counted = cache[key]
        rows.append({"run": run.name, "method": run.method, "budget_level": run.budget_level,
                     "size": run.size, "seed": run.seed,
                     "adapter_params": counted.adapter_params,
                     "trainable_params": counted.trainable_params,
                     "ranks_at_start": counted.ranks_at_start,
                     "action": action[run_state(sweep_dir / run.name)]})
    return rows
