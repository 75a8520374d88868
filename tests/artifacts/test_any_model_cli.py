"""Llama-, Qwen2-, GPT-2- and T5-style tiny models through the CLI: train a few steps, a
complete run directory, a PEFT export that PEFT alone loads with our logits (1e-4) and our
greedy ids, a merged export that transformers alone reloads, and ``adalora predict``.

The Llama model is the committed fixture; the others are built here from configs, sharing the
fixtures' tokenizers (nothing is downloaded). The trained adapters are amplified in their
weights file (masked singular values stay zero), as in test_export.py, so Delta W moves the
logits far beyond the tolerance."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import peft
import pytest
import torch
from safetensors.torch import load_file, save_file
from transformers import (
    AutoModelForCausalLM,
    AutoModelForSeq2SeqLM,
    AutoTokenizer,
    GPT2Config,
    GPT2LMHeadModel,
    Qwen2Config,
    Qwen2ForCausalLM,
    T5Config,
    T5ForConditionalGeneration,
)
from typer.testing import CliRunner

from adalora_cli.artifacts.load import load_run
from adalora_cli.cli import app
from tests.conftest import FIXTURES, ROOT

pytestmark = pytest.mark.filterwarnings("ignore:The following rank_pattern keys",
                                        "ignore::FutureWarning")

LLAMA, BART = FIXTURES / "tiny-llama", FIXTURES / "tiny-bart"
LM_SMOKE, SUM_SMOKE = "configs/smoke/causal_lm.yaml", "configs/smoke/summarization.yaml"
SHORT = ["train.max_steps=6", "adalora.t_init=2", "adalora.t_final=2", "adalora.delta_t=1"]


def _with_tokenizer(model, source: Path, dest: Path) -> Path:
    model.save_pretrained(dest)
    for f in source.iterdir():
        if f.name.startswith(("tokenizer", "chat_template")):
            shutil.copy(f, dest / f.name)
    return dest


@pytest.fixture(scope="module")
def models(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("models")
    torch.manual_seed(0)
    common = dict(vocab_size=320, bos_token_id=0, pad_token_id=1, eos_token_id=2)
    qwen2 = Qwen2ForCausalLM(Qwen2Config(
        hidden_size=32, intermediate_size=37, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, max_position_embeddings=256, tie_word_embeddings=True,
        **common))
    gpt2 = GPT2LMHeadModel(GPT2Config(n_embd=32, n_inner=37, n_layer=2, n_head=4,
                                      n_positions=256, **common))
    t5 = T5ForConditionalGeneration(T5Config(
        vocab_size=512, d_model=32, d_kv=8, num_heads=4, d_ff=37, num_layers=2,
        num_decoder_layers=2, pad_token_id=1, eos_token_id=2, decoder_start_token_id=1,
        dropout_rate=0.0))
    return {"llama": LLAMA, "qwen2": _with_tokenizer(qwen2, LLAMA, root / "qwen2"),
            "gpt2": _with_tokenizer(gpt2, LLAMA, root / "gpt2"),
            "t5": _with_tokenizer(t5, BART, root / "t5")}


RUNS = {  # family -> (config, method, overrides)
    "llama": (LM_SMOKE, "adalora", [*SHORT, "adalora.budget=28"]),
    "qwen2": (LM_SMOKE, "lora", ["train.max_steps=4"]),
    "gpt2": (LM_SMOKE, "adalora", [*SHORT, "adalora.budget=16"]),
    "t5": (SUM_SMOKE, "adalora", [*SHORT, "task.max_eval_samples=2",
                                     "task.source_prefix='summarize: '"]),
}


def _amplify(run_dir: Path) -> None:
    path = run_dir / "adapter_model.safetensors"
    state = load_file(str(path))
    for name in state:
        if name.endswith((".lam", ".B")):
            state[name] = state[name] * 40.0
        elif name.endswith((".P", ".Q")):
            state[name] = state[name] * 5.0
    save_file(state, str(path))


@pytest.fixture(scope="module")
def runs(models, tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("runs")
    out = {}
    with pytest.MonkeyPatch.context() as mp:
        mp.chdir(ROOT)
        for family, (config, method, overrides) in RUNS.items():
            result = CliRunner().invoke(app, [
                "train", config, f"model.name_or_path={models[family]}",
                f"method.name={method}", *overrides, "--run-dir", str(root / family), "-q"])
            assert result.exit_code == 0, result.output
            _amplify(root / family)
            out[family] = root / family
    return out


def _inputs(family: str, models: dict[str, Path]) -> dict[str, torch.Tensor]:
    tok = AutoTokenizer.from_pretrained(models[family])
    tok.padding_side = "left"  # decoder-only batches continue at the end
    return tok(["Question: Which river runs through Arden?\nAnswer:",
                "Question: Is Kelso a town?\nAnswer:"], padding=True, return_tensors="pt")


@pytest.mark.parametrize("family", list(RUNS))
def test_run_directory_is_complete(runs, family) -> None:
    run = runs[family]
    status = json.loads((run / "status.json").read_text())
    summary = json.loads((run / "summary.json").read_text())
    assert status["status"] == "finished"
    names = {"config.yaml", "metrics.jsonl", "summary.json", "adapter_model.safetensors"}
    if RUNS[family][1] == "adalora":
        names |= {"rank_pattern.json", "allocator_state.pt"}
    names |= {"predictions.jsonl"}  # causal_lm generates (max_new_tokens 8); summaries too
    assert names <= {p.name for p in run.iterdir()}
    metrics = summary["metrics"]["validation"]
    if family == "t5":
        assert set(metrics) == {"rouge1", "rouge2", "rougeL", "rougeLsum"}
    else:
        assert set(metrics) == {"loss", "perplexity", "exact_match", "rougeL"}
        assert abs(metrics["perplexity"] - 2.718281828 ** metrics["loss"]) < 1e-6 * \
            metrics["perplexity"]
    assert summary["head_params"] == 0  # LM heads stay frozen, tied or not


@pytest.mark.parametrize("family", list(RUNS))
def test_peft_reproduces_logits_and_greedy_ids(runs, models, family, tmp_path) -> None:
    run = runs[family]
    result = CliRunner().invoke(app, ["export", str(run), str(tmp_path / "peft")])
    assert result.exit_code == 0, result.output
    config = json.loads((tmp_path / "peft" / "adapter_config.json").read_text())
    assert config["task_type"] == ("SEQ_2_SEQ_LM" if family == "t5" else "CAUSAL_LM")
    assert config["fan_in_fan_out"] is (family == "gpt2")
    auto = AutoModelForSeq2SeqLM if family == "t5" else AutoModelForCausalLM
    theirs = peft.PeftModel.from_pretrained(auto.from_pretrained(models[family]),
                                            tmp_path / "peft").eval()
    ours, _, _ = load_run(run)
    ours.eval()
    batch = _inputs(family, models)
    extra = {"decoder_input_ids": torch.tensor([[1, 40, 41], [1, 42, 43]])} if family == "t5" \
        else {}
    greedy = {"max_new_tokens": 6, "do_sample": False, "pad_token_id": 1}
    with torch.no_grad():
        want = ours(**batch, **extra).logits
        got = theirs(**batch, **extra).logits
        with theirs.disable_adapter():
            base = theirs(**batch, **extra).logits
        assert (base - want).abs().max() > 1e-2  # the adapter matters
        torch.testing.assert_close(got, want, atol=1e-4, rtol=0)
        assert torch.equal(theirs.generate(**batch, **greedy), ours.generate(**batch, **greedy))


@pytest.mark.parametrize("family", ["llama", "gpt2", "t5"])
def test_merged_export_reloads_with_transformers(runs, models, family, tmp_path) -> None:
    run = runs[family]
    result = CliRunner().invoke(app, ["export", str(run), str(tmp_path / "merged"),
                                      "--format", "merged"])
    assert result.exit_code == 0, result.output
    auto = AutoModelForSeq2SeqLM if family == "t5" else AutoModelForCausalLM
    merged = auto.from_pretrained(tmp_path / "merged").eval()
    ours, _, _ = load_run(run)
    batch = _inputs(family, models)
    extra = {"decoder_input_ids": torch.tensor([[1, 40], [1, 42]])} if family == "t5" else {}
    with torch.no_grad():
        torch.testing.assert_close(merged(**batch, **extra).logits,
                                   ours.eval()(**batch, **extra).logits, atol=1e-4, rtol=0)


def test_predict_generates_what_the_peft_model_generates(runs, models, tmp_path) -> None:
    run = runs["llama"]
    rows = [{"id": "a", "prompt": "Question: Which river runs through Arden?\nAnswer:"},
            {"id": "b", "prompt": "Question: Is Kelso a town?\nAnswer:"}]
    (tmp_path / "in.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    result = CliRunner().invoke(app, ["predict", str(run), "-i", str(tmp_path / "in.jsonl"),
                                      "-o", str(tmp_path / "out.jsonl"), "-q"])
    assert result.exit_code == 0, result.output
    got = [json.loads(x) for x in (tmp_path / "out.jsonl").read_text().splitlines()]
    assert [g["id"] for g in got] == ["a", "b"]
    assert CliRunner().invoke(app, ["export", str(run), str(tmp_path / "peft")]).exit_code == 0
    model = peft.PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(LLAMA),
                                           tmp_path / "peft").eval()
    tok = AutoTokenizer.from_pretrained(LLAMA)
    for row, out in zip(rows, got):  # one prompt at a time: no padding involved
        ids = tok(row["prompt"], return_tensors="pt")
        with torch.no_grad():
            new = model.generate(**ids, max_new_tokens=8, do_sample=False, pad_token_id=1)
        text = tok.decode(new[0, ids["input_ids"].shape[1]:], skip_special_tokens=True)
        assert out["response"] == text.strip()
