"""model.quantize=nf4: the frozen base in 4 bits (torchao's NF4 tensors) under every method
that keeps it frozen; what trains on it, what stays as it was, and what is refused.

The tiny Llama (tests/fixtures/tiny-llama: hidden 32, FFN 37) has 8 attention matrices whose
weights split into 64-value blocks (q and o: 32 x 32, k and v: 16 x 32) and 6 FFN matrices
(37 x 32 = 1,184 values) that do not, which stay in fp32.
"""

from __future__ import annotations

import json
import sys

import pytest
import torch
from typer.testing import CliRunner

from adalora_cli.cli import app
from adalora_cli.config import ConfigError, load_config
from adalora_cli.engine import quantize
from adalora_cli.engine.build import build_run, load_model
from adalora_cli.engine.header import built_line
from adalora_cli.engine.step import Stepper
from adalora_cli.methods.base import NF4_MODULE, is_nf4
from adalora_cli.tasks import get_task
from tests.conftest import ROOT, copy_of
from tests.test_bad_inputs import refused

SMOKE_LM = "configs/smoke/causal_lm.yaml"
NF4 = "model.quantize=nf4"
ATTENTION = ("q_proj", "k_proj", "v_proj", "o_proj")


def nf4_class():
    return sys.modules[NF4_MODULE].NF4Tensor


# ------------------------------------------------------------------ training on a 4-bit base
def test_adalora_on_an_nf4_base_prunes_to_its_budget(smoke_runs):
    run = smoke_runs(SMOKE_LM, NF4)
    summary = json.loads((run / "summary.json").read_text())
    pattern = json.loads((run / "rank_pattern.json").read_text())
    assert summary["precision"]["base_quant"] == "nf4"
    assert len(pattern) == 14  # 2 layers x 7 matrices
    # b(T) = target_rank 2 x 14 matrices: the allocator met it exactly, by pruning from r0 4
    assert summary["final_budget"] == 28
    assert sum(pattern.values()) == 28
    assert min(pattern.values()) < 4 and sum(r < 4 for r in pattern.values()) >= 7
    steps = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    budgets = [row["budget"] for row in steps if "budget" in row]
    assert budgets[0] == 56 and budgets[-1] == 28  # b0 = 14 x r0 4, falling to b(T)
    assert all(torch.isfinite(torch.tensor(row["loss"])) for row in steps if "loss" in row)


@pytest.mark.parametrize("method", ["lora", "dora"])  # DoRA reads W0 itself, dequantized
def test_lora_and_dora_on_an_nf4_base_train(smoke_runs, method):
    from safetensors.torch import load_file

    run = smoke_runs(SMOKE_LM, NF4, f"method.name={method}")
    weights = load_file(str(run / "adapter_model.safetensors"))
    b = [t for name, t in weights.items() if name.endswith(".B")]
    assert len(b) == 14
    assert all(t.abs().max() > 0 for t in b)  # every B left its zero start: they trained


@pytest.mark.parametrize("method", ["houlsby", "pfeiffer", "rslora", "pissa", "loraplus",
                                    "sora", "increlora"])
def test_every_other_method_with_a_frozen_base_trains_on_nf4(smoke_runs, method):
    # the GLUE smoke config (tiny BERT: its 32 x 32 matrices in NF4, the 37-wide FFN's
    # 1,184 values in fp32) trains every method; PiSSA's residual W - B0 A0 becomes NF4
    run = smoke_runs("configs/smoke/glue.yaml", NF4, f"method.name={method}")
    summary = json.loads((run / "summary.json").read_text())
    assert summary["precision"]["base_quant"] == "nf4"
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    losses = [row["loss"] for row in rows if "loss" in row and "split" not in row]
    assert rows[-1]["split"] == "validation" and 0 <= rows[-1]["accuracy"] <= 1
    assert len(losses) >= 2 and all(torch.isfinite(torch.tensor(losses)))


def _built(*overrides: str):
    cfg = load_config(ROOT / SMOKE_LM, [NF4, *overrides])
    return build_run(cfg)


def _fp32_base():
    """The tiny Llama as it loads, in fp32 (no method, no quantization)."""
    cfg = load_config(ROOT / SMOKE_LM)
    model, _ = load_model(get_task(cfg), cfg)
    return dict(model.named_parameters())


