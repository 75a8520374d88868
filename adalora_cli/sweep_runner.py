"""Sweep execution: each planned run as its own ``adalora train`` process.

One process per run keeps runs independent: a crash, an out-of-memory kill or a leaked
CUDA context takes down one run, not the sweep. ``jobs`` processes run at once; when
several GPUs are visible each job slot owns one through ``CUDA_VISIBLE_DEVICES``. The
sweep directory holds the run directories, ``logs/<run>.log`` (each process's output),
``sweep.yaml`` (the plan as last launched) and ``sweep_log.jsonl`` (every event, kept
across re-runs). Re-running skips finished runs and deletes unfinished ones before
running them again, so a combination never has two directories.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path

import yaml
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from . import threads
from .config import load_config
from .rundir import CONFIG, RunDir, is_finished
from .sweep import PlannedRun, SweepSpec

LOG = "sweep_log.jsonl"
MANIFEST = "sweep.yaml"


@dataclass
class Outcome:
    run: PlannedRun
    status: str
    """'finished', 'failed', 'skipped' (finished earlier) or 'busy' (running elsewhere)."""
    seconds: float = 0.0
    error: str = ""


def run_state(path: Path) -> str:
    """'finished', 'running' (a live process owns it), 'unfinished' or 'missing'."""
    if is_finished(path):
        return "finished"
    if not path.exists():
        return "missing"
    status = RunDir.read_status(path) or {}
    if status.get("status") == "running" and _alive(status.get("pid")):
        return "running"
    return "unfinished"


def _alive(pid: object) -> bool:
    if not isinstance(pid, int) or pid <= 0:
        return False
    try:
        os.kill(pid, 0)  # signal 0: existence check only
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


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
        self.path = sweep_dir / LOG

    def event(self, run: str, event: str, **fields: object) -> None:
        row = {"time": datetime.now(timezone.utc).isoformat(timespec="seconds"),
               "run": run, "event": event, **fields}
        with open(self.path, "a") as f:
            f.write(json.dumps(row) + "\n")


def write_manifest(spec: SweepSpec, runs: list[PlannedRun], sweep_dir: Path) -> None:
    data = {"name": spec.name, "source": str(spec.source),
            "command": " ".join(["adalora", *sys.argv[1:]]),
            "written": datetime.now(timezone.utc).isoformat(timespec="seconds"),
            "runs": [{"name": r.name, "config": str(r.config), "method": r.method,
                      "budget_level": r.budget_level, "seed": r.seed, "size": r.size,
                      "overrides": list(r.overrides)} for r in runs]}
    (sweep_dir / MANIFEST).write_text(yaml.safe_dump(data, sort_keys=False))


def _child_env(gpu: str | None, jobs: int) -> dict[str, str]:
    env = dict(os.environ)
    if gpu is not None:
        env["CUDA_VISIBLE_DEVICES"] = gpu
    # throughput: OMP_WAIT_POLICY, and a share of the cores per CPU job (see threads.py)
    env.update(threads.child_defaults(env, jobs))
    return env


def _last_error(log: Path) -> str:
    try:
        lines = [line.strip() for line in log.read_text(errors="replace").splitlines()
                 if line.strip()]
    except OSError:
        return "no log"
    errors = [line for line in lines if line.startswith("error:")]
    return (errors or lines or ["exited without output"])[-1][:300]


class _Job:
    def __init__(self, run: PlannedRun, sweep_dir: Path, gpu: str | None, jobs: int):
        self.run, self.gpu, self.start = run, gpu, time.perf_counter()
        self.log = sweep_dir / "logs" / f"{run.name}.log"
        self.run_dir = sweep_dir / run.name
        cmd = [sys.executable, "-m", "adalora_cli.cli", "train", str(run.config),
               *run.overrides, "--run-dir", str(self.run_dir), "--quiet"]
        with open(self.log, "w") as out:
            out.write("$ " + " ".join(cmd) + "\n")
            out.flush()
            self.proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT,
                                         env=_child_env(gpu, jobs))

    def outcome(self) -> Outcome:
        seconds = round(time.perf_counter() - self.start, 1)
        if self.proc.returncode == 0 and is_finished(self.run_dir):
            return Outcome(self.run, "finished", seconds)
        return Outcome(self.run, "failed", seconds,
                       f"exit {self.proc.returncode}: {_last_error(self.log)}")


def _prepare(runs: list[PlannedRun], sweep_dir: Path, log: SweepLog,
             console: Console) -> tuple[list[PlannedRun], list[Outcome]]:
    """Split the plan into runs to launch and runs to leave alone; clear unfinished ones."""
    todo, done = [], []
    for run in runs:
        path = sweep_dir / run.name
        state = run_state(path)
        if state == "finished":
            if config_drift(run, path):
                console.print(f"[yellow]warning:[/] {path} finished with a different config "
                              "than this sweep now plans; kept it (delete it to rerun)",
                              highlight=False, soft_wrap=True)
            done.append(Outcome(run, "skipped"))
        elif state == "running":
            console.print(f"[yellow]warning:[/] {path} is being run by another process; "
                          "left alone", highlight=False, soft_wrap=True)
            done.append(Outcome(run, "busy"))
        else:
            if state == "unfinished":  # a crash or a kill: start it again from scratch
                old = (RunDir.read_status(path) or {}).get("status", "no status")
                shutil.rmtree(path)
                log.event(run.name, "removed_unfinished", previous_status=old)
            todo.append(run)
    return todo, done


def execute(spec: SweepSpec, runs: list[PlannedRun], sweep_dir: Path, jobs: int = 1,
            quiet: bool = False) -> list[Outcome]:
    """Run the plan; returns one outcome per planned run. Failures never stop the others."""
    console = Console(stderr=True)
    (sweep_dir / "logs").mkdir(parents=True, exist_ok=True)
    write_manifest(spec, runs, sweep_dir)
    log = SweepLog(sweep_dir)
    todo, outcomes = _prepare(runs, sweep_dir, log, console)
    for o in outcomes:
        log.event(o.run.name, o.status)
    slots = gpu_slots(jobs, visible_gpus())
    progress = Progress(TextColumn("[bold]{task.description}"), BarColumn(),
                        MofNCompleteColumn(), TextColumn("{task.fields[note]}"),
                        TimeElapsedColumn(), console=console, disable=quiet or not todo)
    running: dict[int, _Job] = {}
    with progress:
        overall = progress.add_task(f"sweep {spec.name}", total=len(todo), note="")
        try:
            while todo or running:
                for slot, gpu in enumerate(slots):
                    if slot not in running and todo:
                        running[slot] = _Job(todo.pop(0), sweep_dir, gpu, len(slots))
                        log.event(running[slot].run.name, "started", gpu=gpu)
                for slot, job in list(running.items()):
                    if job.proc.poll() is None:
                        continue
                    del running[slot]
                    o = job.outcome()
                    outcomes.append(o)
                    log.event(o.run.name, o.status, seconds=o.seconds, error=o.error or None)
                    mark = "[green]done[/]" if o.status == "finished" else "[red]failed[/]"
                    progress.console.print(f"{mark} {o.run.name} ({o.seconds:.0f}s)"
                                           + (f": {o.error}" if o.error else ""),
                                           highlight=False)
                    progress.advance(overall)
                names = ", ".join(j.run.name for j in running.values())
                progress.update(overall, note=f"running {names}" if names else "")
                time.sleep(0.2)
        except KeyboardInterrupt:
            for job in running.values():  # only the processes this sweep started
                job.proc.terminate()
            for job in running.values():
                job.proc.wait()
                log.event(job.run.name, "interrupted")
            raise
    order = {r.name: i for i, r in enumerate(runs)}
    return sorted(outcomes, key=lambda o: order[o.run.name])


def describe(runs: list[PlannedRun], sweep_dir: Path) -> list[dict]:
    """What ``--dry-run`` lists: each run, its size, parameter counts and what would happen.

    Counts come from an in-process dry run, cached across seeds (they never change them)."""
    from .train import dry_run

    cache: dict[tuple, dict] = {}
    action = {"finished": "skip (finished)", "running": "skip (running elsewhere)",
              "unfinished": "rerun (unfinished)", "missing": "run"}
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
