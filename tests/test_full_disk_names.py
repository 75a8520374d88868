"""A full disk, wherever it stops a command, is one line that names the file it could not
write (not a hidden temporary name, not a bare "[Errno 28]"), with the OS's error number
kept in the run's status; and what was being written is not left looking finished.

The disk is simulated at the writer each file goes through (Python's ``open``, safetensors,
matplotlib, torch.save), raising what each raises on a full disk."""

from __future__ import annotations

import errno
import json
import os
from pathlib import Path

import pytest
from typer.testing import CliRunner

from adalora_cli.cli import app
from tests.conftest import ROOT, copy_of

runner = CliRunner()
SMOKE = str(ROOT / "configs/smoke/glue.yaml")
NO_SPACE = f"{os.strerror(errno.ENOSPC)} (free some space)"


def enospc(*args, **kwargs):
    raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))


class FullFile:
    """A file opened on a full disk: opening works, no written byte ever reaches it."""

    def __init__(self, *args, **kwargs):
        self.closed = False

    def write(self, text):
        enospc()

    def flush(self):
        pass

    def close(self):
        self.closed = True

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


def _open_full_for(name: str):
    """``open`` that gives a FullFile for files called ``name``, the real file otherwise."""
    real = open

    def fake(file, *args, **kwargs):
        return FullFile() if Path(file).name == name else real(file, *args, **kwargs)
    return fake


def _safetensors_on_a_full_disk(*args, **kwargs):
    raise RuntimeError("Error while serializing: I/O error: No space left on device "
                       "(os error 28)")


def _savefig_on_a_full_disk(self, fname, *args, **kwargs):
    Path(fname).write_bytes(b"")
    enospc()


def _victim(monkeypatch, name: str) -> None:
    from adalora_cli.engine import outputs
    from adalora_cli.rundir import run as rundir

    if name == "metrics.jsonl":
        monkeypatch.setattr(rundir, "open", _open_full_for(name), raising=False)
    elif name == "adapter_model.safetensors":
        monkeypatch.setattr(outputs, "save_file", _safetensors_on_a_full_disk)
    elif name == "rank_heatmap.png":
        from matplotlib.figure import Figure

        monkeypatch.setattr(Figure, "savefig", _savefig_on_a_full_disk)


@pytest.mark.parametrize("name", ["metrics.jsonl", "adapter_model.safetensors",
                                  "rank_heatmap.png"])
def test_train_names_the_run_file(tmp_path, in_repo, monkeypatch, name) -> None:
    _victim(monkeypatch, name)
    run = tmp_path / "run"
    result = runner.invoke(app, ["train", SMOKE, "--run-dir", str(run), "-q"])
    assert result.exit_code == 1
    line = result.output.strip().splitlines()[-1]
    assert line == (f"error: could not write {run / name}: No space left on device (free some "
                    f"space, then resume the run) (run directory marked failed: {run})")
    status = json.loads((run / "status.json").read_text())
    assert status["status"] == "failed"
    assert status["error"].startswith(f"WriteFailed: [Errno 28] could not write {run / name}")
    assert not (run / "summary.json").exists()


def test_predict_names_the_output(smoke_runs, tmp_path, in_repo, monkeypatch) -> None:
    run = smoke_runs(SMOKE, "method.name=lora", "train.max_steps=2")
    out = tmp_path / "out.jsonl"
    real = Path.open
    monkeypatch.setattr(Path, "open", lambda self, *a, **k: (
        FullFile() if self.name == f".{out.name}.partial" else real(self, *a, **k)))
    result = runner.invoke(app, ["predict", str(run), "-q", "-i",
                                 str(ROOT / "tests/fixtures/glue/sst2/validation.jsonl"),
                                 "-o", str(out)])
    assert result.exit_code == 1
    assert result.output.strip() == f"error: could not write {out}: {NO_SPACE}"
    assert list(tmp_path.iterdir()) == []  # no output, no hidden partial file


def test_eval_and_export_name_what_they_write(smoke_runs, tmp_path, in_repo,
                                              monkeypatch) -> None:
    run = copy_of(smoke_runs(SMOKE, "method.name=lora", "train.max_steps=2"), tmp_path / "run")
    with monkeypatch.context() as patch:
        patch.setattr(Path, "write_text", enospc)
        result = runner.invoke(app, ["eval", str(run), "--quiet"])
    assert result.exit_code == 1
    assert result.output.strip().splitlines()[-1] == (
        f"error: could not write {run / 'eval' / 'default.json'}: {NO_SPACE}")
    assert list((run / "eval").iterdir()) == []
    from adalora_cli.artifacts import peft

    monkeypatch.setattr(peft, "save_file", _safetensors_on_a_full_disk)
    out = tmp_path / "export"
    result = runner.invoke(app, ["export", str(run), str(out), "--format", "peft"])
    assert result.exit_code == 1
    assert result.output.strip().splitlines()[-1] == f"error: could not write {out}: {NO_SPACE}"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["run"]


def test_the_sweep_log_is_named(tmp_path, monkeypatch) -> None:
    from adalora_cli.rundir.layout import SWEEP_LOG
    from adalora_cli.sweep import local

    monkeypatch.setattr(local, "open", _open_full_for(SWEEP_LOG), raising=False)
    with pytest.raises(OSError) as err:
        local.SweepLog(tmp_path).event("run-1", "started")
    assert err.value.errno == errno.ENOSPC
    assert err.value.strerror == f"could not write {tmp_path / SWEEP_LOG}: {NO_SPACE}"
