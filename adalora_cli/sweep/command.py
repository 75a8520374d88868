"""``adalora sweep``'s work between parsing and the exit code: plan the grid, then list it
(``--dry-run``), show where it stands (``--status``), or launch what is left."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from rich.console import Console
from rich.table import Table

from ..config import ConfigError
from .runs import Outcome


@dataclass(frozen=True)
class SweepRequest:
    """``adalora sweep``'s arguments, as parsed."""

    source: Path
    overrides: list[str]
    budget: str | None = None
    methods: str | None = None
    seeds: str | None = None
    jobs: int = 1
    sweep_dir: Path | None = None
    dry_run: bool = False
    quiet: bool = False
    launcher: str = "local"
    slurm: list[str] | None = None
    status: bool = False
    wait: bool = False
    resubmit: bool = False


def run_sweep(req: SweepRequest, out: Console, err: Console) -> int:
    """Do what ``req`` asks, printing to ``out`` (results) and ``err`` (failures); returns
    the exit code: 1 when a run failed or was preempted (rerunning the sweep resumes it)."""
    from . import plan as sweeps
    from .launch import make_launcher
    from .runs import describe

    launcher = make_launcher(req.launcher, req.slurm, req.jobs, req.wait, req.resubmit)
    spec = sweeps.build_spec(req.source, req.budget, req.methods, req.seeds, req.overrides)
    runs = sweeps.plan(spec)
    if not req.status:  # (a status only reads: it may name no --slurm options)
        sweeps.check_processes(runs, launcher.processes_per_run, launcher.name)
    where = req.sweep_dir or Path("runs") / spec.name
    if where.exists() and not where.is_dir():
        raise ConfigError(f"--sweep-dir {where} is a file; pass a folder (it is created "
                          "if missing)")
    check_not_a_run(where, req.sweep_dir is None)
    if req.dry_run:
        print_plan(describe(runs, where), where, out)
        return 0
    if req.status:  # what every run's directory and the scheduler say; nothing is launched
        from .show import print_status
        from .status import check_sweep_dir, sweep_states

        check_sweep_dir(where)  # a folder with no sweep would list every run "not started"
        print_status(sweep_states(runs, where), where, out)
        return 0
    outcomes = launcher.launch(spec, runs, where, quiet=req.quiet)
    if launcher.name == "slurm":  # submitted, not run: say what was queued and where
        from .show import print_submitted

        print_submitted(outcomes, where, out)
        return 1 if any(o.status == "failed" for o in outcomes) else 0
    return print_outcomes(outcomes, where, out, err)


def check_not_a_run(where: Path, default: bool) -> None:
    """A sweep's runs go into folders inside its sweep directory: inside a run directory
    they would hide from a report of it (which reads the run) and tangle two records."""
    from ..rundir.layout import CONFIG, STATUS
    from ..rundir.run import RunDir

    if not ((where / CONFIG).is_file() and (where / STATUS).is_file()):
        return
    state = (RunDir.read_status(where) or {}).get("status", "unknown")
    how = "the sweep's default folder, runs/<sweep name>" if default else "--sweep-dir"
    raise ConfigError(f"{where} is a run directory, not a sweep directory (it holds a "
                      f"{state} run; {how}); pass --sweep-dir with another folder")


def print_plan(rows: list[dict], where: Path, out: Console) -> None:
    table = Table(title=f"sweep plan ({where})")
    for name in ("run", "method", "b(T)", "size", "seed", "adapter params", "trainable",
                 "action"):
        table.add_column(name, overflow="fold",
                         justify="right" if name in ("adapter params", "trainable") else "left")
    for r in rows:
        near = "~" if r["ranks_at_start"] else ""
        table.add_row(r["run"], r["method"], str(r["budget_level"] or ""), r["size"],
                      str(r["seed"]), f"{near}{r['adapter_params']:,}",
                      f"{near}{r['trainable_params']:,}", r["action"])
    out.print(table)
    passed = sorted({r["method"] for r in rows if r["ranks_at_start"]})
    if passed:
        from ..methods.registry import PASS_NOTE

        out.print(f"~ {', '.join(passed)}: {PASS_NOTE}", highlight=False, soft_wrap=True)
    todo = sum(r["action"].startswith(("run", "rerun")) for r in rows)
    out.print(f"{len(rows)} runs planned, {todo} would run; nothing was trained")


def print_outcomes(outcomes: list[Outcome], where: Path, out: Console, err: Console) -> int:
    """A local sweep's count line, then one line per run that needs another go."""
    counts = {s: sum(o.status == s for o in outcomes)
              for s in ("finished", "skipped", "busy", "preempted", "failed")}
    out.print(f"{len(outcomes)} runs: {counts['finished']} finished now, {counts['skipped']} "
              f"finished earlier (skipped), {counts['busy']} running elsewhere, "
              f"{counts['preempted']} preempted, {counts['failed']} failed; sweep "
              f"directory: {where}", highlight=False, soft_wrap=True)
    for o in outcomes:
        if o.status in ("failed", "preempted"):
            err.print(f"{o.status}: {o.run.name}: {o.error} (log: {where}/logs/"
                      f"{o.run.name}.log); rerun the sweep to resume it",
                      highlight=False, soft_wrap=True)
    return 1 if counts["failed"] or counts["preempted"] else 0
