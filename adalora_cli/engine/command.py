"""``adalora train``'s work between parsing and printing: a new run, a resumed one, a dry run,
or either of the first two on ``--nproc`` local processes.

Every problem with the arguments is a :class:`ConfigError`, raised before anything is
written; the CLI's error boundary turns it into one line and exit code 2.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from ..config import ConfigError, RunConfig, load_config, resume_config
from ..rundir.layout import CONFIG

if TYPE_CHECKING:
    import torch

    from .dryrun import DryRun


@dataclass(frozen=True)
class TrainRequest:
    """``adalora train``'s arguments, as parsed."""

    config: str | None
    overrides: list[str] = field(default_factory=list)
    run_dir: Path | None = None
    resume: Path | None = None
    dry_run: bool = False
    quiet: bool = False
    nproc: int = 1
    argv: list[str] = field(default_factory=list)
    """The command's own arguments after ``train``: what ``--nproc`` starts on each rank."""


@dataclass(frozen=True)
class TrainOutcome:
    """What happened: exactly one field is set."""

    run_dir: Path | None = None
    """The run directory this process trained (one process, or a torchrun rank)."""
    dry_run: DryRun | None = None
    """``dryrun.dry_run``'s per-module table and totals."""
    exit_code: int | None = None
    """``--nproc N``: the first failing rank's exit code, 0 when all finished."""


def run_train(req: TrainRequest, note=lambda text: None) -> TrainOutcome:
    """Do what ``req`` asks; ``note`` receives remarks for the user (e.g. starting over)."""
    if req.nproc < 1:
        raise ConfigError(f"--nproc must be >= 1, got {req.nproc}")
    extra = list(req.overrides)
    if req.resume is not None:
        if req.run_dir is not None or req.dry_run:
            raise ConfigError("--resume continues an existing run: drop --run-dir and "
                              "--dry-run")
        if req.config is not None:  # `train --resume DIR key=value`: no config is taken
            if "=" not in req.config:
                raise ConfigError(f"--resume takes its config from {req.resume}; drop "
                                  f"{req.config!r} (only key=value overrides may follow)")
            extra.insert(0, req.config)
        from ..rundir.run import RunDir

        RunDir.check_claimable(req.resume)
        cfg = resume_config(req.resume / CONFIG, extra)
        # under --nproc before any rank starts (each would refuse only once built)
        check_resume(req.resume, cfg, req.nproc if req.nproc != 1 else
                     int(os.environ.get("WORLD_SIZE") or 1))
    else:
        if req.config is None:
            raise ConfigError("pass a config (adalora train configs/glue/rte.yaml) or "
                              "--resume RUN_DIR")
        cfg = load_config(req.config, extra)
        if req.dry_run:
            from .dryrun import dry_run

            return TrainOutcome(dry_run=dry_run(cfg))
    if req.nproc != 1:
        return TrainOutcome(exit_code=_launch_ranks(req.nproc, cfg, req.argv))
    if not req.quiet and os.environ.get("RANK", "0") == "0":
        from .header import opening, say

        say(opening(cfg, req.resume))  # before torch loads: seconds, not a silent minute
    from . import loop

    if req.resume is not None:
        return TrainOutcome(run_dir=loop.resume(req.resume, cfg, quiet=req.quiet, note=note))
    return TrainOutcome(run_dir=loop.train(cfg, req.run_dir, quiet=req.quiet))


def _launch_ranks(nproc: int, cfg: RunConfig, argv: list[str]) -> int:
    """``adalora train ... --nproc N``: the same command on N processes (one machine; for
    several machines call torchrun yourself with ``-m adalora_cli``)."""
    from . import sharding
    from .build import pick_device
    from .distributed import World, per_rank_batch
    from .launch import launch
    from .precision import decide

    if os.environ.get("WORLD_SIZE"):
        raise ConfigError("--nproc is for launching; under torchrun drop it (torchrun sets "
                          "the ranks)")
    w = World(0, nproc, 0)
    per_rank_batch(cfg.train.batch_size, w)  # refused before any launch
    device = pick_device(cfg.train.device)
    check_gpus(nproc, device)
    sharding.check(cfg, w, decide(cfg, device))
    args, skip = [], False
    for arg in argv:  # `adalora train ...` without --nproc N
        if skip:
            skip = False
        elif arg == "--nproc":
            skip = True
        elif not arg.startswith("--nproc="):
            args.append(arg)
    return launch(nproc, ["train", *args])


def check_resume(run: Path, cfg: RunConfig, processes: int) -> None:
    """Refuse a resume of ``run`` that its newest checkpoint cannot take on ``processes``
    processes under ``cfg``, naming the command that can.

    A sharded checkpoint resumes only sharded, on several processes (without ``--nproc``
    the FSDP check would suggest train.sharding=none, which that checkpoint refuses); a
    whole one only whole (``checkpoint.check_sharding``)."""
    from ..methods.registry import method_spec
    from .checkpoint import check_sharding, newest_readable

    # A method that saves the whole model never runs sharded, and its checkpoint (the model
    # and its optimizer state) is too large to read here only for the run to read it again.
    if method_spec(cfg.method.name).saves_whole_model:
        return
    found = newest_readable(run)  # damage is noted when the run reads it again
    if found is None:  # no checkpoint: the run starts over under whatever cfg says
        return
    path, state = found
    check_sharding(path, state, cfg, processes)


def check_gpus(nproc: int, device: torch.device) -> None:
    """On CUDA each rank takes the GPU of its local rank: more ranks than visible GPUs would
    fail in every extra rank with CUDA's "invalid device ordinal", so refuse it here."""
    if device.type != "cuda":
        return
    import torch  # noqa: F811  (the CLI's start-up stays free of torch until here)

    n = torch.cuda.device_count()
    if nproc > n:
        raise ConfigError(f"--nproc {nproc} needs one GPU per process but {n} "
                          f"GPU{'s are' if n != 1 else ' is'} visible; use --nproc {n}, or "
                          "train.device=cpu for CPU processes")
