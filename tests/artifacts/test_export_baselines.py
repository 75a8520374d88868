"""``adalora export`` of today's baselines: rsLoRA, DoRA, PiSSA and LoRA+ as PEFT
``LoraConfig`` folders that PEFT alone loads with the run's logits, and merged exports of all
six that transformers alone loads.

Each run trains a few steps on the smoke config; its adapter is then amplified in the weights
file (B times 40; PiSSA's trained B minus its start, DoRA's magnitudes moved too) so that the
update moves the logits far more than the tolerances: a wrong scaling, sign or rank shows.
"""

from __future__ import annotations

import json
from pathlib import Path

import peft
import pytest
import torch
from safetensors.torch import load_file, save_file
from transformers import AutoModelForSequenceClassification, AutoTokenizer
from typer.testing import CliRunner

from adalora_cli.artifacts.load import load_run
from adalora_cli.cli import app
from tests.conftest import copy_of

ROOT = Path(__file__).resolve().parents[2]
TINY_BERT = str(ROOT / "tests/fixtures/tiny-bert")
SMOKE = "configs/smoke/glue.yaml"
STEPS = {"rslora": 4, "dora": 4, "pissa": 4, "loraplus": 4, "sora": 6, "increlora": 12}


def _amplify(run: Path) -> None:
    path = run / "adapter_model.safetensors"
    state = load_file(str(path))
    for name in list(state):
        if name.endswith(".B"):
            start = state.get(name.removesuffix(".B") + ".B0")
            # PiSSA: only the trained change B - B0 is amplified
            state[name] = state[name] * 40.0 if start is None else start + 40.0 * (
                state[name] - start) + 0.05
        elif name.endswith(".m"):
            state[name] = state[name] * torch.linspace(0.5, 1.5, state[name].numel())
        elif name.endswith((".P", ".lam")):
            state[name] = state[name] * 20.0
    save_file(state, str(path))


@pytest.fixture(scope="module")
def runs(smoke_runs, tmp_path_factory):
    root = tmp_path_factory.mktemp("baselines")
    out = {}
    for method, steps in STEPS.items():
        shared = smoke_runs(SMOKE, f"method.name={method}", f"train.max_steps={steps}",
                            "train.eval_every=null", "adalora.t_init=1", "adalora.t_final=2",
                            "adalora.delta_t=1")
        out[method] = copy_of(shared, root / method)
        _amplify(out[method])
    return out


def _export(run: Path, fmt: str, dest: Path):
    with pytest.MonkeyPatch.context() as mp:
        mp.chdir(ROOT)
        result = CliRunner().invoke(app, ["export", str(run), str(dest), "--format", fmt])
    assert result.exit_code == 0, result.output
    return result


def _batch():
    tok = AutoTokenizer.from_pretrained(TINY_BERT)
    return tok(["a good movie", "terrible acting and a plot that never ends"], padding=True,
               return_tensors="pt")


def assert_peft_reproduces(folder: Path, batch, ref: torch.Tensor, num_labels: int = 2) -> None:
    """PEFT alone, on the tiny BERT classifier, loads the export in ``folder`` and gives the
    run's logits ``ref`` (1e-5), and the adapter matters (without it the logits move)."""
    base = AutoModelForSequenceClassification.from_pretrained(TINY_BERT, num_labels=num_labels)
    model = peft.PeftModel.from_pretrained(base, folder).eval()
    with torch.no_grad():
        got = model(**batch).logits
        with model.disable_adapter():
            without = model(**batch).logits
    torch.testing.assert_close(got, ref, atol=1e-5, rtol=0)
    assert (without - ref).abs().max() > 1e-2  # the adapter matters


@torch.no_grad()
def _ours(run: Path, batch):
    model, _, _ = load_run(run)
    return model.eval()(**batch).logits


