"""The state of every run of a sweep, from its run directories and from the scheduler.

``adalora sweep ... --status`` prints it and submits nothing; the SLURM launcher uses the
same states to submit only what is missing. Three sources, in this order of trust:

- the run directory (``status.json``, the owner's liveness, ``summary.json``): finished,
  running, preempted (a checkpoint to resume from), failed (with the error);
- ``sweep_log.jsonl``: a run that failed before it wrote anything (a bad option) is failed;
- the scheduler, for runs submitted to SLURM: the submitit job ids recorded in
  ``slurm_jobs.json`` of the sweep directory, asked through ``sacct``, else ``squeue``
  (:mod:`adalora_cli.sweep.scheduler`; each row says which answered). A run
  whose job waits in the queue (or was requeued) is ``queued``; one whose job runs but has
  not claimed its directory yet is ``running``; a job the scheduler ended without a run
  (out of memory, node failure) is ``failed`` with the scheduler's word for it, and a job
  cancelled (scancel) is ``cancelled``, started again by a re-run as a failed run is.
  With neither tool, a run whose recorded job may still wait is ``unknown``.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path

from ..config import ConfigError
from ..errors import writing
from ..rundir.layout import CONFIG, SLURM_RECORDS, STATUS, SWEEP_LOG, SWEEP_MANIFEST
from ..rundir.owner import read_heartbeat
from ..rundir.run import RunDir
from .plan import PlannedRun
from .runs import run_state
from .scheduler import UNKNOWN, ask

"""{run name: {"job_id", "cluster", "submitted", ...}} for every run submitted via submitit."""

QUEUED = {"PENDING", "REQUEUED", "REQUEUE_HOLD", "REQUEUE_FED", "CONFIGURING", "SUSPENDED",
          "RESIZING"}
ACTIVE = {"RUNNING", "COMPLETING", "SIGNALING", "STAGE_OUT"}
ENDED_BADLY = {"FAILED", "CANCELLED", "TIMEOUT", "OUT_OF_MEMORY", "NODE_FAIL", "PREEMPTED",
               "BOOT_FAIL", "DEADLINE"}
RESUBMIT = ("not started", "preempted", "failed", "unfinished", "cancelled")
"""States a launcher (re)starts; finished, running and queued runs are left alone."""
UNKNOWN_STATE = "unknown"
"""A run with a submitted job that nothing here can look up (no sacct, no squeue): it may
still be queued, so a launcher submits it again only when asked to (``--resubmit``)."""


@dataclass(frozen=True)
class RunStatus:
    run: str
    state: str
    """queued, running, finished, preempted, failed, unfinished or not started."""
    detail: str = ""
    job: str = ""
    """The scheduler's job id, when the run was submitted to one."""
    source: str = ""
    """Which tool told the scheduler's side (sacct, squeue, ...); '' without a job."""


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
    if state == "pruned":
        return "pruned", f"at step {status.get('step')}"
    if status.get("status") == "preempted":
        return "preempted", f"checkpoint at step {status.get('step')}"
    if status.get("status") == "failed":
        return "failed", str(status.get("error", ""))  # whole: its fix is at the end
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
    try:
        with writing(sweep_dir / SLURM_RECORDS, written_as=tmp):
            tmp.write_text(json.dumps(records, indent=1) + "\n")
            os.replace(tmp, sweep_dir / SLURM_RECORDS)
    finally:
        tmp.unlink(missing_ok=True)  # a full disk: no half-written copy left behind


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
    view = ask(sweep_dir, records) if scheduler and records else None
    sched = view.states if view else {}
    events = last_events(sweep_dir)
    rows = []
    for run in runs:
        record = records.get(run.name, {})
        row = _combine(run.name, _directory_state(sweep_dir / run.name), events.get(run.name),
                       sched.get(run.name, ""), str(record.get("job_id", "")))
        if row.state == UNKNOWN_STATE:
            row = RunStatus(row.run, row.state, f"job submitted {record.get('submitted', '')}"
                            "; it may still be queued", row.job)
        rows.append(RunStatus(row.run, row.state, row.detail, row.job,
                              view.source if view and record else ""))
    return rows


JOB_ENDED = ("finished", "failed", "preempted", "skipped", "busy", "pruned")
"""A job's last events in ``sweep_log.jsonl``: after one of them it is out of the queue
(a job requeued on preemption logs ``requeued`` instead)."""


def _job_ended(event: dict | None, job: str) -> bool:
    return bool(event and job and str(event.get("job", "")) == job
                and event.get("event") in JOB_ENDED)


def _combine(name: str, directory: tuple[str, str], event: dict | None, sched: str,
             job: str) -> RunStatus:
    state, detail = directory
    if state in ("finished", "running", "pruned"):
        return RunStatus(name, state, detail, job)
    if state == "not started" and event and event.get("event") == "failed":
        # the job's own last word, after its latest submission: its scheduler job may
        # still be winding down
        return RunStatus(name, "failed", str(event.get("error") or ""), job)
    if sched in QUEUED:
        return RunStatus(name, "queued", f"job {sched.lower()}", job)
    if sched in ACTIVE:
        return RunStatus(name, "running", "job started", job)
    if sched == UNKNOWN and not _job_ended(event, job):  # nothing can say if it still waits
        return RunStatus(name, UNKNOWN_STATE, detail, job)
    if sched == "CANCELLED":  # scancel: said as such, not as the run's own failure
        why = f"; {detail}" if detail else ""
        return RunStatus(name, "cancelled", f"job cancelled{why}" if state != "not started"
                         else "job cancelled before the run started", job)
    if state == "not started" and sched in ENDED_BADLY:  # the scheduler ended it, no run
        return RunStatus(name, "failed", f"job {sched.lower()} before the run started", job)
    return RunStatus(name, state, detail, job)
