"""The state of every run of a sweep, from its run directories and from the scheduler.

``adalora sweep ... --status`` prints it and submits nothing; the SLURM launcher uses the
same states to submit only what is missing. Three sources, in this order of trust:

- the run directory (``status.json``, the owner's liveness, ``summary.json``): finished,
  running, preempted (a checkpoint to resume from), failed (with the error);
- ``sweep_log.jsonl``: a run that failed before it wrote anything (a bad option) is failed;
- the scheduler, for runs submitted to SLURM: the submitit job ids recorded in
  ``slurm_jobs.json`` of the sweep directory, asked through submitit (``sacct``). A run
  whose job waits in the queue (or was requeued) is ``queued``; one whose job runs but has
  not claimed its directory yet is ``running``; a job the scheduler ended without a run
  (cancelled, out of memory, node failure) is ``failed`` with the scheduler's word for it.
"""

from __future__ import annotations

import json
import os
import shutil
from dataclasses import dataclass
from pathlib import Path

from ..config import ConfigError
from ..rundir.layout import CONFIG, SLURM_RECORDS, STATUS, SWEEP_LOG, SWEEP_MANIFEST
from ..rundir.owner import process_alive, read_heartbeat
from ..rundir.run import RunDir
from .local import run_state
from .plan import PlannedRun

"""{run name: {"job_id", "cluster", "submitted", ...}} for every run submitted via submitit."""

QUEUED = {"PENDING", "REQUEUED", "REQUEUE_HOLD", "REQUEUE_FED", "CONFIGURING", "SUSPENDED",
          "RESIZING"}
ACTIVE = {"RUNNING", "COMPLETING", "SIGNALING", "STAGE_OUT"}
ENDED_BADLY = {"FAILED", "CANCELLED", "TIMEOUT", "OUT_OF_MEMORY", "NODE_FAIL", "PREEMPTED",
               "BOOT_FAIL", "DEADLINE"}
RESUBMIT = ("not started", "preempted", "failed", "unfinished")
"""States a launcher (re)starts; finished, running and queued runs are left alone."""


@dataclass(frozen=True)
class RunStatus:
    run: str
    state: str
    """queued, running, finished, preempted, failed, unfinished or not started."""
    detail: str = ""
    job: str = ""
    """The scheduler's job id, when the run was submitted to one."""


def _directory_state(path: Path) -> tuple[str, str]:
    state = run_state(path)
    if state == "finished":
        return "finished", ""
    if state == "running":
        beat = read_heartbeat(path)
        return "running", f"step {beat['step']}" if beat else ""
    if state in ("missing", "empty"):
        return "not started", ""
    status = RunDir.read_status(path) or {}
    if status.get("status") == "preempted":
        return "preempted", f"checkpoint at step {status.get('step')}"
    if status.get("status") == "failed":
        return "failed", str(status.get("error", ""))[:200]
    return "unfinished", "its process died; resumable from its last checkpoint"


def last_events(sweep_dir: Path) -> dict[str, dict]:
    """Each run's latest event in ``sweep_log.jsonl``."""
    events: dict[str, dict] = {}
    try:
        lines = (sweep_dir / SWEEP_LOG).read_text().splitlines()
    except OSError:
        return events
    for line in lines:
        try:
            row = json.loads(line)
        except ValueError:  # a line cut short by a crash
            continue
        events[row.get("run", "")] = row
    return events


def read_records(sweep_dir: Path) -> dict[str, dict]:
    try:
        return json.loads((sweep_dir / SLURM_RECORDS).read_text())
    except (OSError, ValueError):
        return {}


def write_records(sweep_dir: Path, records: dict[str, dict]) -> None:
    tmp = sweep_dir / f"{SLURM_RECORDS}.{os.getpid()}.tmp"
    tmp.write_text(json.dumps(records, indent=1) + "\n")
    os.replace(tmp, sweep_dir / SLURM_RECORDS)


def scheduler_states(sweep_dir: Path, records: dict[str, dict]) -> dict[str, str]:
    """{run: the scheduler's state of its latest job} ('' where it cannot say)."""
    slurm = {run: r for run, r in records.items() if r.get("cluster") == "slurm"}
    states = {run: _local_state(r) for run, r in records.items() if r.get("cluster") == "local"}
    if slurm and shutil.which("sacct") is not None:  # else: the run directories alone
        import submitit

        folder = sweep_dir / "slurm"
        jobs = {run: submitit.SlurmJob(folder=folder, job_id=r["job_id"])
                for run, r in slurm.items()}  # registered together: one sacct call for all
        for run, job in jobs.items():
            try:
                states[run] = str(job.state).split()[0].upper()
            except Exception:  # no sacct here, or the job is too old for the accounting
                states[run] = ""
    return states


def _local_state(record: dict) -> str:
    """submitit's local executor: the job lives as long as its controller process."""
    pid = int(record["job_id"])
    owner = {"pid": pid, "host": record.get("host"), "pid_start": record.get("pid_start"),
             "boot_id": record.get("boot_id")}
    return "RUNNING" if process_alive(owner)[0] and not _zombie(pid) else ""


def _zombie(pid: int) -> bool:
    """An ended controller not yet reaped by the process that submitted it."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z"
    except (OSError, IndexError):
        return False


def check_sweep_dir(sweep_dir: Path) -> None:
    """Refuse ``--status`` on a folder that holds no sweep: listing every planned run as
    "not started" there would say something untrue about wherever the sweep really ran."""
    if not sweep_dir.exists():
        raise ConfigError(f"no sweep at {sweep_dir} (it does not exist); pass --sweep-dir "
                          "with the folder the sweep was started in")
    if (sweep_dir / CONFIG).is_file() and (sweep_dir / STATUS).is_file():
        raise ConfigError(f"{sweep_dir} is a run directory, not a sweep directory; pass the "
                          "folder that holds the sweep's runs (its sweep.yaml)")
    if not any((sweep_dir / name).is_file()
               for name in (SWEEP_MANIFEST, SWEEP_LOG, SLURM_RECORDS)):
        raise ConfigError(f"{sweep_dir} holds no sweep (no {SWEEP_MANIFEST} or {SWEEP_LOG}); "
                          "pass --sweep-dir with the folder the sweep was started in")


def sweep_states(runs: list[PlannedRun], sweep_dir: Path, scheduler: bool = True
                 ) -> list[RunStatus]:
    records = read_records(sweep_dir)
    sched = scheduler_states(sweep_dir, records) if scheduler and records else {}
    events = last_events(sweep_dir)
    return [_combine(run.name, _directory_state(sweep_dir / run.name), events.get(run.name),
                     sched.get(run.name, ""), records.get(run.name, {}).get("job_id", ""))
            for run in runs]


def _combine(name: str, directory: tuple[str, str], event: dict | None, sched: str,
             job: str) -> RunStatus:
    state, detail = directory
    if state in ("finished", "running"):
        return RunStatus(name, state, detail, job)
    if state == "not started" and event and event.get("event") == "failed":
        # the job's own last word, after its latest submission: its scheduler job may
        # still be winding down
        return RunStatus(name, "failed", str(event.get("error") or ""), job)
    if sched in QUEUED:
        return RunStatus(name, "queued", f"job {sched.lower()}", job)
    if sched in ACTIVE:
        return RunStatus(name, "running", "job started", job)
    if state == "not started" and sched in ENDED_BADLY:  # the scheduler ended it, no run
        return RunStatus(name, "failed", f"job {sched.lower()} before the run started", job)
    return RunStatus(name, state, detail, job)
