"""Checkpoints stored in half precision train in fp32 (issue: DeBERTaV3-base, as published,
is fp16; Llama, Qwen and Mistral are bf16; transformers 5 loads the stored dtype unless
asked). The fixtures here are the committed tiny models saved again in the real
checkpoints' dtypes: every loss must be finite, and the saved adapter and head fp32."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from adalora_cli.artifacts.load import load_run

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures"


def _resave(name: str, auto: str, dtype: torch.dtype, dest: Path) -> Path:
    """``tests/fixtures/<name>`` saved in ``dtype``, tokenizer files copied alongside."""
    import transformers

    model = getattr(transformers, auto).from_pretrained(FIXTURES / name, dtype=dtype)
    model.save_pretrained(dest)
    for f in (FIXTURES / name).iterdir():
        if not (dest / f.name).exists():
            shutil.copy(f, dest)
    stored = load_file(str(dest / "model.safetensors"))
    assert {v.dtype for v in stored.values() if v.is_floating_point()} == {dtype}
    return dest


def _train(smoke: str, model: Path, run: Path, *overrides: str) -> Path:
    from typer.testing import CliRunner

    from adalora_cli.cli import app

    result = CliRunner().invoke(app, ["train", f"configs/smoke/{smoke}.yaml",
                                      f"model.name_or_path={model}", *overrides,
                                      "--run-dir", str(run), "--quiet"])
    assert result.exit_code == 0, result.output
    return run


def _losses(run: Path) -> list[float]:
    rows = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    return [r["loss"] for r in rows if "loss" in r and "split" not in r]


@pytest.mark.parametrize("smoke,name,auto,dtype", [
    ("glue", "tiny-bert", "BertForPreTraining", torch.float16),
    ("squad", "tiny-bert", "BertForPreTraining", torch.float16),
    ("summarization", "tiny-bart", "BartForConditionalGeneration", torch.float16),
    ("causal_lm", "tiny-llama", "LlamaForCausalLM", torch.bfloat16),
])
def test_a_half_precision_checkpoint_trains_fp32_adapters_and_heads(
        smoke, name, auto, dtype, tmp_path, in_repo):
    model = _resave(name, auto, dtype, tmp_path / "model")
    run = _train(smoke, model, tmp_path / "run", "train.max_steps=6", "adalora.t_init=1",
                 "adalora.t_final=1", "train.eval_every=null")
    losses = _losses(run)
    assert len(losses) == 6 and all(torch.isfinite(torch.tensor(losses)))
    saved = load_file(str(run / "adapter_model.safetensors"))
    assert saved and {v.dtype for v in saved.values()} == {torch.float32}
    # eval, export and predict rebuild the run the same way: an fp32 model throughout
    rebuilt, _, _ = load_run(run)
    assert {p.dtype for p in rebuilt.parameters()} == {torch.float32}


def test_a_bf16_checkpoint_loads_fp32_and_gives_the_fp32_checkpoint_s_logits(tmp_path):
    """The upcast is exact: bf16 values are fp32 values, so loading the bf16 copy in fp32
    gives what loading fp32 weights rounded to bf16 gives."""
    from transformers import AutoModelForCausalLM

    from adalora_cli.tasks.pretrained import from_pretrained

    model = _resave("tiny-llama", "LlamaForCausalLM", torch.bfloat16, tmp_path / "m")
    loaded = from_pretrained(AutoModelForCausalLM, str(model))
    reference = AutoModelForCausalLM.from_pretrained(FIXTURES / "tiny-llama",
                                                     dtype=torch.float32)
    with torch.no_grad():
        for p in reference.parameters():
            p.copy_(p.to(torch.bfloat16).float())
    ids = torch.tensor([[1, 5, 9, 20, 3]])
    assert {p.dtype for p in loaded.parameters()} == {torch.float32}
    torch.testing.assert_close(loaded(ids).logits, reference(ids).logits, rtol=0, atol=0)
