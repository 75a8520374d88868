"""What the scheduler says about the jobs a sweep submitted, and which tool said it.

Jobs recorded in ``slurm_jobs.json`` are looked up, in this order:

- ``sacct`` (through submitit): every job, queued, running or long over; but clusters
  with accounting off have no ``sacct``, or one that refuses ("Slurm accounting storage
  is disabled"). sacct is asked once first, quietly: where it refuses, submitit is not
  asked at all (it would print sacct's error and its own "Bypassing sacct error" warning
  at every call), and the source line says why squeue answered instead;
- ``squeue``: jobs queued or running, which is what a re-submission must know (a job
  squeue does not list has ended, so its run may be submitted again), and, with
  ``--states=all``, those that ended within the controller's ``MinJobAge`` (300 s by
  default): a cancelled job is still seen as cancelled for that long;
- neither: nobody can say whether the job still waits in the queue. Such a run is
  ``UNKNOWN``, and a launcher leaves it alone unless asked (``--resubmit``): submitting it
  again could put a second job array in the queue for the same runs.

Jobs of submitit's local executor live as long as their controller process, which is
looked up directly.
"""

from __future__ import annotations

import getpass
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

from ..rundir.layout import SUBMITIT_DIR
from ..rundir.owner import process_alive

UNKNOWN = "?"
"""The state of a job no tool here can look up."""


@dataclass(frozen=True)
class SchedulerView:
    states: dict[str, str]
    """{run: the scheduler's state of its latest job}: a SLURM state word, '' when the
    scheduler has no live job for it, :data:`UNKNOWN` when nothing here can tell."""
    source: str
    """Which tool answered, in words (printed by ``--status``)."""


def ask(sweep_dir: Path, records: dict[str, dict]) -> SchedulerView:
    slurm = {run: r for run, r in records.items() if r.get("cluster") == "slurm"}
    states = {run: _local_state(r) for run, r in records.items() if r.get("cluster") == "local"}
    sources = ["local processes"] if states else []
    if not slurm:
        return SchedulerView(states, ", ".join(sources) or "none needed")
    sacct, refused = _sacct(sweep_dir, slurm)
    if sacct is not None:
        sources.append("sacct")
        states.update({run: s for run, s in sacct.items() if s})
    unanswered = {run: r for run, r in slurm.items() if run not in states}
    if unanswered:
        queue = _squeue()
        if queue is not None:
            sources.append(f"squeue ({refused})" if refused else "squeue")
            states.update({run: queue.get(str(r["job_id"]), "") for run, r in unanswered.items()})
        else:
            sources.append("none for SLURM jobs (no sacct or squeue answered)")
            states.update({run: UNKNOWN for run in unanswered})
    return SchedulerView(states, ", ".join(sources))


def _sacct(sweep_dir: Path, slurm: dict[str, dict]) -> tuple[dict[str, str] | None, str]:
    """({run: state} from sacct ('' where it knows nothing), ''); (None, why) without a
    sacct that answers."""
    if shutil.which("sacct") is None:
        return None, ""
    refused = _sacct_refusal(str(next(iter(slurm.values()))["job_id"]))
    if refused:
        return None, refused
    import submitit

    folder = sweep_dir / SUBMITIT_DIR
    jobs = {run: submitit.SlurmJob(folder=folder, job_id=str(r["job_id"]))
            for run, r in slurm.items()}  # registered together: one sacct call for all
    states = {}
    for run, job in jobs.items():
        try:
            state = str(job.state).split()[0].upper()
        except Exception:  # the job is too old for the accounting, or sacct failed
            state = ""
        # submitit says UNKNOWN when sacct failed or has no record (accounting off)
        states[run] = "" if state == "UNKNOWN" else state
    return states, ""


def _sacct_refusal(job_id: str) -> str:
    """'' when sacct answers for ``job_id``; else why not, in a few words."""
    try:
        done = subprocess.run(["sacct", "-n", "-X", "-o", "JobID", "-j", job_id.split("_")[0]],
                              capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.SubprocessError) as err:
        return f"sacct failed: {err}"
    if done.returncode == 0:
        return ""
    said = (done.stderr.strip() or done.stdout.strip()).splitlines()
    reason = said[-1] if said else f"exit {done.returncode}"
    return "sacct refused: " + reason.removeprefix("sacct: ").removeprefix("error: ")


def _squeue() -> dict[str, str] | None:
    """{job id: state} of this user's jobs the controller still holds (queued, running or
    recently ended), array tasks one by one (``-r``); None when squeue is missing or
    fails."""
    if shutil.which("squeue") is None:
        return None
    try:
        done = subprocess.run(["squeue", "-h", "-r", "-t", "all", "-u", getpass.getuser(),
                               "-o", "%i %T"],
                              capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.SubprocessError):
        return None
    if done.returncode != 0:
        return None
    table = {}
    for line in done.stdout.splitlines():
        job, _, state = line.strip().partition(" ")
        if job and state:
            table[job] = state.strip().split()[0].upper()
    return table


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
