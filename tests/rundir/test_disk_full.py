"""A nearly full disk: the failure path marks the run failed without needing space it does
not have, leaves no stray files, and a checkpoint that cannot be written says which file
and why (a full disk, or the file size limit).

The full disk is simulated two ways: monkeypatched writes that raise ENOSPC, and a real
``RLIMIT_FSIZE`` (``ulimit -f``) in a forked child, where writes past the limit fail with
EFBIG (Python ignores SIGXFSZ, so the process is not killed).
"""

from __future__ import annotations

import errno
import os
import resource
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from adalora_cli.config import RunConfig
from adalora_cli.engine import checkpoint as ckpt
from adalora_cli.errors import WriteFailed
from adalora_cli.rundir import run as rundir
from adalora_cli.rundir.owner import Heartbeat
from adalora_cli.rundir.run import RunDir


def enospc(*args, **kwargs):
    raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))


class FullStream:
    """A log file whose buffered rows can no longer be flushed."""

    def write(self, text):
        return len(text)

    def flush(self):
        enospc()

    close = flush


def test_fail_marks_the_run_failed_when_the_disk_is_full(tmp_path, monkeypatch):
    run = RunDir.create(tmp_path / "run", RunConfig())
    run._metrics = FullStream()  # the failure handler's flush fails again
    monkeypatch.setattr(Path, "write_text", enospc)  # and no room for a new status copy
    run.fail("OSError: [Errno 28] No space left on device")
    monkeypatch.undo()
    status = RunDir.read_status(run.path)
    assert status["status"] == "failed" and "No space left" in status["error"]
    assert sorted(p.name for p in run.path.iterdir()) == [".lock", "config.yaml",
                                                          "status.json"]  # no stray copy


def test_fail_falls_back_to_a_short_status_in_place(tmp_path, monkeypatch):
    run = RunDir.create(tmp_path / "run", RunConfig())
    monkeypatch.setattr(rundir, "write_text_atomic", enospc)  # not even the in-place rewrite
    run.fail("x" * 1000)
    monkeypatch.undo()
    status = RunDir.read_status(run.path)
    assert status == {"status": "failed", "error": "x" * 200}


def test_a_config_that_cannot_be_written_leaves_a_failed_run(tmp_path, monkeypatch):
    real = rundir.write_text_atomic

    def no_room_for_config(path, text):
        if path.name == "config.yaml":
            enospc()
        real(path, text)

    monkeypatch.setattr(rundir, "write_text_atomic", no_room_for_config)
    with pytest.raises(OSError) as err:
        RunDir.create(tmp_path / "run", RunConfig())
    assert str(err.value) == (f"[Errno 28] could not write {tmp_path / 'run' / 'config.yaml'}: "
                              "No space left on device (free some space)")
    assert RunDir.read_status(tmp_path / "run")["status"] == "failed"


def test_a_heartbeat_that_cannot_be_written_leaves_no_temporary_file(tmp_path, monkeypatch):
    monkeypatch.setattr(os, "replace", enospc)
    Heartbeat(tmp_path).beat()
    monkeypatch.undo()
    assert list(tmp_path.iterdir()) == []


def _in_child_with_file_limit(limit: int, action) -> str:
    """``action()`` in a forked child under ``ulimit -f limit``; the error it raised."""
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(read)
        message = "no error"
        try:
            resource.setrlimit(resource.RLIMIT_FSIZE,
                               (limit, resource.getrlimit(resource.RLIMIT_FSIZE)[1]))
            action()
        except BaseException as err:  # the child reports whatever it got
            message = f"{type(err).__name__}: {err}"
        finally:
            os.write(write, message.encode())
            os._exit(0)
    os.close(write)
    chunks = []
    while chunk := os.read(read, 65536):
        chunks.append(chunk)
    os.close(read)
    os.waitpid(pid, 0)
    return b"".join(chunks).decode()


@pytest.mark.parametrize("big", ["tensors", "state"])
def test_a_checkpoint_past_the_file_size_limit_names_the_file(tmp_path, big):
    large = torch.zeros(256 * 1024)  # 1 MiB
    tensors = {"w": large if big == "tensors" else torch.zeros(2)}
    state = {"rng": [], "blob": large if big == "state" else None}
    message = _in_child_with_file_limit(
        64 * 1024, lambda: ckpt.save_checkpoint(tmp_path, 3, tensors, state, keep=1))
    name = ckpt.TENSORS if big == "tensors" else ckpt.STATE
    where = tmp_path / "checkpoints" / "step-0000003" / name
    assert message == (f"WriteFailed: [Errno 27] could not write {where}: the file size limit "
                       "(ulimit -f, 65536 bytes) was reached; raise it, then resume the run")
    assert list((tmp_path / "checkpoints").iterdir()) == []  # nothing half-written


def test_torchs_unexpected_pos_on_a_full_disk_is_said_plainly(tmp_path, monkeypatch):
    def torch_on_a_full_disk(obj, path):
        Path(path).write_bytes(b"PK")
        raise RuntimeError("[enforce fail at inline_container.cc:672] . unexpected pos 64 vs 0")

    monkeypatch.setattr(torch, "save", torch_on_a_full_disk)
    monkeypatch.setattr(os, "statvfs", lambda path: SimpleNamespace(f_bavail=2, f_frsize=4096))
    with pytest.raises(WriteFailed) as err:
        ckpt.save_checkpoint(tmp_path, 7, {"w": torch.zeros(2)}, {}, keep=1)
    where = tmp_path / "checkpoints" / "step-0000007" / ckpt.STATE
    assert str(err.value) == (f"[Errno 28] could not write {where}: No space left on device "
                              "(free some space, then resume the run)")