@pytest.mark.parametrize("method, flags", [
    ("rslora", {"use_rslora": True, "use_dora": False, "r": 2, "lora_alpha": 8}),
    ("dora", {"use_dora": True, "use_rslora": False, "r": 2, "lora_alpha": 8}),
    ("pissa", {"use_dora": False, "r": 4, "lora_alpha": 4.0}),  # rank 2r, alpha 2 * (alpha=r)
    ("loraplus", {"use_rslora": False, "use_dora": False, "r": 2, "lora_alpha": 8}),
])
def test_peft_export_loads_in_peft_alone_with_the_runs_logits(runs, tmp_path, method, flags):
    run = runs[method]
    _export(run, "peft", tmp_path / "peft")
    config = json.loads((tmp_path / "peft" / "adapter_config.json").read_text())
    assert config["peft_type"] == "LORA" and config["task_type"] == "SEQ_CLS"
    assert {k: config.get(k, False) for k in flags} == flags
    batch = _batch()
    ref = _ours(run, batch)
    assert_peft_reproduces(tmp_path / "peft", batch, ref)


def test_pissa_peft_export_is_the_rank_2r_update_on_the_original_w0(runs, tmp_path):
    run = runs["pissa"]
    _export(run, "peft", tmp_path / "peft")
    state = load_file(str(tmp_path / "peft" / "adapter_model.safetensors"))
    weights = load_file(str(run / "adapter_model.safetensors"))
    path = "bert.encoder.layer.0.attention.self.query"
    A, B = state[f"base_model.model.{path}.lora_A.weight"], state[
        f"base_model.model.{path}.lora_B.weight"]
    assert A.shape == (4, 32) and B.shape == (32, 4)
    ours = {k: weights[f"{path}.{k}"] for k in ("A", "B", "A0", "B0")}
    # s = alpha / r = 1: B' A' = B A - B0 A0
    torch.testing.assert_close(B @ A, ours["B"] @ ours["A"] - ours["B0"] @ ours["A0"])


@pytest.mark.parametrize("method", list(STEPS))
def test_merged_export_reloads_with_transformers_alone(runs, tmp_path, method):
    run = runs[method]
    _export(run, "merged", tmp_path / "merged")
    batch = _batch()
    merged = AutoModelForSequenceClassification.from_pretrained(tmp_path / "merged").eval()
    with torch.no_grad():
        got = merged(**batch).logits
    ref = _ours(run, batch)
    torch.testing.assert_close(got, ref, atol=1e-5, rtol=0)
    base = AutoModelForSequenceClassification.from_pretrained(TINY_BERT, num_labels=2).eval()
    state = {k: v for k, v in merged.state_dict().items() if "encoder" in k}
    moved = max((v - base.state_dict()[k]).abs().max().item() for k, v in state.items())
    assert moved > 1e-3  # the update was folded in


@pytest.mark.parametrize("method", ["dora", "pissa"])
def test_peft_and_merged_exports_agree(runs, tmp_path, method):
    """The quality bar: DoRA's and PiSSA's PEFT folders, loaded by PEFT alone, match their
    merged exports to 1e-4."""
    run = runs[method]
    _export(run, "peft", tmp_path / "peft")
    _export(run, "merged", tmp_path / "merged")
    batch = _batch()
    base = AutoModelForSequenceClassification.from_pretrained(TINY_BERT, num_labels=2)
    with torch.no_grad():
        via_peft = peft.PeftModel.from_pretrained(base, tmp_path / "peft").eval()(**batch).logits
        merged = AutoModelForSequenceClassification.from_pretrained(
            tmp_path / "merged").eval()(**batch).logits
    torch.testing.assert_close(via_peft, merged, atol=1e-4, rtol=0)


@pytest.mark.parametrize("method", ["sora", "increlora"])
def test_peft_export_of_the_adaptive_baselines_is_refused_in_one_line(runs, tmp_path, method):
    with pytest.MonkeyPatch.context() as mp:
        mp.chdir(ROOT)
        result = CliRunner().invoke(app, ["export", str(runs[method]), str(tmp_path / "p"),
                                          "--format", "peft"])
    assert result.exit_code == 2
    assert f"PEFT has no format for method '{method}'" in result.output
    assert "use --format merged" in result.output
    assert not (tmp_path / "p").exists()
