"""A run on a GGUF base, end to end: it trains exactly as the same run on a checkpoint folder
holding the file's dequantized weights, records the file and its sha256, exports a merged
folder and a PEFT adapter whose base PEFT can load, predicts, and refuses a changed file."""

from __future__ import annotations

import hashlib
import json
import re
import shutil

import pytest
import torch
import yaml
from safetensors.torch import save_file
from transformers import AutoModelForCausalLM
from typer.testing import CliRunner

from adalora_cli.artifacts.export import export_run
from adalora_cli.artifacts.gguf_base import RECORD
from adalora_cli.artifacts.load import load_run
from adalora_cli.artifacts.predict import predict
from adalora_cli.cli import app
from adalora_cli.tasks.pretrained import from_pretrained
from tests.conftest import FIXTURES, copy_of
from tests.fixtures.make_tiny_gguf import dequantized_state

SMOKE = "configs/smoke/causal_lm.yaml"
IDS = torch.tensor([[0, 40, 17, 99, 3, 250, 5]])


@pytest.fixture(scope="module")
def twin(tiny_gguf, tmp_path_factory):
    """tiny-llama's folder with the GGUF file's dequantized weights: the same model, reached
    without the GGUF reader."""
    folder = tmp_path_factory.mktemp("twin") / "tiny-llama-q4_1"
    shutil.copytree(FIXTURES / "tiny-llama", folder)
    save_file(dequantized_state(tiny_gguf), str(folder / "model.safetensors"),
              metadata={"format": "pt"})
    return folder


@pytest.fixture(scope="module")
def gguf_run(smoke_runs, tiny_gguf):
    return smoke_runs(SMOKE, f"model.name_or_path={tiny_gguf}")


@pytest.fixture(scope="module")
def twin_run(smoke_runs, twin):
    return smoke_runs(SMOKE, f"model.name_or_path={twin}")


def _summary(run):
    return json.loads((run / "summary.json").read_text())


def _logits(model) -> torch.Tensor:
    with torch.no_grad():
        return model.eval()(IDS).logits


def test_a_gguf_run_trains_as_the_run_on_its_dequantized_weights(gguf_run, twin_run):
    assert _summary(gguf_run)["metrics"] == _summary(twin_run)["metrics"]
    assert ((gguf_run / "predictions.jsonl").read_text()
            == (twin_run / "predictions.jsonl").read_text())
    assert ((gguf_run / "adapter_model.safetensors").read_bytes()
            == (twin_run / "adapter_model.safetensors").read_bytes())


def test_the_run_records_the_file_and_its_sha256(gguf_run, twin_run, tiny_gguf):
    data = tiny_gguf.read_bytes()
    assert _summary(gguf_run)["export"]["base_gguf"] == {
        "file": str(tiny_gguf.resolve()), "sha256": hashlib.sha256(data).hexdigest(),
        "bytes": len(data)}
    assert "base_gguf" not in _summary(twin_run)["export"]  # only a GGUF base has one


def test_merged_export_is_a_plain_folder_with_the_runs_logits(gguf_run, tmp_path):
    info = export_run(gguf_run, "merged", tmp_path / "merged")
    assert info["merged_matrices"] == 14
    merged = AutoModelForCausalLM.from_pretrained(tmp_path / "merged", dtype=torch.float32)
    model, _, _ = load_run(gguf_run)
    assert torch.allclose(_logits(merged), _logits(model), atol=1e-5)
    assert "quantization_config" not in json.loads(
        (tmp_path / "merged/config.json").read_text())
    record = json.loads((tmp_path / "merged" / RECORD).read_text())
    assert record == {**_summary(gguf_run)["export"]["base_gguf"], "dequantized_to": "float32"}


def test_peft_export_names_a_dequantized_base_written_once(gguf_run, tiny_gguf, tmp_path,
                                                           monkeypatch):
    from peft import AutoPeftModelForCausalLM

    monkeypatch.setenv("ADALORA_CACHE", str(tmp_path / "cache"))
    notes: list[str] = []
    first = export_run(gguf_run, "peft", tmp_path / "a", note=notes.append)
    base = (tmp_path / "a/adapter_config.json").read_text()
    base = json.loads(base)["base_model_name_or_path"]
    sha = _summary(gguf_run)["export"]["base_gguf"]["sha256"]
    assert base == first["base_folder"] == str(
        tmp_path / "cache" / "gguf" / f"tiny-llama.Q4_1-{sha[:16]}")
    assert len(notes) == 1 and base in notes[0]
    # the base folder holds exactly what the run trained on
    plain = AutoModelForCausalLM.from_pretrained(base, dtype=torch.float32)
    dequantized = from_pretrained(AutoModelForCausalLM, str(tiny_gguf), torch.float32)
    assert torch.equal(_logits(plain), _logits(dequantized))
    # PEFT alone rebuilds the trained model from the export
    model, _, _ = load_run(gguf_run)
    peft_model = AutoPeftModelForCausalLM.from_pretrained(tmp_path / "a")
    assert torch.allclose(_logits(peft_model), _logits(model), atol=1e-5)
    # a second export reuses the folder: nothing written, nothing said
    written = (tmp_path / "cache").rglob("model.safetensors").__next__().stat().st_mtime_ns
    notes.clear()
    second = export_run(gguf_run, "peft", tmp_path / "b", note=notes.append)
    assert second["base_folder"] == base and notes == []
    assert next((tmp_path / "cache").rglob("model.safetensors")).stat().st_mtime_ns == written
    assert json.loads((tmp_path / "b" / RECORD).read_text())["base_folder"] == base


