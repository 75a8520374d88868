"""A run directory that came from elsewhere cannot run code: a pickle planted in any file a
resume, eval, export, predict or report reads is refused in one line, and its payload never
runs (rundir/no_code.py).

Each payload, if it ever ran, would create a marker file; every test checks that the marker
is absent, besides the exit code and the one line."""

from __future__ import annotations

import io
import json
import os
import pickle
import random
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch
from typer.testing import CliRunner

from adalora_cli.engine import checkpoint as ckpt
from adalora_cli.rundir.no_code import (
    PlantedCode,
    dcp_reader,
    load_tensors,
    read_dcp_metadata,
)
from tests.conftest import ROOT, copy_of

SST2 = ROOT / "tests" / "fixtures" / "glue" / "sst2" / "validation.jsonl"


class Payload:
    """Unpickling this runs ``touch <marker>`` through os.system."""

    def __init__(self, marker: Path):
        self.marker = marker

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


def bare_pickle(marker: Path) -> bytes:
    return pickle.dumps({"format": 3, "step": 1, "x": Payload(marker)})


def torch_pickle(marker: Path) -> bytes:
    """The payload inside a real torch zip file beside real tensors, as a tampered
    ``state.pt`` would be."""
    buf = io.BytesIO()
    torch.save({"format": 3, "weights": torch.ones(2), "x": Payload(marker)}, buf)
    return buf.getvalue()


PAYLOADS = {"bare": bare_pickle, "torch": torch_pickle}


def invoke(*args: str):
    from adalora_cli.cli import app

    return CliRunner().invoke(app, list(args))


def one_refusal(result, marker: Path) -> str:
    """The command refused in one line (exit 2), without a traceback, and ran nothing."""
    assert not marker.exists(), "the planted payload ran"
    assert result.exit_code == 2, result.output
    assert "Traceback" not in result.output, result.output
    lines = [x for x in result.output.splitlines() if x.strip()]
    errors = [x for x in lines if x.startswith("error:")]
    assert len(errors) == 1, result.output
    return errors[0]


# ------------------------------------------------------------------ the readers themselves
@pytest.mark.parametrize("kind", sorted(PAYLOADS))
def test_load_tensors_refuses_a_payload_and_names_it(tmp_path, kind):
    marker, file = tmp_path / "ran", tmp_path / "state.pt"
    file.write_bytes(PAYLOADS[kind](marker))
    with pytest.raises(PlantedCode, match=r"refused to load .*state\.pt: it names "
                                          r"(posix|os|nt)\.system"):
        load_tensors(file)
    assert not marker.exists()
    with pytest.raises(PlantedCode):  # allowing numpy's arrays allows nothing else
        load_tensors(file, numpy_arrays=True)
    assert not marker.exists()


def test_load_tensors_reads_tensors_and_plain_values(tmp_path):
    saved = {"w": torch.arange(6.0).reshape(2, 3), "n": 3, "s": "fp32", "t": (1, None)}
    torch.save(saved, tmp_path / "ok.pt")
    back = load_tensors(tmp_path / "ok.pt")
    assert torch.equal(back["w"], saved["w"]) and back["n"] == 3 and back["t"] == (1, None)


def test_numpy_state_survives_a_weights_only_round_trip(tmp_path):
    """Format 3 keeps numpy's state as a tensor and numbers: saved, loaded weights-only and
    restored, numpy draws exactly what it would have drawn."""
    np.random.seed(1234)
    np.random.rand(7)  # part-way into the key stream
    np.random.standard_normal()  # with a cached Gaussian
    state = ckpt.rng_state()
    expected = (np.random.rand(5), np.random.standard_normal(), random.random())
    torch.save({"rng": [state]}, tmp_path / "s.pt")
    np.random.seed(0)
    random.seed(0)
    ckpt.set_rng_state(load_tensors(tmp_path / "s.pt")["rng"][0])
    got = (np.random.rand(5), np.random.standard_normal(), random.random())
    assert np.array_equal(got[0], expected[0]) and got[1:] == expected[1:]


def _checkpoint(folder: Path, state: dict) -> Path:
    folder.mkdir(parents=True)
    torch.save(state, folder / ckpt.STATE)
    from safetensors.torch import save_file

    save_file({"w": torch.ones(2)}, str(folder / ckpt.TENSORS))
    return folder


