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
stops its training processes too: they checkpoint and end as ``preempted``. What both
launchers share about the runs (their states, launch claims, manifest, log) is in
:mod:`.runs`.
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from .. import threads
from ..engine.launch import cli_command
from ..errors import EXIT_BUSY, EXIT_PREEMPTED, EXIT_PRUNED, SweepStopped, warning
from ..rundir.layout import SWEEP_LOGS
from ..rundir.owner import PARENT_ENV
from ..rundir.run import RunDir, is_finished
from .plan import PlannedRun, SweepSpec
from .runs import (
    Outcome,
    SweepLog,
    claim_launch,
    clear_empty,
    config_drift,
    last_error,
    refresh_launches,
    release_launch,
    run_state,
    write_manifest,
)


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


def _child_env(gpu: str | None, jobs: int) -> dict[str, str]:
    env = dict(os.environ)
    env[PARENT_ENV] = str(os.getpid())  # the child stops (with a checkpoint) if we die
    if gpu is not None:
        env["CUDA_VISIBLE_DEVICES"] = gpu
    # throughput: OMP_WAIT_POLICY, and a share of the cores per CPU job (see threads.py)
    env.update(threads.child_defaults(env, jobs))
    return env


class _Job:
    def __init__(self, run: PlannedRun, sweep_dir: Path, gpu: str | None, jobs: int,
                 resume: bool):
        self.run, self.gpu, self.start = run, gpu, time.perf_counter()
        self.log = sweep_dir / SWEEP_LOGS / f"{run.name}.log"
        self.run_dir = sweep_dir / run.name
        train = cli_command("train")  # this adalora_cli, not one in the current directory
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
        if code == EXIT_PRUNED:
            return Outcome(self.run, "pruned", seconds)
        status = "preempted" if code == EXIT_PREEMPTED else "failed"
        return Outcome(self.run, status, seconds, f"exit {code}: {last_error(self.log)}")


def _settled(run: PlannedRun, sweep_dir: Path, console: Console) -> Outcome | None:
    """The outcome of a run that needs no launch now (finished, or live elsewhere)."""
    path = sweep_dir / run.name
    state = run_state(path)
    if state == "finished":
        if config_drift(run, path):
            warning(f"{path} finished with a different config than this sweep now plans; "
                    "kept it (delete it to rerun)", console.file)
        return Outcome(run, "skipped")
    if state == "running":
        return Outcome(run, "busy")
    if state == "pruned":  # a tune trial its study stopped: over
        return Outcome(run, "pruned")
    return None


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
    (sweep_dir / SWEEP_LOGS).mkdir(parents=True, exist_ok=True)
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
                warning(f"{sweep_dir / run.name} is being run by another process; left alone",
                        console.file)
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
                     "skipped": "[green]done elsewhere[/]", "preempted": "[yellow]preempted[/]",
                     "pruned": "[yellow]pruned[/]"}
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


