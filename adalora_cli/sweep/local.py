"""Sweep execution: each planned run as its own ``adalora train`` process.

One process per run keeps runs independent: a crash, an out-of-memory kill or a leaked
CUDA context takes down one run, not the sweep. ``jobs`` processes run at once; when
several GPUs are visible each job slot owns one through ``CUDA_VISIBLE_DEVICES``. The
sweep directory holds the run directories, ``logs/<run>.log`` (each attempt's output,
appended), ``sweep.yaml`` (the plan as last launched) and ``sweep_log.jsonl`` (every event,
kept across re-runs).

Nothing is ever thrown away: re-running skips finished runs and resumes unfinished ones
(preempted, failed, or whose process died) from their latest checkpoint. Each run's state
is checked again just before it is launched, and its training process claims the directory
atomically, so two sweeps started on one sweep directory share the runs instead of
training any of them twice. A sweep that is stopped (Ctrl-C, SIGTERM, or even SIGKILL)
stops its training processes too: they checkpoint and end as ``preempted``.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path

import yaml
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from .. import threads
from ..config import load_config
from ..errors import EXIT_BUSY, EXIT_PREEMPTED, writing
from ..rundir.layout import CONFIG, LAUNCH, SWEEP_LOG, SWEEP_MANIFEST
from ..rundir.owner import PARENT_ENV, identity, launch_alive, owner_alive
from ..rundir.run import RunDir, is_finished, locked
from .plan import PlannedRun, SweepSpec


@dataclass
class Outcome:
    run: PlannedRun
    status: str
    """'finished', 'failed', 'preempted' (stopped with a checkpoint), 'skipped' (finished
    earlier) or 'busy' (running elsewhere)."""
    seconds: float = 0.0
    error: str = ""
    job: str = ""
    """SLURM launcher: the run's scheduler job id."""
    source: str = ""
    """SLURM launcher: which tool told the job's state (sacct, squeue, ...)."""


def run_state(path: Path) -> str:
    """'finished', 'running' (a live process owns it), 'unfinished' (resumable),
    'empty' (a directory holding no run) or 'missing'."""
    if is_finished(path):
        return "finished"
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
        if state in ("finished", "running"):
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


def visible_gpus() -> list[str]:
    env = os.environ.get("CUDA_VISIBLE_DEVICES")
    if env is not None:
        return [g.strip() for g in env.split(",") if g.strip() and g.strip() != "-1"]
    try:
        import torch
        return [str(i) for i in range(torch.cuda.device_count())]
    except Exception:  # no usable CUDA runtime: a CPU sweep
        return []


def gpu_slots(jobs: int, gpus: list[str]) -> list[str | None]:
    """The GPU each of the ``jobs`` slots owns: one each, round-robin when there are more
    jobs than GPUs; None (leave CUDA_VISIBLE_DEVICES alone) with one GPU or none."""
    return [gpus[i % len(gpus)] if len(gpus) > 1 else None for i in range(max(1, jobs))]


def config_drift(run: PlannedRun, path: Path) -> bool:
    """True when a finished run was made with a different config than the plan's now.

    The stored config is loaded, not just read, so keys added to the config schema since
    the run (at their defaults) do not count as a difference."""
    try:
        stored = load_config(path / CONFIG)
        return stored != load_config(run.config, list(run.overrides))
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


def _child_env(gpu: str | None, jobs: int) -> dict[str, str]:
    env = dict(os.environ)
    env[PARENT_ENV] = str(os.getpid())  # the child stops (with a checkpoint) if we die
    if gpu is not None:
        env["CUDA_VISIBLE_DEVICES"] = gpu
    # throughput: OMP_WAIT_POLICY, and a share of the cores per CPU job (see threads.py)
    env.update(threads.child_defaults(env, jobs))
    return env


def _last_error(log: Path) -> str:
    """The run's own one-line error (its last ``error:`` line), whole: a child's error is
    one line by the CLI's promise, and cutting it at a length lost the fix at its end."""
    try:
        lines = [line.strip() for line in log.read_text(errors="replace").splitlines()
                 if line.strip()]
    except OSError:
        return "no log"
    errors = [line for line in lines if line.startswith("error:")]
    return (errors or lines or ["exited without output"])[-1]