def test_a_format_2_checkpoint_is_read_weights_only_and_converted(tmp_path):
    """Format 2 kept numpy's state as an array: read with numpy's array constructor allowed
    (and nothing else), and converted so that the resumed draws are the same."""
    np.random.seed(7)
    old = {"python": random.getstate(), "numpy": np.random.get_state(),
           "torch": torch.get_rng_state()}
    expected = np.random.rand(4)
    path = _checkpoint(tmp_path / "step-0000004", {"format": 2, "step": 4, "rng": [old]})
    _, state = ckpt.load_checkpoint(path)
    assert state["format"] == ckpt.FORMAT == 3
    assert state["rng"][0]["numpy"]["keys"].dtype == torch.int64
    np.random.seed(0)
    ckpt.set_rng_state(state["rng"][0])
    assert np.array_equal(np.random.rand(4), expected)


def test_a_format_2_checkpoint_with_a_payload_is_refused(tmp_path):
    marker = tmp_path / "ran"
    np.random.seed(7)
    old = {"python": random.getstate(), "numpy": np.random.get_state(),
           "torch": torch.get_rng_state(), "x": Payload(marker)}
    path = _checkpoint(tmp_path / "step-0000004", {"format": 2, "step": 4, "rng": [old]})
    with pytest.raises(PlantedCode):
        ckpt.load_checkpoint(path)
    assert not marker.exists()


def test_cuda_rng_states_of_more_gpus_than_are_visible_restore_what_exists(monkeypatch):
    """A checkpoint written where 2 GPUs were visible, resumed where 1 is: device 0 gets its
    state back and the second state is dropped (torch's set_rng_state_all would index a
    device that does not exist)."""
    calls = []
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    monkeypatch.setattr(torch.cuda, "set_rng_state", lambda s, i: calls.append((s, i)))
    state = ckpt.rng_state()
    gpu0, gpu1 = torch.full((16,), 1, dtype=torch.uint8), torch.full((16,), 2, dtype=torch.uint8)
    ckpt.set_rng_state({**state, "cuda": [gpu0, gpu1]})
    assert len(calls) == 1 and calls[0][1] == 0 and torch.equal(calls[0][0], gpu0)


# ------------------------------------------------------------------ DCP's index (sharded runs)
def _dcp_folder(folder: Path) -> dict:
    import torch.distributed.checkpoint as dcp

    state = {"model": {"a.weight": torch.arange(12.0).reshape(3, 4)},
             "optim": {"param_groups": [{"lr": 0.5, "betas": (0.9, 0.99)}]}}
    dcp.save(state, checkpoint_id=str(folder), no_dist=True)
    return state


def test_dcp_index_reads_through_the_restricted_unpickler(tmp_path):
    import torch.distributed.checkpoint as dcp

    saved = _dcp_folder(tmp_path / "sharded")
    meta = read_dcp_metadata(tmp_path / "sharded")
    assert "model.a.weight" in meta.state_dict_metadata
    target = {"model": {"a.weight": torch.zeros(3, 4)},
              "optim": {"param_groups": [{"lr": 0.0, "betas": (0.0, 0.0)}]}}
    dcp.load(target, storage_reader=dcp_reader(tmp_path / "sharded"), no_dist=True)
    assert torch.equal(target["model"]["a.weight"], saved["model"]["a.weight"])
    assert target["optim"]["param_groups"][0]["lr"] == 0.5


def test_dcp_index_with_a_payload_is_refused_by_every_reader(tmp_path):
    import torch.distributed.checkpoint as dcp

    marker = tmp_path / "ran"
    folder = tmp_path / "step-0000004" / "sharded"
    _dcp_folder(folder)
    (folder / ".metadata").write_bytes(bare_pickle(marker))
    with pytest.raises(PlantedCode, match=r"sharded/\.metadata: it names (posix|os)\.system"):
        read_dcp_metadata(folder)
    target = {"model": {"a.weight": torch.zeros(3, 4)}}
    from torch.distributed.checkpoint.api import CheckpointException

    with pytest.raises(CheckpointException) as refused:  # DCP wraps each rank's error
        dcp.load(target, storage_reader=dcp_reader(folder), no_dist=True)
    assert "refused to load" in str(refused.value.failures[0][0])
    # a sharded checkpoint's state.pt is fine; its index is not: the checkpoint is refused
    torch.save({"format": 3, "step": 4, "sharding": "fsdp", "rng": []},
               folder.parent / ckpt.STATE)
    with pytest.raises(PlantedCode):
        ckpt.load_checkpoint(folder.parent)
    assert not marker.exists()


# ------------------------------------------------------------------ as a user meets them
@pytest.fixture(scope="module")
def stopped(tmp_path_factory):
    """A run stopped by SIGTERM at step 10 with checkpoints at steps 8 and 10."""
    run = tmp_path_factory.mktemp("stopped") / "run"
    with pytest.MonkeyPatch.context() as mp:
        mp.chdir(ROOT)
        mp.setenv("ADALORA_FAULT", "term@midstep=10")
        result = invoke("train", "configs/smoke/glue.yaml", "--run-dir", str(run), "--quiet",
                        "train.save_every=4", "train.keep_checkpoints=2")
    assert result.exit_code == 75, result.output
    assert [p.name for p in ckpt.checkpoints(run)] == ["step-0000008", "step-0000010"]
    return run


