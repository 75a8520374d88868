"""Sweep execution: each planned run as its own ``adalora train`` process.

One process per run keeps runs independent: a crash, an out-of-memory kill or a leaked
CUDA context takes down one run, not the sweep. ``jobs`` processes run at once. On GPUs
they are packed by memory (:mod:`.packing`): a run starts on a GPU with room for the peak
memory its config took before (the first run of a config alone on a GPU), through
``CUDA_VISIBLE_DEVICES``, and otherwise waits. The
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

import json
import os
import shutil
import signal
import subprocess
import time
from collections.abc import Callable
from pathlib import Path

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from .. import threads
from ..config import load_config
from ..engine.launch import cli_command
from ..errors import EXIT_BUSY, EXIT_PREEMPTED, EXIT_PRUNED, SweepStopped, warning
from ..methods.registry import config_digest
from ..rundir.layout import SUMMARY, SWEEP_LOGS
from ..rundir.owner import PARENT_ENV
from ..rundir.run import RunDir, is_finished
from .packing import GpuPacker
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


def gpu_memory(gpus: list[str]) -> dict[str, int] | None:
    """{GPU: bytes free on it now} from ``nvidia-smi`` (which, unlike torch, makes no CUDA
    context in the sweep's own process); None when it is missing or does not answer."""
    if not gpus or shutil.which("nvidia-smi") is None:
        return None
    free = {}
    for gpu in gpus:  # one at a time: nvidia-smi lists several in its own order
        try:
            done = subprocess.run(["nvidia-smi", "--query-gpu=memory.free",
                                   "--format=csv,noheader,nounits", "-i", gpu],
                                  capture_output=True, text=True, timeout=60)
            free[gpu] = int(done.stdout.strip()) << 20  # MiB
        except (OSError, subprocess.SubprocessError, ValueError):
            return None
        if done.returncode != 0:
            return None
    return free


class _Peaks:
    """Measured GPU peaks of the sweep's finished runs, by config digest (seeds of one
    experiment share one): what :class:`GpuPacker` places a run by."""

    def __init__(self, sweep_dir: Path):
        self.sweep_dir = sweep_dir
        self.by_digest: dict[str, int] = {}
        self.digests: dict[str, str] = {}

    def digest(self, run: PlannedRun) -> str:
        if run.name not in self.digests:
            self.digests[run.name] = config_digest(load_config(run.config,
                                                               list(run.overrides)))
        return self.digests[run.name]

    def learn(self, run: PlannedRun) -> None:
        """Read a finished run's peak (the largest of its config's runs is kept); a run
        measured off the GPU (its peak is the process's resident memory) says nothing."""
        try:
            summary = json.loads((self.sweep_dir / run.name / SUMMARY).read_text())
        except (OSError, ValueError):
            return
        peak = summary.get("peak_memory_bytes") if isinstance(summary, dict) else None
        if isinstance(peak, int) and str(summary.get("device", "")).startswith("cuda"):
            key = self.digest(run)
            self.by_digest[key] = max(peak, self.by_digest.get(key, 0))

    def get(self, run: PlannedRun) -> int | None:
        return self.by_digest.get(self.digest(run))


def _packer(jobs: int, gpus: list[str], console: Console) -> GpuPacker | None:
    """Packing by memory when several runs could share a GPU and its memory is known."""
    if jobs <= 1 or not gpus:
        return None
    free = gpu_memory(gpus)
    if free is None:
        warning("nvidia-smi did not say how much GPU memory is free: --jobs runs start "
                "without a memory check", console.file)
        return None
    return GpuPacker(free)


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
            quiet: bool = False,
            then: Callable[[Outcome], list[PlannedRun]] | None = None) -> list[Outcome]:
    """Run the plan; returns one outcome per planned run. Failures never stop the others.

    ``then``: called with each run's outcome as it comes; the runs it returns join the
    queue (a tune's next trial of a cell, asked once the cell's last one is told)."""
    console = Console(stderr=True)
    (sweep_dir / SWEEP_LOGS).mkdir(parents=True, exist_ok=True)
    write_manifest(spec, runs, sweep_dir)
    log = SweepLog(sweep_dir)
    gpus = visible_gpus()
    slots = gpu_slots(jobs, gpus)
    packer, peaks = _packer(len(slots), gpus, console), _Peaks(sweep_dir)
    todo, outcomes = [], []
    order = {r.name: i for i, r in enumerate(runs)}

    def more(o: Outcome) -> int:
        """Queue what ``then`` asks for after ``o``; how many runs joined."""
        extra = then(o) if then is not None else []
        for run in extra:
            order.setdefault(run.name, len(order))
            todo.append(run)
        return len(extra)

    for run in runs:
        settled = _settled(run, sweep_dir, console)
        if settled is None:
            todo.append(run)
        else:
            if packer is not None and settled.status == "skipped":
                peaks.learn(run)  # finished by an earlier sweep: its peak is known
            outcomes.append(settled)
            log.event(run.name, settled.status)
            more(settled)
            if settled.status == "busy":
                warning(f"{sweep_dir / run.name} is being run by another process; left alone",
                        console.file)
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
            joined = more(o)
            if joined:
                progress.update(overall, total=progress.tasks[overall].total + joined)

        refreshed = time.monotonic()
        try:
            while todo or running:
                waits = None
                for slot, gpu in enumerate(slots):
                    while slot not in running and todo:
                        run = todo[0]
                        settled = _settled(run, sweep_dir, console)  # another sweep's work?
                        if settled is not None:
                            todo.pop(0)
                            done(settled)
                            continue
                        on = gpu if packer is None else packer.place(run.name, peaks.get(run))
                        if packer is not None and on is None:
                            waits = run.name  # no GPU has room: it waits, not overtaken
                            break
                        todo.pop(0)
                        job = _launch(run, sweep_dir, on, len(slots), log)
                        if job is None:  # claimed by another sweep between the checks
                            if packer is not None:
                                packer.release(run.name)
                            settled = _settled(run, sweep_dir, console)
                            done(settled or Outcome(run, "busy"))
                            continue
                        running[slot] = job
                for slot, job in list(running.items()):
                    if job.proc.poll() is None:
                        continue
                    del running[slot]
                    release_launch(job.run_dir)
                    outcome = job.outcome()
                    if packer is not None:
                        packer.release(job.run.name)
                        if outcome.status == "finished":
                            peaks.learn(job.run)
                    done(outcome)
                if time.monotonic() - refreshed > 30:
                    refresh_launches([j.run_dir for j in running.values()])
                    refreshed = time.monotonic()
                names = ", ".join(j.run.name for j in running.values())
                note = f"running {names}" if names else ""
                if waits:
                    note += f"; {waits} waits for GPU memory"
                progress.update(overall, note=note)
                time.sleep(0.2)
        except (KeyboardInterrupt, SweepStopped):
            _stop_jobs(running, log)
            raise
        except OSError as err:  # the sweep's own files (a full disk): stop, say why once
            _stop_jobs(running, log)
            raise OSError(err.errno, f"the sweep stopped: {err.strerror or err}; its running "
                                     "runs were stopped, rerun the sweep to resume them",
                          err.filename) from None
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