@pytest.mark.parametrize("method", ["lora", "adalora"])
def test_the_base_is_nf4_within_nf4s_error_and_stays_unchanged(in_repo, method):
    built = _built(f"method.name={method}")
    fp32 = _fp32_base()
    NF4Tensor = nf4_class()
    quantized = {name: p for name, p in built.model.named_parameters()
                 if isinstance(p, NF4Tensor)}
    # the 8 attention matrices, each inside the adapter that wraps it; not the FFN
    # (37-wide), the embeddings, the norms or the LM head
    assert sorted(quantized) == sorted(
        f"model.layers.{i}.self_attn.{m}.base.weight" for i in range(2) for m in ATTENTION)
    assert not any(is_nf4(p) for n, p in built.model.named_parameters() if "mlp" in n)
    for name, w in quantized.items():
        original = fp32[name.replace(".base.weight", ".weight")].detach()
        back = w.get_original_weight()
        assert back.dtype == torch.float32 and back.shape == original.shape
        # NF4: 16 levels on [-1, 1] times each 64-value block's absmax, the widest gap
        # between levels -1 to -0.6962, so at most half that from the nearest; the block's
        # absmax is itself rounded to 8 bits around the blocks' mean (double quantization),
        # off by at most the largest absmax / 256
        blocks, approx = original.reshape(-1, 64), back.reshape(-1, 64)
        absmax = blocks.abs().amax(dim=1, keepdim=True)
        bound = absmax * (1 - 0.6962) / 2 + absmax.max() / 256
        assert ((approx - blocks).abs() <= bound + 1e-7).all(), name
        assert (approx != blocks).any()  # really rounded to 4 bits
    before = {n: (w.quantized_data.clone(), w.get_original_weight().clone())
              for n, w in quantized.items()}
    stepper = Stepper.build(built.model, built.handle, built.cfg.train, built.steps,
                            built.precision)
    assert not any(is_nf4(p) for g in stepper.optimizer.param_groups for p in g["params"])
    train = built.data.train
    for t in range(1, 5):
        stepper.backward(built.data.collate([train[i] for i in range(8 * t - 8, 8 * t)]))
        stepper.update(t)
    adapters = [p for p in built.handle.adapter]
    assert all(torch.isfinite(p).all() for p in adapters)
    for name, w in dict(built.model.named_parameters()).items():
        if name in before:
            assert is_nf4(w) and w.grad is None
            assert torch.equal(w.quantized_data, before[name][0])
            assert torch.equal(w.get_original_weight(), before[name][1])


def test_a_bf16_base_quantizes_from_bf16_and_computes_in_it(in_repo):
    built = _built("method.name=lora", "model.base_dtype=bf16", "train.precision=bf16")
    q = built.model.get_submodule("model.layers.0.self_attn.q_proj").base.weight
    assert is_nf4(q) and q.dtype == torch.bfloat16
    assert q.get_original_weight().dtype == torch.bfloat16
    assert "base weights nf4 (computed in bf16);" in built_line(built)


