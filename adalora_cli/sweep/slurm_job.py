"""What one SLURM array task runs: one sweep run's ``adalora train``, requeued on preemption.

submitit pickles a :class:`TrainJob` per run and calls it on the compute node. The call
decides from the run directory what to do (start, resume from the latest checkpoint, or
nothing when the run finished or lives elsewhere), exactly as the local launcher does, and
runs ``adalora train`` as a child process writing to ``logs/<run>.log``. Deciding from the
directory, not from how the job was started, is what makes every way back safe: submitit's
requeue, SLURM's own requeue of a preempted job, or a user re-running ``adalora sweep``.

Preemption and time limits: SLURM signals the job (``--signal=USR2@<signal_delay>``);
submitit calls :meth:`TrainJob.checkpoint`, which sends SIGTERM to the training process
(it checkpoints at the next step boundary and exits 75) and hands submitit the same job
back, so it is requeued and the new attempt resumes. The training process ignores USR2
itself: SLURM sends it to every process of the job, and its default action is to die.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from ..engine.launch import cli_command
from ..errors import EXIT_BUSY, EXIT_PREEMPTED, EXIT_PRUNED
from ..rundir.layout import SUBMITIT_DIR, SWEEP_LOGS
from ..rundir.owner import PARENT_ENV
from ..rundir.run import is_finished, is_pruned
from .plan import PlannedRun
from .runs import (
    SweepLog,
    claim_launch,
    clear_empty,
    last_error,
    release_launch,
)


class RunFailed(RuntimeError):
    """The training process failed; the message is its last error line."""


def train_command(run: PlannedRun, run_dir: Path, resume: bool, nproc: int = 1,
                  nodes: Nodes | None = None) -> list[str]:
    """``adalora train`` for this run; with ``nproc`` > 1 under torchrun, one rank a GPU;
    across ``nodes``, one torchrun agent a node, meeting at the first node's rendezvous."""
    # the adalora_cli this job unpickled, never one in the node's working directory
    if nodes is not None and nodes.count > 1:
        launcher = cli_command("train", torchrun=nodes.torchrun(nproc))
    else:
        launcher = cli_command("train", torchrun=["--standalone", f"--nproc_per_node={nproc}"]
                               if nproc > 1 else None)
    # No --quiet: writing to a log file, not a terminal, the run prints plain progress lines
    # (engine/progress.py), so the log shows how far it got while it runs.
    if resume:
        return [*launcher, "--resume", str(run_dir)]
    return [*launcher, str(run.config), *run.overrides, "--run-dir", str(run_dir)]


@dataclass(frozen=True)
class Nodes:
    """Where the torchrun agents of one multi-node run meet: every node's task of the job
    runs the same command, and the c10d rendezvous on the first node (the batch host, from
    which srun started the tasks) assigns the ranks."""

    count: int
    endpoint: str
    """``host:port`` of the rendezvous: the first node's address, a port from the job id."""
    run_id: str
    """The rendezvous id: the job's id and attempt, so a requeued job never meets the
    agents of its previous attempt."""

    def torchrun(self, nproc: int) -> list[str]:
        return [f"--nnodes={self.count}", f"--nproc_per_node={nproc}",
                "--rdzv_backend=c10d", f"--rdzv_endpoint={self.endpoint}",
                f"--rdzv_id={self.run_id}"]

    @classmethod
    def of_this_job(cls, count: int, env: Mapping[str, str] = os.environ) -> Nodes:
        """From the variables srun gives each task: the launching node's address
        (``SLURM_LAUNCH_NODE_IPADDR``: srun runs on the job's first node), the job id and
        its restart count."""
        job = env.get("SLURM_JOB_ID", "0")
        port = RDZV_PORTS[0] + int(job) % (RDZV_PORTS[1] - RDZV_PORTS[0]) if job.isdigit() \
            else RDZV_PORTS[0]
        host = env.get("SLURM_LAUNCH_NODE_IPADDR") or socket.gethostname()
        return cls(count, f"{host}:{port}", f"{job}.{env.get('SLURM_RESTART_COUNT', '0')}")


RDZV_PORTS = (29500, 31500)
"""The rendezvous port is taken in this range by job id, so two runs on one node differ."""


def _job_id() -> str:
    try:
        import submitit

        return str(submitit.JobEnvironment().job_id)
    except Exception:  # called outside a submitit job (a test, a debug call)
        return ""


def _usr_signal() -> signal.Signals:
    """The signal submitit's jobs are warned with (USR2 unless SUBMITIT_PREEMPT_SIGNAL)."""
    return getattr(signal, "SIG" + os.environ.get("SUBMITIT_PREEMPT_SIGNAL", "USR2"))