class _Job:
    def __init__(self, run: PlannedRun, sweep_dir: Path, gpu: str | None, jobs: int,
                 resume: bool):
        self.run, self.gpu, self.start = run, gpu, time.perf_counter()
        self.log = sweep_dir / "logs" / f"{run.name}.log"
        self.run_dir = sweep_dir / run.name
        train = [sys.executable, "-m", "adalora_cli", "train"]
        # no --quiet: off a terminal the run prints plain progress lines into its log
        cmd = ([*train, "--resume", str(self.run_dir)] if resume else
               [*train, str(run.config), *run.overrides, "--run-dir", str(self.run_dir)])
        with open(self.log, "a") as out:  # every attempt's output, one after the other
            out.write("$ " + " ".join(cmd) + "\n")
            out.flush()
            # A session of its own: Ctrl-C reaches the sweep only, which then stops each
            # run with SIGTERM, so the run checkpoints instead of failing mid-step.
            self.proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT,
                                         env=_child_env(gpu, jobs), start_new_session=True)

    def outcome(self) -> Outcome:
        seconds = round(time.perf_counter() - self.start, 1)
        code = self.proc.returncode
        if code == 0 and is_finished(self.run_dir):
            return Outcome(self.run, "finished", seconds)
        if code == EXIT_BUSY:
            return Outcome(self.run, "busy", seconds)
        status = "preempted" if code == EXIT_PREEMPTED else "failed"
        return Outcome(self.run, status, seconds, f"exit {code}: {_last_error(self.log)}")


def _settled(run: PlannedRun, sweep_dir: Path, console: Console) -> Outcome | None:
    """The outcome of a run that needs no launch now (finished, or live elsewhere)."""
    path = sweep_dir / run.name
    state = run_state(path)
    if state == "finished":
        if config_drift(run, path):
            console.print(f"[yellow]warning:[/] {path} finished with a different config "
                          "than this sweep now plans; kept it (delete it to rerun)",
                          highlight=False, soft_wrap=True)
        return Outcome(run, "skipped")
    if state == "running":
        return Outcome(run, "busy")
    return None


def clear_empty(path: Path) -> None:
    """Empty a claimed directory that holds no run (e.g. a start cut short); shared with
    the SLURM launcher's jobs."""
    for child in path.iterdir():
        if child.name not in (LAUNCH, ".lock"):
            if child.is_dir():
                shutil.rmtree(child)
            else:
                child.unlink()


def _launch(run: PlannedRun, sweep_dir: Path, gpu: str | None, jobs: int,
            log: SweepLog) -> _Job | None:
    """Start the run's process, unless another sweep got to it first (then None)."""
    path = sweep_dir / run.name
    state = claim_launch(path)
    if state is None:
        return None
    if state == "empty":  # a directory with no run in it (e.g. a start cut short)
        clear_empty(path)
    resume = state == "unfinished"
    if resume:
        old = (RunDir.read_status(path) or {}).get("status", "no status")
        log.event(run.name, "resumed", previous_status=old, gpu=gpu)
    else:
        log.event(run.name, "started", gpu=gpu)
    return _Job(run, sweep_dir, gpu, jobs, resume)


class SweepStopped(Exception):
    """The sweep got SIGTERM; its training processes were stopped with checkpoints."""


def _stop_on_sigterm() -> None:
    def handler(signum, frame):
        raise SweepStopped("stopped by SIGTERM")
    try:
        signal.signal(signal.SIGTERM, handler)
    except ValueError:  # not the main thread (e.g. called from a test runner thread)
        pass


