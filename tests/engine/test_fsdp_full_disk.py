"""A full disk while the ranks of a sharded run (``train.sharding=fsdp``) write a checkpoint
is said as for one process: one ``error:`` line naming the folder and the OS's error, exit
1, the run marked failed with that line, the previous checkpoint kept and resumable.

``torch.distributed.checkpoint`` gathers every rank's failure into one
``CheckpointException``, a BaseException whose message holds each rank's traceback: before,
it passed the error boundary, and a two-process run printed 232 lines of tracebacks and no
``error:`` line, its status.json saying ``CheckpointException ranks:dict_keys([0, 1])``.

The disk is full at DCP's file writer (every file it opens for checkpoint 8 is made, and no
byte reaches it), in ranks forked from this process, so they inherit the full disk."""

from __future__ import annotations

import errno
import io
import os
import socket
from contextlib import contextmanager
from pathlib import Path

import pytest
from torch.distributed.checkpoint.filesystem import FileSystem
from typer.testing import CliRunner

from adalora_cli.cli import app
from adalora_cli.engine.checkpoint import latest_checkpoint
from adalora_cli.rundir.run import RunDir

from .conftest import forked_ranks
from .test_fsdp_run import train_args

pytestmark = pytest.mark.e2e  # two ranks, forked


class FullDisk(io.RawIOBase):
    """A file opened on a full disk: opening works, no written byte ever reaches it."""

    def __init__(self, stream):
        self.stream = stream

    def writable(self) -> bool:
        return True

    def write(self, data) -> int:
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    def tell(self) -> int:
        return self.stream.tell()


def full_disk_at(step: int):
    """DCP's ``create_stream``, on a full disk for checkpoint ``step``'s files."""
    real = FileSystem.create_stream

    @contextmanager
    def create_stream(self, path, mode):
        if f".partial-step-{step:07d}-" not in str(path):
            with real(self, path, mode) as stream:
                yield stream
            return
        with Path(path).open(mode) as stream:
            yield FullDisk(stream)
    return create_stream


def ranks_said(args: list[str], folder: Path, nproc: int = 2) -> list[tuple[int, str]]:
    """``adalora ARGS`` as ``nproc`` ranks forked from this process (as ``forked_ranks``),
    each one's exit code and what it wrote to stderr."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    pids = []
    for rank in range(nproc):
        pid = os.fork()
        if pid == 0:  # the child: never returns into pytest
            code = 1
            try:
                os.environ.update(RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE=str(nproc),
                                  MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
                os.environ.pop("ADALORA_FAULT", None)
                result = CliRunner().invoke(app, args, catch_exceptions=False)
                (folder / f"rank{rank}.txt").write_text(result.stderr)
                code = result.exit_code
            finally:
                os._exit(code)
        pids.append(pid)
    codes = [os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]) for pid in pids]
    return [(code, (folder / f"rank{rank}.txt").read_text()
             if (folder / f"rank{rank}.txt").exists() else "<nothing: it crashed>")
            for rank, code in enumerate(codes)]


def test_a_full_disk_at_a_sharded_checkpoint_is_one_line(tmp_path, in_repo, warm,
                                                          monkeypatch):
    out = tmp_path / "run"
    monkeypatch.setattr(FileSystem, "create_stream", full_disk_at(8))
    said = ranks_said(train_args(out, "train.sharding=fsdp"), tmp_path)
    monkeypatch.undo()
    line = (f"could not write {out}/checkpoints/step-0000008/sharded: No space left on device "
            "(free some space, then resume the run)")
    # rank 0 speaks for the run, as under torchrun and --nproc; the launcher passes exit 1 on
    assert said == [(1, f"error: {line} (run directory marked failed: {out})\n"), (1, "")]
    status = RunDir.read_status(out)
    # as one process's: the line, after the OS's error number
    assert status["status"] == "failed"
    assert status["error"] == f"WriteFailed: [Errno {errno.ENOSPC}] {line}"
    assert latest_checkpoint(out).name == "step-0000004"  # the last good one stays usable
    assert not list((out / "checkpoints").glob(".partial-*"))  # nothing half-written left
    assert forked_ranks(["train", "--resume", str(out), "--quiet"]) == [0, 0]
    assert RunDir.read_status(out)["status"] == "finished"
