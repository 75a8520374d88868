"""A GPT-2 (``Conv1D``) adapter exported to PEFT loads with PEFT alone and gives our logits;
merged into the transposed weights it reloads with transformers alone.

No training: adapters get random values (every singular value non-zero, two masked), which
moves the logits far more than the tolerance, so a wrong orientation or scaling would show."""

from __future__ import annotations

from pathlib import Path

import peft
import pytest
import torch
from transformers import AutoModelForCausalLM, GPT2Config

from adalora_cli.artifacts.merged import merge_into_base
from adalora_cli.artifacts.peft import write_peft
from adalora_cli.methods import apply_method
from adalora_cli.methods.adalora import SVDLinear
from adalora_cli.rundir.layout import ALLOCATOR_STATE
from adalora_cli.rundir.summary import Summary
from tests.methods._tiny import run_config

pytestmark = pytest.mark.filterwarnings("ignore:The following rank_pattern keys")


@pytest.fixture(scope="module")
def gpt2_dir(tmp_path_factory) -> Path:
    torch.manual_seed(0)
    config = GPT2Config(n_embd=32, n_inner=37, n_layer=2, n_head=4, vocab_size=64,
                        n_positions=32, bos_token_id=0, eos_token_id=1)
    path = tmp_path_factory.mktemp("tiny-gpt2")
    AutoModelForCausalLM.from_config(config).save_pretrained(path)
    return path


def _adapted(gpt2_dir: Path, method: str):
    torch.manual_seed(1)
    model = AutoModelForCausalLM.from_pretrained(gpt2_dir).eval()
    cfg = run_config(method, model={"name_or_path": str(gpt2_dir)},
                     adalora={"init_rank": 3, "alpha": 6.0}, lora={"r": 3})
    handle = apply_method(model, cfg, None)
    with torch.no_grad():
        for p in handle.adapter:
            p.normal_(0.0, 0.3)
    return model, cfg, handle


IDS = torch.tensor([[3, 9, 27, 4, 60, 12], [5, 5, 18, 33, 2, 7]])


@pytest.mark.parametrize("method", ["lora", "adalora"])
def test_peft_loads_the_conv1d_adapter(gpt2_dir: Path, tmp_path: Path, method: str) -> None:
    model, cfg, handle = _adapted(gpt2_dir, method)
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    if method == "adalora":  # keep all but two triplets, as a pruned run would
        mask = torch.ones(sum(m.r0 for _, m in handle.layers))
        mask[[0, 5]] = 0
        with torch.no_grad():
            flat = torch.cat([m.lam for _, m in handle.layers]) * mask
            off = 0
            for _, m in handle.layers:
                m.lam.copy_(flat[off:off + m.r0])
                off += m.r0
        torch.save({"paths": [p for p, _ in handle.layers], "mask": mask},
                   run_dir / ALLOCATOR_STATE)
    with torch.no_grad():
        ours = model(input_ids=IDS).logits
        plain = AutoModelForCausalLM.from_pretrained(gpt2_dir).eval()(input_ids=IDS).logits
    assert (ours - plain).abs().max() > 1e-2  # the adapter really moves the logits
    out = tmp_path / "peft"
    out.mkdir()
    info = write_peft(run_dir, model, None, cfg, Summary(task="causal_lm", method=method), out)
    assert info["task_type"] == "CAUSAL_LM"
    loaded = peft.PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(gpt2_dir),
                                            out).eval()
    assert loaded.peft_config["default"].fan_in_fan_out is True
    with torch.no_grad():
        torch.testing.assert_close(loaded(input_ids=IDS).logits, ours, atol=1e-5, rtol=0)
    if method == "adalora":
        # r0 3 x (c_attn 32+96+1, attn.c_proj 32+32+1, c_fc 32+37+1, mlp.c_proj 37+32+1) x 2
        assert info["adapter_params_at_r0"] == 3 * (129 + 65 + 70 + 70) * 2
        # triplet 0 sits in layer 0's c_attn, triplet 5 in its attn.c_proj
        assert info["adapter_params"] == info["adapter_params_at_r0"] - 129 - 65
        assert isinstance(handle.layers[0][1], SVDLinear)


def test_merged_conv1d_reloads_with_transformers(gpt2_dir: Path, tmp_path: Path) -> None:
    model, _, _ = _adapted(gpt2_dir, "adalora")
    with torch.no_grad():
        ours = model(input_ids=IDS).logits
    assert merge_into_base(model) == 8
    model.save_pretrained(tmp_path / "merged")
    reloaded = AutoModelForCausalLM.from_pretrained(tmp_path / "merged").eval()
    with torch.no_grad():
        torch.testing.assert_close(reloaded(input_ids=IDS).logits, ours, atol=1e-5, rtol=0)