@pytest.mark.parametrize("kind", sorted(PAYLOADS))
def test_resume_refuses_a_planted_state_and_keeps_the_older_checkpoint_unused(
        stopped, tmp_path, kind):
    run = copy_of(stopped, tmp_path / "run")
    marker = tmp_path / "ran"
    (run / "checkpoints" / "step-0000010" / "state.pt").write_bytes(PAYLOADS[kind](marker))
    result = invoke("train", "--resume", str(run), "--quiet")
    line = one_refusal(result, marker)
    assert "step-0000010/state.pt" in line and "system" in line
    # refused, not passed over for step 8 as a damaged file would be: nothing was trained
    assert json.loads((run / "status.json").read_text())["status"] != "finished"
    assert not (run / "summary.json").exists()


def test_resume_refuses_a_python_tag_in_config_yaml(stopped, tmp_path):
    run = copy_of(stopped, tmp_path / "run")
    marker = tmp_path / "ran"
    (run / "config.yaml").write_text(
        f"task: !!python/object/apply:os.system ['touch {marker}']\n")
    one_refusal(invoke("train", "--resume", str(run), "--quiet"), marker)


@pytest.fixture(scope="module")
def finished(smoke_runs):
    return smoke_runs("configs/smoke/glue.yaml")


def _commands(run: Path, tmp: Path) -> dict[str, list[str]]:
    return {"eval": ["eval", str(run), "--quiet"],
            "export-peft": ["export", str(run), str(tmp / "peft"), "--format", "peft"],
            "export-merged": ["export", str(run), str(tmp / "merged"), "--format", "merged"],
            "predict": ["predict", str(run), "--input", str(SST2),
                        "--output", str(tmp / "p.jsonl")]}


# (file, commands that read it)
READ_BY = [("adapter_model.safetensors", ["eval", "export-peft", "export-merged", "predict"]),
           ("allocator_state.pt", ["export-peft"]),
           ("config.yaml", ["eval", "export-peft", "export-merged", "predict"])]


@pytest.mark.parametrize("name,commands", READ_BY, ids=[f for f, _ in READ_BY])
def test_a_finished_run_file_with_a_payload_is_refused_by_every_reader(
        finished, tmp_path, name, commands):
    for command in commands:
        run = copy_of(finished, tmp_path / command / "run")
        marker = tmp_path / command / "ran"
        if name == "config.yaml":  # YAML's own way to call a function
            (run / name).write_text(f"task: !!python/object/apply:os.system ['touch {marker}']\n")
        else:
            (run / name).write_bytes(torch_pickle(marker))
        result = invoke(*_commands(run, tmp_path / command)[command])
        line = one_refusal(result, marker)
        assert name in line, (command, line)
        assert not (tmp_path / command / "peft").exists()
        assert not (tmp_path / command / "merged").exists()


@pytest.mark.parametrize("name", ["summary.json", "status.json", "metrics.jsonl",
                                  "rank_pattern.json", "config.yaml"])
def test_report_over_a_run_with_a_planted_file_runs_nothing_and_says_which(
        finished, tmp_path, name):
    runs = tmp_path / "runs"
    run = copy_of(finished, runs / "planted")
    copy_of(finished, runs / "clean")
    marker = tmp_path / "ran"
    if name == "config.yaml":
        (run / name).write_text(f"task: !!python/object/apply:os.system ['touch {marker}']\n")
    else:
        (run / name).write_bytes(bare_pickle(marker))
    result = invoke("report", str(runs))
    assert not marker.exists()
    assert "Traceback" not in result.output, result.output
    assert result.exit_code in (0, 2), result.output
    # the clean run is still reported, or the refusal names the planted file
    assert "clean" in result.output or name in result.output, result.output


def test_a_full_models_weights_replaced_by_a_pickle_are_refused(smoke_runs, tmp_path):
    run = copy_of(smoke_runs("configs/smoke/glue.yaml", "method.name=full"), tmp_path / "run")
    marker = tmp_path / "ran"
    model = run / "model"
    for f in model.glob("*.safetensors"):
        f.unlink()
    (model / "pytorch_model.bin").write_bytes(torch_pickle(marker))
    result = invoke("eval", str(run), "--quiet")
    assert not marker.exists()
    assert result.exit_code in (1, 2) and "Traceback" not in result.output, result.output
    shutil.rmtree(run)