def test_scaler_blocks_fill_the_scales():
    # torchao groups an NF4 weight's scales in whole blocks: 256 where they allow, else the
    # largest divisor under it (SmolLM2's 576 x 576: 5,184 scales in groups of 216)
    assert quantize.scaler_block(16384 // 64) == 256
    assert quantize.scaler_block(576 * 576 // 64) == 216
    assert quantize.scaler_block(192 * 576 // 64) == 216
    assert quantize.scaler_block(8) == 8


# ------------------------------------------------------------------ refusals
@pytest.mark.parametrize("method", ["full", "bitfit"])
def test_a_method_that_trains_the_base_is_refused(tmp_path, method):
    line = refused("train", SMOKE_LM, NF4, f"method.name={method}", "--run-dir",
                   str(tmp_path / "run"), "--quiet")
    assert f"method {method} trains the base weights" in line
    assert "model.quantize=none" in line
    assert not (tmp_path / "run").exists()
    assert refused("train", SMOKE_LM, NF4, f"method.name={method}", "--dry-run") == line


def test_nf4_with_fsdp_is_refused_before_the_model_loads():
    # (the build checks it before loading, beside sharding's own checks, which need the
    # processes of a real --nproc launch to get this far)
    cfg = load_config(ROOT / SMOKE_LM, [NF4, "train.sharding=fsdp"])
    with pytest.raises(ConfigError, match="model.quantize=nf4 does not run with "
                       r"train.sharding=fsdp yet; set train.sharding=none"):
        quantize.check(cfg, False, str(ROOT / "tests/fixtures/tiny-llama"))


def test_a_gguf_base_already_quantized_is_refused(tmp_path, tiny_gguf):
    line = refused("train", SMOKE_LM, NF4, f"model.name_or_path={tiny_gguf}", "--run-dir",
                   str(tmp_path / "run"), "--quiet")
    assert "already quantized (Q4_1)" in line and "F16/BF16/F32 GGUF" in line
    assert not (tmp_path / "run").exists()


def test_a_plain_float_gguf_may_become_nf4(tmp_path):
    from tests.fixtures.make_tiny_gguf import write_tiny_gguf

    path = str(write_tiny_gguf(tmp_path / "tiny-llama.F16.gguf", "F16"))
    cfg = load_config(ROOT / SMOKE_LM, [NF4])
    assert set(quantize.gguf.tensor_types(path).values()) <= {"F16", "F32"}
    quantize.check(cfg, False, path)  # no error


def test_a_missing_torchao_names_the_extra(monkeypatch):
    monkeypatch.setitem(sys.modules, NF4_MODULE, None)  # what a missing package raises
    cfg = load_config(ROOT / SMOKE_LM, [NF4])
    with pytest.raises(ConfigError, match=r"needs torchao .*pip install -e '\.\[qlora\]'"):
        quantize.check(cfg, False, str(ROOT / "tests/fixtures/tiny-llama"))


# ------------------------------------------------------------------ exports
def test_exports_of_an_nf4_run_say_how_to_load_the_base(smoke_runs, tmp_path):
    run = copy_of(smoke_runs(SMOKE_LM, NF4, "method.name=lora"), tmp_path / "run")
    for fmt in ("peft", "merged"):
        out = tmp_path / fmt
        result = CliRunner().invoke(app, ["export", str(run), str(out), "--format", fmt])
        assert result.exit_code == 0, result.output
        record = json.loads((out / "precision.json").read_text())
        card = (out / "README.md").read_text()
        assert record["base_quant"] == "nf4"
        assert record["how"] in card
        if fmt == "peft":
            assert "bnb_4bit_quant_type='nf4'" in record["how"]
            assert "bnb_4bit_use_double_quant=True" in record["how"]
            assert "bnb_4bit_compute_dtype=torch.float32" in record["how"]
        else:
            assert "that base dequantized plus the adapter's update" in record["how"]
    # the merged model computes the run's model: its NF4 base plus the adapter
    from transformers import AutoModelForCausalLM

    from adalora_cli.artifacts.load import load_run

    model, _, _ = load_run(run)
    assert is_nf4(model.get_submodule("model.layers.0.self_attn.q_proj").base.weight)
    merged = AutoModelForCausalLM.from_pretrained(tmp_path / "merged")
    ids = torch.tensor([[5, 17, 42, 7, 99, 3]])
    with torch.no_grad():
        want, got = model.eval()(input_ids=ids).logits, merged.eval()(input_ids=ids).logits
    assert torch.allclose(got, want, atol=1e-5, rtol=0)


# ------------------------------------------------------------------ torchao installed
@pytest.mark.e2e
def test_an_installed_torchao_says_nothing_to_a_run():
    # transformers imports torchao with its models whenever it is installed, in every run,
    # nf4 or not: what torchao and torch log then must not reach the run's output
    import subprocess

    code = ("from adalora_cli.cli.boundary import quiet_libraries; quiet_libraries(); "
            "import transformers.modeling_utils, sys; "
            "print('torchao' in sys.modules)")
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip() == "True"  # the case this guards: torchao did load
    assert done.stderr == ""


# ------------------------------------------------------------------ resume
@pytest.mark.e2e
def test_an_nf4_run_killed_mid_pruning_resumes_to_the_same_run(smoke_runs, in_repo, tmp_path):
    # the rebuilt base is quantized again from the same checkpoint: the same NF4 weights,
    # so the resumed run ends byte-identical to the one never stopped
    from .conftest import forked, same_outputs

    baseline = smoke_runs(SMOKE_LM, NF4, "train.save_every=3")
    out = tmp_path / "run"
    args = ["train", SMOKE_LM, NF4, "train.save_every=3", "--run-dir", str(out), "--quiet"]
    assert forked(args, "kill@step=7") == -9  # between mask events (t_init 4, delta_t 2)
    assert forked(["train", "--resume", str(out), "--quiet"]) == 0
    assert same_outputs(out, baseline) == []


@pytest.mark.e2e
def test_two_processes_train_on_an_nf4_base(smoke_runs, in_repo, tmp_path):
    # DDP broadcasts rank 0's parameters at the start, the frozen NF4 ones among them
    from .conftest import forked_ranks

    smoke_runs(SMOKE_LM, NF4)  # trained here first: the forked ranks skip the first-use costs
    out = tmp_path / "run"
    assert forked_ranks(["train", SMOKE_LM, NF4, "--run-dir", str(out), "--quiet"]) == [0, 0]
    summary = json.loads((out / "summary.json").read_text())
    pattern = json.loads((out / "rank_pattern.json").read_text())
    assert summary["precision"]["base_quant"] == "nf4"
    assert sum(pattern.values()) == summary["final_budget"] == 28


# ------------------------------------------------------------------ lm-evaluation-harness
def test_the_harness_scores_an_nf4_runs_base_in_nf4(smoke_runs, in_repo, tmp_path):
    # method none: the adapted model is the base itself, rebuilt in NF4 as the run had it,
    # so the base scored first must answer exactly as it does (an fp32 base answers one of
    # these 8 chats otherwise)
    chat = "configs/smoke/bbc_topic_chat.yaml"
    run = copy_of(smoke_runs(chat, "task.max_new_tokens=8", "method.name=none", NF4),
                  tmp_path / "run")
    result = CliRunner().invoke(app, ["eval", str(run), "--harness", "bbc_topic_chat",
                                      "--limit", "8", "--base", "--quiet"])
    assert result.exit_code == 0, result.output

    def replies(which: str) -> list[str]:
        path = run / "harness" / f"{which}-bbc_topic_chat.jsonl"
        return [json.loads(line)["response"] for line in path.read_text().splitlines()]

    predictions = [json.loads(line)["prediction"]
                   for line in (run / "predictions.jsonl").read_text().splitlines()]
    assert len(replies("base")) == 8
    assert replies("base") == replies("adapted")
    assert [r.strip() for r in replies("adapted")][5] == predictions[5]