class TrainJob:
    """A picklable, checkpointable callable: submitit's unit of work for one run."""

    def __init__(self, run: PlannedRun, sweep_dir: Path, nproc: int = 1, nnodes: int = 1):
        self.run, self.sweep_dir, self.nproc = run, Path(sweep_dir).resolve(), nproc
        self.nnodes = nnodes
        """Nodes of the run: above 1 every node's task of the job calls this job, and the
        first node's decides for all (:meth:`_other_node`)."""
        self.cwd = Path.cwd()  # configs and model paths may be relative to where we submit
        self._proc: subprocess.Popen | None = None

    def __getstate__(self) -> dict:
        return {**self.__dict__, "_proc": None}  # a process does not travel

    @property
    def run_dir(self) -> Path:
        return self.sweep_dir / self.run.name

    def __call__(self) -> dict:
        nodes = Nodes.of_this_job(self.nnodes) if self.nnodes > 1 else None
        if nodes is not None and os.environ.get("SLURM_NODEID", "0") != "0":
            return self._other_node(nodes)
        log = SweepLog(self.sweep_dir)
        state = claim_launch(self.run_dir)
        if state is None:  # finished meanwhile, or another process runs it
            status = ("skipped" if is_finished(self.run_dir) else
                      "pruned" if is_pruned(self.run_dir) else "busy")
            log.event(self.run.name, status, job=_job_id())
            self._hand_over(nodes, None)
            return {"status": status}
        start = time.perf_counter()
        try:
            if state == "empty":
                clear_empty(self.run_dir)
            resume = state == "unfinished"
            log.event(self.run.name, "resumed" if resume else "started", job=_job_id(),
                      host=socket.gethostname())
            cmd = train_command(self.run, self.run_dir, resume, self.nproc, nodes)
            self._hand_over(nodes, cmd)
            self._proc = self._start(cmd)
            code = self._wait()
        finally:
            release_launch(self.run_dir)
        return self._outcome(code, round(time.perf_counter() - start, 1), log)

    def _handover_file(self, nodes: Nodes) -> Path:
        return self.sweep_dir / SUBMITIT_DIR / f"{self.run.name}.{nodes.run_id}.command.json"

    def _hand_over(self, nodes: Nodes | None, cmd: list[str] | None) -> None:
        """The first node's decision for the others of a multi-node run: the command
        (start or resume) every node runs, or None when there is nothing to run."""
        if nodes is None:
            return
        path = self._handover_file(nodes)
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps({"command": cmd}))
        os.replace(tmp, path)  # whole or absent: the other nodes poll for it

    def _other_node(self, nodes: Nodes, patience: float = 600.0) -> dict:
        """A node after the first of a multi-node run: no claim, no events of its own; it
        runs the first node's command (its torchrun agent joins the rendezvous), whose
        exit the first node's agent reports for the run."""
        path, deadline = self._handover_file(nodes), time.monotonic() + patience
        while not path.exists():
            if time.monotonic() > deadline:
                raise RunFailed(f"{self.run.name}: the job's first node decided nothing in "
                                f"{patience:.0f} s (no {path.name})")
            time.sleep(0.5)
        cmd = json.loads(path.read_text())["command"]
        if cmd is None:
            return {"status": "skipped"}
        self._proc = self._start(cmd)
        return {"status": f"node {os.environ.get('SLURM_NODEID')}", "exit": self._wait()}

    def _start(self, cmd: list[str]) -> subprocess.Popen:
        logfile = self.sweep_dir / SWEEP_LOGS / f"{self.run.name}.log"
        logfile.parent.mkdir(parents=True, exist_ok=True)
        usr = _usr_signal()
        with open(logfile, "a") as out:  # every attempt's output, one after the other
            out.write("$ " + " ".join(cmd) + "\n")
            out.flush()
            return subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, env=self.env(),
                                    cwd=self.cwd,
                                    preexec_fn=lambda: signal.signal(usr, signal.SIG_IGN))

    def env(self) -> dict[str, str]:
        """The training process's environment: it stops (with a checkpoint) if this job
        dies. Not under torchrun: there the ranks' parent is torchrun, not this process,
        and the job step's end stops them all anyway."""
        env = dict(os.environ)
        if self.nproc == 1 and self.nnodes == 1:
            env[PARENT_ENV] = str(os.getpid())
        else:
            env.pop(PARENT_ENV, None)
        return env

    def _wait(self) -> int:
        # Poll, not Popen.wait(): submitit's signal handler runs on this thread and reaps
        # the child itself (see checkpoint); a blocking wait would hold Popen's lock.
        assert self._proc is not None
        while self._proc.poll() is None:
            time.sleep(0.5)
        return self._proc.returncode

    def _outcome(self, code: int, seconds: float, log: SweepLog) -> dict:
        if code == 0 and is_finished(self.run_dir):
            log.event(self.run.name, "finished", seconds=seconds, job=_job_id())
            return {"status": "finished", "seconds": seconds}
        if code == EXIT_BUSY:
            log.event(self.run.name, "busy", job=_job_id())
            return {"status": "busy"}
        if code == EXIT_PRUNED:  # a tune trial its study stopped: an end, not a failure
            log.event(self.run.name, "pruned", seconds=seconds, job=_job_id())
            return {"status": "pruned", "seconds": seconds}
        if code == EXIT_PREEMPTED:  # the scheduler signalled the training process itself
            log.event(self.run.name, "preempted", seconds=seconds, job=_job_id())
            return {"status": "preempted", "seconds": seconds}
        error = f"exit {code}: {last_error(self.sweep_dir / SWEEP_LOGS / f'{self.run.name}.log')}"
        log.event(self.run.name, "failed", seconds=seconds, error=error, job=_job_id())
        raise RunFailed(f"{self.run.name}: {error}")

    def checkpoint(self):
        """submitit's preemption / time-limit hook: stop the training process with a
        checkpoint, then give submitit this job again to requeue (it resumes)."""
        from submitit.helpers import DelayedSubmission

        code = self._stop_child()
        SweepLog(self.sweep_dir).event(self.run.name, "requeued", exit=code, job=_job_id())
        release_launch(self.run_dir)
        return DelayedSubmission(TrainJob(self.run, self.sweep_dir, self.nproc, self.nnodes))

    def _stop_child(self) -> int | None:
        proc = self._proc
        if proc is None or proc.returncode is not None:
            return None if proc is None else proc.returncode
        proc.send_signal(signal.SIGTERM)  # the run checkpoints at its next step boundary
        try:
            _, status = os.waitpid(proc.pid, 0)
        except ChildProcessError:  # reaped by a poll() this handler interrupted
            return proc.returncode
        proc.returncode = os.waitstatus_to_exitcode(status)
        return proc.returncode
