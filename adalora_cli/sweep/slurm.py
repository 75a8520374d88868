"""The SLURM launcher: a sweep's missing runs as one submitit job array, one run a task.

``adalora sweep ... --launcher slurm --slurm partition=gpu,time=24:00:00`` looks at every
run (:mod:`adalora_cli.sweep.status`), submits those not finished, running or queued as
one array (``sweep_dir/slurm/`` holds submitit's pickles and the jobs' stdout/stderr,
``sweep_dir/logs/<run>.log`` each run's training output, as with the local launcher),
records the job ids in ``slurm_jobs.json`` and returns; ``--wait`` blocks until the jobs
end. Re-running it submits only what is still missing; a run whose recorded job may still
be queued, where neither sacct nor squeue can tell, is submitted again only with
``--resubmit``.

``cluster="local"`` runs the very same code path through submitit's local executor
(processes on this machine instead of sbatch): the tests use it, and so can a workstation.
"""

from __future__ import annotations

import contextlib
import io
import shutil
import socket
import time
from datetime import datetime, timezone
from pathlib import Path

from ..config import ConfigError
from ..rundir.layout import SUBMITIT_DIR, SWEEP_LOGS
from ..rundir.owner import identity
from .plan import PlannedRun, SweepSpec
from .runs import Outcome, SweepLog, write_manifest
from .scheduler import UNKNOWN, ask
from .slurm_job import TrainJob
from .slurm_options import SlurmOptions, executor_parameters, sbatch_refusal
from .status import (
    ACTIVE,
    QUEUED,
    RESUBMIT,
    UNKNOWN_STATE,
    RunStatus,
    read_records,
    sweep_states,
    write_records,
)


def _submitit():
    try:
        import submitit
    except ImportError:
        raise ConfigError("--launcher slurm needs the submitit package: run `make install`, "
                          "or `pip install -e '.[slurm]'` in the adalora checkout") from None
    return submitit


def make_executor(folder: Path, opts: SlurmOptions, job_name: str, cluster: str = "slurm"):
    """submitit's executor for these options: SLURM (sbatch), or its local executor."""
    submitit = _submitit()
    if cluster == "local":
        executor = submitit.LocalExecutor(folder, max_num_timeout=opts.requeues)
        executor.update_parameters(timeout_min=opts.time_min, gpus_per_node=opts.gpus_per_job,
                                   tasks_per_node=1, signal_delay_s=opts.signal_delay)
        return executor
    executor = submitit.SlurmExecutor(folder, max_num_timeout=opts.requeues)
    executor.update_parameters(**executor_parameters(opts, job_name))
    return executor


class SlurmLauncher:
    name = "slurm"

    def __init__(self, options: SlurmOptions, cluster: str = "slurm", wait: bool = False,
                 poll_seconds: float = 5.0, resubmit: bool = False):
        self.options, self.cluster, self.wait = options, cluster, wait
        self.poll_seconds = poll_seconds
        self.resubmit = resubmit
        """Also submit runs whose recorded job may still be queued (state unknown)."""

    @property
    def processes_per_run(self) -> int:
        """One per GPU of each node of the run's job (torchrun ranks), or one a node on a
        CPU-only job."""
        return self.options.nodes * self._per_node

    @property
    def _per_node(self) -> int:
        return max(1, self.options.gpus_per_job)

    def launch(self, spec: SweepSpec, runs: list[PlannedRun], sweep_dir: Path,
               quiet: bool = True) -> list[Outcome]:
        """Submit what is missing; one outcome per run: 'submitted' (now), or its state
        (queued, running, finished, failed...) when it needed no job; with ``wait``, each
        submitted run's final state."""
        self._check_cluster()  # before anything is written
        sweep_dir = sweep_dir.resolve()
        (sweep_dir / SWEEP_LOGS).mkdir(parents=True, exist_ok=True)
        write_manifest(spec, runs, sweep_dir)
        before = {s.run: s for s in sweep_states(runs, sweep_dir)}
        again = RESUBMIT + ((UNKNOWN_STATE,) if self.resubmit else ())
        todo = [r for r in runs if before[r.name].state in again]
        jobs = self._submit(spec, todo, sweep_dir) if todo else {}
        if self.wait and jobs:
            self._wait(jobs, sweep_dir)
        after = {s.run: s for s in sweep_states(runs, sweep_dir)} if self.wait else {}
        outcomes = []
        for run in runs:
            if run.name in after:
                status = after[run.name]
            elif run.name in jobs:
                job_id = str(jobs[run.name].job_id)
                status = RunStatus(run.name, "submitted", f"job {job_id}", job_id,
                                   before[run.name].source)
            else:
                status = before[run.name]
            outcomes.append(Outcome(run, status.state, error=status.detail, job=status.job,
                                    source=status.source))
        return outcomes

    def _check_cluster(self) -> None:
        _submitit()
        if self.cluster == "slurm" and shutil.which("srun") is None:
            raise ConfigError("--launcher slurm: no SLURM here (srun not found); submit from "
                              "the cluster's login node, or drop --launcher slurm to run "
                              "locally")

    def _submit(self, spec: SweepSpec, todo: list[PlannedRun], sweep_dir: Path) -> dict:
        executor = make_executor(sweep_dir / SUBMITIT_DIR, self.options,
                                 f"adalora-{spec.name}", self.cluster)
        nproc, nnodes = self._per_node, self.options.nodes
        try:
            # submitit prints sbatch's stderr itself when sbatch fails; said here in one line
            with contextlib.redirect_stderr(io.StringIO()), executor.batch():  # one array
                pending = [executor.submit(TrainJob(run, sweep_dir, nproc, nnodes))
                           for run in todo]
        except Exception as err:
            refused = sbatch_refusal(err, self.options)
            if refused is None:
                raise
            raise refused from None
        jobs = {run.name: job for run, job in zip(todo, pending)}
        self._record(jobs, sweep_dir)
        return jobs

    def _record(self, jobs: dict, sweep_dir: Path) -> None:
        records, log = read_records(sweep_dir), SweepLog(sweep_dir)
        now = datetime.now(timezone.utc).isoformat(timespec="seconds")
        for name, job in jobs.items():
            row = {"job_id": str(job.job_id), "cluster": self.cluster, "submitted": now}
            if self.cluster == "local":  # the job id is its controller's pid on this host
                row.update({k: v for k, v in identity(int(job.job_id)).items() if k != "pid"})
                row["host"] = socket.gethostname()
            records[name] = row
            log.event(name, "submitted", job=str(job.job_id), cluster=self.cluster)
        write_records(sweep_dir, records)

    def _wait(self, jobs: dict, sweep_dir: Path) -> None:
        """Until every job has left the queue. Not submitit's ``job.done()``: that waits for
        a result file, which a cancelled or killed job never writes, and asks sacct, which
        a cluster without accounting refuses at every poll."""
        records = {run: row for run, row in read_records(sweep_dir).items() if run in jobs}
        while True:
            states = ask(sweep_dir, records).states
            waiting = [run for run, job in jobs.items()
                       if states.get(run) in QUEUED | ACTIVE
                       or (states.get(run) == UNKNOWN and not job.paths.result_pickle.exists())]
            if not waiting:
                return
            time.sleep(self.poll_seconds)
