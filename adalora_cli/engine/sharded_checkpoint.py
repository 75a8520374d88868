"""Checkpoints of a sharded run (``train.sharding=fsdp``) through ``torch.distributed.checkpoint``.

Every process writes its own rows of the trained tensors and of the optimizer state into
``checkpoints/step-N/sharded/`` (DCP's ``__<rank>_0.distcp`` files and the ``.metadata``
index rank 0 writes); no process ever holds them whole. The index is a pickle, read back
by an unpickler that knows only DCP's own classes (rundir/no_code.py). Rank 0 writes
``state.pt`` beside them, with everything else a checkpoint keeps
(``checkpoint.state_of``: the allocator's state is already whole there), and publishes
the folder with one rename, as for a whole checkpoint (``checkpoint.publish``). The frozen
base is not saved: it is the pretrained model, loaded again on resume.

DCP records where each row belongs, not who wrote it, so a checkpoint written by N
processes loads on any number of processes (at least two: one process runs unsharded).
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import torch
from torch import nn

from ..errors import writing
from ..rundir.no_code import dcp_reader, read_dcp_metadata
from . import checkpoint as ckpt
from .distributed import World, broadcast


def _options(strict: bool = True):
    """Only what is trained: the frozen base is the pretrained model, loaded again (and so
    absent from what a load puts back: not strict there)."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions

    return StateDictOptions(ignore_frozen_params=True, strict=strict)


def _state(model: nn.Module, optimizer: torch.optim.Optimizer) -> dict[str, Any]:
    from torch.distributed.checkpoint.state_dict import get_state_dict

    tensors, optim = get_state_dict(model, optimizer, options=_options())
    return {"model": tensors, "optim": optim}


def save(run_path: Path, step: int, model: nn.Module, optimizer: torch.optim.Optimizer,
         state: dict[str, Any], keep: int, w: World) -> Path | None:
    """Every process: checkpoint ``step``. Returns its path on rank 0, None elsewhere."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.api import CheckpointException

    tmp = broadcast(ckpt.begin(run_path, step) if w.main else None, w)
    folder = Path(tmp) / ckpt.SHARDED
    final = Path(run_path) / ckpt.CHECKPOINTS / f"step-{step:07d}" / ckpt.SHARDED
    try:
        # a full disk is said as one line naming the folder (DCP's own error may hide the
        # OS's), on every rank, as for one process
        with writing(final, then="resume the run", written_as=folder, library=True):
            try:
                dcp.save(_state(model, optimizer), checkpoint_id=str(folder))
            except CheckpointException as err:
                raise first_failure(err) from None
    except BaseException:
        if w.main:  # nothing half-written is left, as a failed whole checkpoint leaves
            shutil.rmtree(tmp, ignore_errors=True)  # none (checkpoint.publish)
        raise
    if not w.main:
        return None

    def write(folder: Path, final: Path) -> None:
        ckpt.write_state(folder, final, step, state)

    return ckpt.publish(run_path, step, Path(tmp), write, keep)


def first_failure(err: BaseException) -> BaseException:
    """The lowest rank's own exception (an OSError for a full disk) out of DCP's
    CheckpointException, which gathers every rank's failure with its traceback into one
    BaseException (it passed the CLI's error boundary: pages of tracebacks, no one line)."""
    from torch.distributed.checkpoint.api import CheckpointException

    while isinstance(err, CheckpointException) and err.failures:
        err = err.failures[min(err.failures)][0]
    return err


def load(path: Path, model: nn.Module, optimizer: torch.optim.Optimizer) -> None:
    """Every process: put the trained tensors and the optimizer state of checkpoint
    ``path`` into the sharded model and its optimizer, whatever number of processes wrote
    it. The rest (``state.pt``) is restored by ``checkpoint.restore``."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import set_state_dict

    folder = path / ckpt.SHARDED
    state = _state(model, optimizer)
    saved = {key.removeprefix("model.") for key in
             read_dcp_metadata(folder).state_dict_metadata
             if key.startswith("model.")}
    unknown = sorted(saved - set(state["model"]))
    if unknown:  # DCP would load the tensors asked for and ignore these
        raise ValueError(f"{path} holds tensors this model lacks ({unknown[0]}); it was "
                         "written for another model or method")
    # DCP's own reader unpickles its index with pickle.load: ours allows its classes only
    dcp.load(state, storage_reader=dcp_reader(folder))
    set_state_dict(model, optimizer, model_state_dict=state["model"],
                   optim_state_dict=state["optim"], options=_options(strict=False))