def test_predict_from_a_gguf_run_matches_its_twin(gguf_run, twin_run, tmp_path):
    rows = tmp_path / "in.jsonl"
    rows.write_text("".join(json.dumps({"prompt": f"Question: Which river runs through "
                                                  f"{town}?\nAnswer:"}) + "\n"
                            for town in ("Morden", "Arden", "Tenby")))
    assert predict(gguf_run, rows, tmp_path / "g.jsonl", quiet=True) == 3
    assert predict(twin_run, rows, tmp_path / "t.jsonl", quiet=True) == 3
    assert (tmp_path / "g.jsonl").read_text() == (tmp_path / "t.jsonl").read_text()
    assert all("response" in json.loads(line)
               for line in (tmp_path / "g.jsonl").read_text().splitlines())


def test_a_changed_gguf_file_is_refused(gguf_run, tiny_gguf, tmp_path):
    run = copy_of(gguf_run, tmp_path / "run")
    moved = tmp_path / "moved.gguf"
    data = bytearray(tiny_gguf.read_bytes())
    data[-1] ^= 0xFF  # one weight byte of the last tensor
    moved.write_bytes(bytes(data))
    config = yaml.safe_load((run / "config.yaml").read_text())
    config["model"]["name_or_path"] = str(moved)
    (run / "config.yaml").write_text(yaml.safe_dump(config, sort_keys=False))
    result = CliRunner().invoke(app, ["export", str(run), str(tmp_path / "out"),
                                      "--format", "merged"])
    assert result.exit_code == 2, result.output
    assert f"{moved} is not the GGUF file run {run} was trained on" in result.output
    assert "restore that file" in result.output and not (tmp_path / "out").exists()


HUB_REPO = "tiny-org/tiny-llama-GGUF"
COMMIT = "0123456789abcdef0123456789abcdef01234567"


@pytest.fixture(scope="module")
def hub_cache(tiny_gguf, tmp_path_factory):
    """A hub cache holding the GGUF file as ``hf_hub_download`` leaves it: the repo
    ``tiny-org/tiny-llama-GGUF`` at one commit, ``main`` pointing at it."""
    root = tmp_path_factory.mktemp("hub")
    repo = root / ("models--" + HUB_REPO.replace("/", "--"))
    (repo / "snapshots" / COMMIT).mkdir(parents=True)
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text(COMMIT)
    shutil.copy(tiny_gguf, repo / "snapshots" / COMMIT / tiny_gguf.name)
    return root


@pytest.fixture()
def offline_hub(hub_cache, monkeypatch):
    """The hub, offline, as this cache holds it (read where each download is asked for)."""
    import huggingface_hub.constants

    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(hub_cache))
    return hub_cache


@pytest.fixture(scope="module")
def hub_run(smoke_runs, hub_cache):
    """The smoke run on the GGUF file named as a hub repo and file, as a user names it."""
    import huggingface_hub.constants

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(hub_cache))
        return smoke_runs(SMOKE, f"model.name_or_path={HUB_REPO}",
                          "model.gguf_file=tiny-llama.Q4_1.gguf")


def test_a_run_keeps_the_hub_repo_its_gguf_file_came_from(hub_run, gguf_run):
    base = _summary(hub_run)["export"]["base_gguf"]
    assert {k: base[k] for k in ("repo", "revision", "filename")} == {
        "repo": HUB_REPO, "revision": COMMIT, "filename": "tiny-llama.Q4_1.gguf"}
    assert base["sha256"] == _summary(gguf_run)["export"]["base_gguf"]["sha256"]
    assert _summary(hub_run)["metrics"] == _summary(gguf_run)["metrics"]  # the same model


def test_peft_export_of_a_hub_gguf_run_names_the_repo_and_its_card_rebuilds_the_base(
        hub_run, offline_hub, tmp_path, monkeypatch):
    monkeypatch.setenv("ADALORA_CACHE", str(tmp_path / "cache"))
    info = export_run(hub_run, "peft", tmp_path / "peft")
    config = json.loads((tmp_path / "peft/adapter_config.json").read_text())
    assert (config["base_model_name_or_path"], config["revision"]) == (HUB_REPO, COMMIT)
    assert str(offline_hub) not in (tmp_path / "peft/adapter_config.json").read_text()
    assert "base_folder" not in info and not (tmp_path / "cache").exists()  # nothing written
    assert json.loads((tmp_path / "peft" / RECORD).read_text())["repo"] == HUB_REPO
    text = (tmp_path / "peft/README.md").read_text()
    assert f"base_model: {HUB_REPO}\n" in text.split("---")[1]
    assert f"from the hub repo `{HUB_REPO}` at commit `{COMMIT}`" in text
    assert "dequantized to float32" in text
    # the card's code, as written, rebuilds the base from the hub and gives the run's logits
    (code,) = re.findall(r"```python\n(.*?)```", text, flags=re.S)
    scope: dict = {}
    exec(compile(code, "README.md", "exec"), scope)  # noqa: S102 - our own card
    model, _, _ = load_run(hub_run)
    assert torch.allclose(_logits(scope["model"]), _logits(model), atol=1e-5)
    assert scope["tok"]("Answer:")["input_ids"]  # and the tokenizer, from the same file