def execute(spec: SweepSpec, runs: list[PlannedRun], sweep_dir: Path, jobs: int = 1,
            quiet: bool = False) -> list[Outcome]:
    """Run the plan; returns one outcome per planned run. Failures never stop the others."""
    console = Console(stderr=True)
    (sweep_dir / "logs").mkdir(parents=True, exist_ok=True)
    write_manifest(spec, runs, sweep_dir)
    log = SweepLog(sweep_dir)
    todo, outcomes = [], []
    for run in runs:
        settled = _settled(run, sweep_dir, console)
        if settled is None:
            todo.append(run)
        else:
            outcomes.append(settled)
            log.event(run.name, settled.status)
            if settled.status == "busy":
                console.print(f"[yellow]warning:[/] {sweep_dir / run.name} is being run by "
                              "another process; left alone", highlight=False, soft_wrap=True)
    slots = gpu_slots(jobs, visible_gpus())
    progress = Progress(TextColumn("[bold]{task.description}"), BarColumn(),
                        MofNCompleteColumn(), TextColumn("{task.fields[note]}"),
                        TimeElapsedColumn(), console=console, disable=quiet or not todo)
    running: dict[int, _Job] = {}
    _stop_on_sigterm()
    with progress:
        overall = progress.add_task(f"sweep {spec.name}", total=len(todo), note="")

        def done(o: Outcome) -> None:
            outcomes.append(o)
            log.event(o.run.name, o.status, seconds=o.seconds, error=o.error or None)
            marks = {"finished": "[green]done[/]", "busy": "[yellow]busy[/]",
                     "skipped": "[green]done elsewhere[/]", "preempted": "[yellow]preempted[/]"}
            progress.console.print(f"{marks.get(o.status, '[red]failed[/]')} {o.run.name} "
                                   f"({o.seconds:.0f}s)" + (f": {o.error}" if o.error else ""),
                                   highlight=False)
            progress.advance(overall)

        refreshed = time.monotonic()
        try:
            while todo or running:
                for slot, gpu in enumerate(slots):
                    while slot not in running and todo:
                        run = todo.pop(0)
                        settled = _settled(run, sweep_dir, console)  # another sweep's work?
                        if settled is not None:
                            done(settled)
                            continue
                        job = _launch(run, sweep_dir, gpu, len(slots), log)
                        if job is None:  # claimed by another sweep between the checks
                            settled = _settled(run, sweep_dir, console)
                            done(settled or Outcome(run, "busy"))
                            continue
                        running[slot] = job
                for slot, job in list(running.items()):
                    if job.proc.poll() is None:
                        continue
                    del running[slot]
                    release_launch(job.run_dir)
                    done(job.outcome())
                if time.monotonic() - refreshed > 30:
                    refresh_launches([j.run_dir for j in running.values()])
                    refreshed = time.monotonic()
                names = ", ".join(j.run.name for j in running.values())
                progress.update(overall, note=f"running {names}" if names else "")
                time.sleep(0.2)
        except (KeyboardInterrupt, SweepStopped):
            _stop_jobs(running, log)
            raise
        except OSError as err:  # the sweep's own files (a full disk): stop, say why once
            _stop_jobs(running, log)
            raise OSError(err.errno, f"the sweep stopped: {err.strerror or err}; its running "
                                     "runs were stopped, rerun the sweep to resume them",
                          err.filename) from None
    order = {r.name: i for i, r in enumerate(runs)}
    return sorted(outcomes, key=lambda o: order[o.run.name])


def _stop_jobs(running: dict[int, _Job], log: SweepLog) -> None:
    """SIGTERM the processes this sweep started (only those): each checkpoints and ends
    preempted. The sweep log is best effort here: the disk may be why we stop."""
    for job in running.values():
        job.proc.send_signal(signal.SIGTERM)
    for job in running.values():
        job.proc.wait()
        release_launch(job.run_dir)
        try:
            log.event(job.run.name, "interrupted")
        except OSError:
            pass


def describe(runs: list[PlannedRun], sweep_dir: Path) -> list[dict]:
    """What ``--dry-run`` lists: each run, its size, parameter counts and what would happen.

    Counts come from an in-process dry run, cached across seeds (they never change them)."""
    from ..engine.build import dry_run

    cache: dict[tuple, dict] = {}
    action = {"finished": "skip (finished)", "running": "skip (running elsewhere)",
              "unfinished": "resume (unfinished)", "empty": "run", "missing": "run"}
    rows = []
    for run in runs:
        key = (run.config, tuple(o for o in run.overrides
                                 if not o.startswith(("train.seed=", "sweep."))))
        if key not in cache:
            cache[key] = dry_run(load_config(run.config, list(run.overrides)))["info"]
        info = cache[key]
        rows.append({"run": run.name, "method": run.method, "budget_level": run.budget_level,
                     "size": run.size, "seed": run.seed,
                     "adapter_params": info["adapter_params"],
                     "trainable_params": info["trainable_params"],
                     "action": action[run_state(sweep_dir / run.name)]})
    return rows
