"""A run trained with ``train.save_weights=false`` says so when asked for its weights, and
what a run writes (weights, checkpoints, export folders) follows the user's umask, so a
collaborator on a shared filesystem can read a finished run."""

from __future__ import annotations

import os
import shutil
import stat
from pathlib import Path

import pytest
import torch
from typer.testing import CliRunner

from adalora_cli.cli import app
from adalora_cli.engine import checkpoint as ckpt

ROOT = Path(__file__).resolve().parents[2]
SHORT = ["configs/smoke/glue.yaml", "method.name=lora", "train.max_steps=4",
         "train.eval_every=null"]


def mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


@pytest.fixture()
def umask_022():
    old = os.umask(0o022)
    yield
    os.umask(old)


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """Two finished short LoRA runs: without and with weights."""
    root = tmp_path_factory.mktemp("runs")
    old = os.umask(0o022)
    try:
        with pytest.MonkeyPatch.context() as mp:
            mp.chdir(ROOT)
            for name, keep in (("none", "false"), ("kept", "true")):
                result = CliRunner().invoke(app, ["train", *SHORT, f"train.save_weights={keep}",
                                                  "--run-dir", str(root / name), "-q"])
                assert result.exit_code == 0, result.output
    finally:
        os.umask(old)
    return root


def test_export_eval_and_predict_say_the_run_saved_no_weights(trained, tmp_path, in_repo):
    run = trained / "none"
    rows = tmp_path / "in.jsonl"
    rows.write_text('{"sentence": "a fine film"}\n')
    expected = (f"error: run {run} was trained with train.save_weights=false, so it has no "
                "weights to load; train it again with train.save_weights=true")
    for args in (["export", str(run), str(tmp_path / "out")], ["eval", str(run), "-q"],
                 ["predict", str(run), "-i", str(rows), "-o", str(tmp_path / "p.jsonl")]):
        result = CliRunner().invoke(app, args, env={"COLUMNS": "400"})
        assert result.exit_code == 2, args
        assert result.output.strip() == expected, args
    assert not (tmp_path / "out").exists() and not (tmp_path / "p.jsonl").exists()


def test_a_deleted_weights_file_is_named(trained, tmp_path):
    from adalora_cli.artifacts.load import load_run
    from adalora_cli.config import ConfigError

    broken = tmp_path / "kept"
    shutil.copytree(trained / "kept", broken)
    (broken / "adapter_model.safetensors").unlink()
    with pytest.raises(ConfigError, match="has no adapter_model.safetensors"):
        load_run(broken)


def test_weights_and_exports_follow_the_umask(trained, tmp_path, in_repo, umask_022):
    run = trained / "kept"
    assert mode(run / "adapter_model.safetensors") == 0o644
    out = tmp_path / "peft"
    result = CliRunner().invoke(app, ["export", str(run), str(out), "--format", "peft"])
    assert result.exit_code == 0, result.output
    assert mode(out) == 0o755
    assert {p.name: mode(p) for p in out.iterdir()} == {
        p.name: 0o644 for p in out.iterdir()}


def test_checkpoints_follow_the_umask(tmp_path):
    old = os.umask(0o027)  # a group-readable setting: the group may read, others not
    try:
        path = ckpt.save_checkpoint(tmp_path, 1, {"w": torch.zeros(2)}, {"rng": []}, keep=1)
    finally:
        os.umask(old)
    assert {p.name: mode(p) for p in path.iterdir()} == {ckpt.TENSORS: 0o640,
                                                         ckpt.STATE: 0o640}


def test_a_run_without_its_summary_says_so(trained, tmp_path):
    """status.json says finished, summary.json is gone: not 'not a finished run (status:
    finished)'."""
    broken = tmp_path / "kept"
    shutil.copytree(trained / "kept", broken)
    (broken / "summary.json").unlink()
    for args in (["export", str(broken), str(tmp_path / "out")], ["eval", str(broken), "-q"]):
        result = CliRunner().invoke(app, args, env={"COLUMNS": "400"})
        assert result.exit_code == 2, args
        assert result.output.strip() == (f"error: {broken} says it finished but has no "
                                         "summary.json (deleted or moved?); restore it, or "
                                         "train the run again"), args
    (broken / "summary.json").write_text("{cut sho")
    result = CliRunner().invoke(app, ["export", str(broken), str(tmp_path / "out")])
    assert result.exit_code == 2
    assert result.output.strip().startswith(f"error: {broken / 'summary.json'} cannot be read (")
    assert not (tmp_path / "out").exists()


def test_a_truncated_weights_file_is_named(trained, tmp_path):
    broken = tmp_path / "kept"
    shutil.copytree(trained / "kept", broken)
    weights = broken / "adapter_model.safetensors"
    weights.write_bytes(weights.read_bytes()[:-100])  # the end of the tensor data is lost
    result = CliRunner().invoke(app, ["export", str(broken), str(tmp_path / "out")],
                                env={"COLUMNS": "400"})
    assert result.exit_code == 2
    assert result.output.strip() == (
        f"error: {weights} cannot be read (Error while deserializing header: incomplete "
        "metadata, file not fully covered): it is damaged or truncated; restore it, or train "
        "the run again")
    assert not (tmp_path / "out").exists()
