"""How a planned sweep is run: one small protocol, two launchers.

- ``local`` (the default): today's pool of ``adalora train`` processes on this machine
  (:mod:`adalora_cli.sweep.local`), ``--jobs`` at once;
- ``slurm``: one submitit job array on a SLURM cluster, one run per array task
  (:mod:`adalora_cli.sweep.slurm`), shaped by ``--slurm key=value,...``.

Both start each run the same way (start, or resume from its checkpoint, decided by its run
directory), so a sweep can move between them: runs finished by one are skipped by the
other.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Protocol

from ..config import ConfigError
from .local import execute
from .plan import PlannedRun, SweepSpec
from .runs import Outcome

LAUNCHERS = ("local", "slurm")


class Launcher(Protocol):
    name: str
    processes_per_run: int
    """How many processes each run gets (several make it a torchrun of that many ranks)."""

    def launch(self, spec: SweepSpec, runs: list[PlannedRun], sweep_dir: Path,
               quiet: bool = False) -> list[Outcome]:
        """Run (or submit) what the sweep still needs; one outcome per planned run."""
        ...


class LocalLauncher:
    name = "local"
    processes_per_run = 1
    feeds = True
    """``launch`` takes ``then``: runs that join as others end (a tune's trials run
    without waiting for a round; SLURM's job arrays do wait for theirs)."""

    def __init__(self, jobs: int = 1):
        self.jobs = jobs

    def launch(self, spec: SweepSpec, runs: list[PlannedRun], sweep_dir: Path,
               quiet: bool = False,
               then: Callable[[Outcome], list[PlannedRun]] | None = None) -> list[Outcome]:
        return execute(spec, runs, sweep_dir, jobs=self.jobs, quiet=quiet, then=then)


def make_launcher(name: str, slurm: list[str] | None, jobs: int, wait: bool,
                  resubmit: bool = False) -> Launcher:
    """The launcher the command line asks for; one-line errors for combinations that
    mean nothing (``--slurm`` without ``--launcher slurm``, ``--jobs`` on SLURM)."""
    if name not in LAUNCHERS:
        raise ConfigError(f"unknown --launcher {name!r}; choose from {', '.join(LAUNCHERS)}")
    if name == "local":
        if slurm:
            raise ConfigError("--slurm sets SLURM job options: add --launcher slurm (or drop "
                              "--slurm to run on this machine)")
        if wait:
            raise ConfigError("--wait is for --launcher slurm (a local sweep always waits)")
        if resubmit:
            raise ConfigError("--resubmit is for --launcher slurm (a local sweep starts every "
                              "run that is not finished or running)")
        if jobs < 1:
            raise ConfigError(f"--jobs must be >= 1, got {jobs}")
        return LocalLauncher(jobs)
    if jobs != 1:
        raise ConfigError("--jobs is for the local launcher; on SLURM cap the runs at once "
                          "with --slurm parallel=N")
    from .slurm import SlurmLauncher
    from .slurm_options import parse_slurm

    return SlurmLauncher(parse_slurm(slurm or []), wait=wait, resubmit=resubmit)
