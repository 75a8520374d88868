"""``adalora export --format lora``: a run as a plain PEFT ``LoraConfig`` folder with each
matrix's final rank and every scale folded into the factors, which PEFT alone loads with the
run's logits (1e-5), which agrees with the merged export, and which a loader applying one
``lora_alpha / r`` to every module (as vLLM does, ignoring ``rank_pattern``) reads as the
run's model too.

The model families are those the PEFT export tests cover (BERT with a classifier and with a
span head, BART, T5, Llama, Qwen2 and GPT-2's Conv1D), built as tiny models with random
adapter values (some triplets pruned, one matrix pruned to rank 0) so that the update moves
the logits far beyond the tolerance; the AdaLoRA smoke run goes through the CLI.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
import warnings
from pathlib import Path

import peft
import pytest
import torch
from safetensors.torch import load_file, save_file
from transformers import (
    AutoModelForCausalLM,
    AutoModelForQuestionAnswering,
    AutoModelForSeq2SeqLM,
    AutoModelForSequenceClassification,
    GPT2Config,
    Qwen2Config,
    T5Config,
)
from typer.testing import CliRunner

from adalora_cli.artifacts.load import load_run
from adalora_cli.artifacts.merged import merge_into_base
from adalora_cli.artifacts.plain_lora import FOLDS, NOT_PLAIN, check_lora_method, write_lora
from adalora_cli.cli import app
from adalora_cli.config import ConfigError
from adalora_cli.methods import apply_method
from adalora_cli.methods.registry import METHODS
from adalora_cli.rundir.summary import Summary
from tests.conftest import FIXTURES, ROOT, copy_of
from tests.methods._tiny import run_config

IDS = torch.tensor([[3, 9, 27, 4, 60, 12], [5, 5, 18, 33, 2, 7]])
DECODER_IDS = torch.tensor([[1, 40, 41], [1, 42, 43]])


def _save(model, root: Path, name: str) -> Path:
    model.save_pretrained(root / name)
    return root / name


@pytest.fixture(scope="module")
def families(tmp_path_factory) -> dict[str, tuple[Path, type]]:
    """family -> (model folder, auto class): the fixtures, and tiny models built here."""
    root = tmp_path_factory.mktemp("families")
    torch.manual_seed(0)
    common = dict(vocab_size=64, bos_token_id=0, pad_token_id=1, eos_token_id=2)
    qwen2 = AutoModelForCausalLM.from_config(Qwen2Config(
        hidden_size=32, intermediate_size=37, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, max_position_embeddings=64, tie_word_embeddings=True, **common))
    gpt2 = AutoModelForCausalLM.from_config(GPT2Config(
        n_embd=32, n_inner=37, n_layer=2, n_head=4, n_positions=64, **common))
    t5 = AutoModelForSeq2SeqLM.from_config(T5Config(
        vocab_size=64, d_model=32, d_kv=8, num_heads=4, d_ff=37, num_layers=2,
        num_decoder_layers=2, pad_token_id=1, eos_token_id=2, decoder_start_token_id=1,
        dropout_rate=0.0))
    bert_cls = AutoModelForSequenceClassification.from_pretrained(FIXTURES / "tiny-bert",
                                                                  num_labels=3)
    return {
        "llama": (FIXTURES / "tiny-llama", AutoModelForCausalLM),
        "qwen2": (_save(qwen2, root, "qwen2"), AutoModelForCausalLM),
        "gpt2": (_save(gpt2, root, "gpt2"), AutoModelForCausalLM),
        "t5": (_save(t5, root, "t5"), AutoModelForSeq2SeqLM),
        "bart": (FIXTURES / "tiny-bart", AutoModelForSeq2SeqLM),
        "bert-cls": (_save(bert_cls, root, "bert-cls"), AutoModelForSequenceClassification),
        "bert-qa": (FIXTURES / "tiny-bert", AutoModelForQuestionAnswering),
    }


def _adapted(folder: Path, auto: type, method: str):
    """The model with ``method`` injected and random adapter values; for AdaLoRA every third
    triplet pruned (lam 0) and the first matrix pruned to rank 0."""
    torch.manual_seed(1)
    model = auto.from_pretrained(folder).eval()
    cfg = run_config(method, model={"name_or_path": str(folder)},
                     adalora={"init_rank": 3, "alpha": 6.0}, lora={"r": 3},
                     rslora={"r": 3}, pissa={"r": 3}, sora={"r_max": 3},
                     loraplus={"r": 3})
    handle = apply_method(model, cfg, None)
    with torch.no_grad():
        for p in handle.adapter:
            p.normal_(0.0, 0.3)
        if method == "adalora":
            for i, (_, layer) in enumerate(handle.layers):
                layer.lam[::3] = 0.0
                if i == 0:
                    layer.lam.zero_()
    return model.eval(), cfg, handle


def _inputs(family: str) -> dict[str, torch.Tensor]:
    if family in ("t5", "bart"):
        return {"input_ids": IDS, "decoder_input_ids": DECODER_IDS}
    if family == "bert-qa":  # a pair: segment ids matter
        return {"input_ids": IDS, "token_type_ids": torch.tensor([[0, 0, 0, 1, 1, 1]] * 2)}
    return {"input_ids": IDS}


def _outputs(model, batch) -> torch.Tensor:
    with torch.no_grad():
        out = model(**batch)
    if hasattr(out, "start_logits"):
        return torch.cat([out.start_logits, out.end_logits], dim=-1)
    return out.logits


def _write(tmp_path: Path, model, cfg, method: str) -> tuple[Path, dict]:
    out = tmp_path / "lora"
    out.mkdir()
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    info = write_lora(run_dir, model, None, cfg, Summary(task="glue", method=method), out)
    return out, info


def one_alpha_loader(folder: Path, auto: type, lora: Path):
    """What vLLM does with the folder: every module's update is ``lora_alpha / r`` (the
    config's one r) times ``lora_B @ lora_A``, ``rank_pattern`` and ``alpha_pattern``
    unread; the head, if any, from the adapter file. A plain transformers model, no PEFT."""
    config = json.loads((lora / "adapter_config.json").read_text())
    state = load_file(str(lora / "adapter_model.safetensors"))
    model = auto.from_pretrained(folder).eval()
    scale = config["lora_alpha"] / config["r"]
    with torch.no_grad():
        for path in config["target_modules"]:
            key = f"base_model.model.{path}"
            delta = state[f"{key}.lora_B.weight"] @ state[f"{key}.lora_A.weight"] * scale
            weight = model.get_submodule(path).weight
            weight += delta.T if config["fan_in_fan_out"] else delta
        heads = {k.removeprefix("base_model.model."): v for k, v in state.items()
                 if ".lora_" not in k}
        for name, value in heads.items():
            model.get_parameter(name).copy_(value)
    return model


@pytest.mark.parametrize("family", ["llama", "qwen2", "gpt2", "t5", "bart", "bert-cls",
                                    "bert-qa"])
def test_every_family_loads_in_peft_alone_with_the_runs_logits(families, tmp_path, family):
    folder, auto = families[family]
    model, cfg, handle = _adapted(folder, auto, "adalora")
    batch = _inputs(family)
    ours = _outputs(model, batch)
    plain = _outputs(auto.from_pretrained(folder).eval(), batch)
    out, info = _write(tmp_path, model, cfg, "adalora")
    # each matrix's final rank is its count of non-zero lam; the first matrix's is 0
    want = {path: int((layer.lam != 0).sum()) for path, layer in handle.layers}
    assert info["ranks"] == want and want[handle.layers[0][0]] == 0
    assert all(r == 2 for r in list(want.values())[1:])  # r0 3, every third pruned
    config = json.loads((out / "adapter_config.json").read_text())
    kept = [path for path, r in want.items() if r]
    assert config["peft_type"] == "LORA" and config["target_modules"] == kept
    assert config["r"] == config["lora_alpha"] == 2
    assert config["rank_pattern"] == config["alpha_pattern"] == {p: 2 for p in kept}
    assert (config["use_rslora"], config["use_dora"]) == (False, False)
    theirs = peft.PeftModel.from_pretrained(auto.from_pretrained(folder), out).eval()
    got = _outputs(theirs, batch)
    assert (ours - plain).abs().max() > 1e-3  # 100 times the tolerance: the adapter shows
    torch.testing.assert_close(got, ours, atol=1e-5, rtol=0)
    torch.testing.assert_close(_outputs(one_alpha_loader(folder, auto, out), batch), ours,
                               atol=1e-5, rtol=0)
    merge_into_base(model)  # the merged export's weights: the same model
    torch.testing.assert_close(_outputs(model, batch), got, atol=1e-5, rtol=0)


@pytest.mark.parametrize("method, rank", [("lora", 3), ("rslora", 3), ("loraplus", 3),
                                          ("pissa", 6), ("sora", 3), ("increlora", None)])
def test_the_lora_shaped_baselines_fold_to_plain_lora(families, tmp_path, method, rank):
    folder, auto = families["llama"]
    model, cfg, handle = _adapted(folder, auto, method)
    batch = _inputs("llama")
    ours = _outputs(model, batch)
    out, info = _write(tmp_path, model, cfg, method)
    config = json.loads((out / "adapter_config.json").read_text())
    if rank is not None:  # PiSSA: the rank-2r [B, -B0] [A; A0] on the original W0
        assert set(info["ranks"].values()) == {rank} and config["r"] == rank
    assert config["lora_alpha"] == config["r"] and config["use_rslora"] is False
    theirs = peft.PeftModel.from_pretrained(auto.from_pretrained(folder), out).eval()
    torch.testing.assert_close(_outputs(theirs, batch), ours, atol=1e-5, rtol=0)
    torch.testing.assert_close(_outputs(one_alpha_loader(folder, auto, out), batch), ours,
                               atol=1e-5, rtol=0)


@pytest.mark.parametrize("method", [n for n, s in METHODS.items() if s.targeted])
def test_every_low_rank_method_has_a_fold_or_a_reason(families, method):
    """A new method that wraps linear modules needs an entry in FOLDS (how its update is
    lora_B @ lora_A) or in NOT_PLAIN (why it is none)."""
    folder, auto = families["llama"]
    _, _, handle = _adapted(folder, auto, method)
    kinds = {type(layer) for _, layer in handle.layers}
    assert kinds and kinds <= set(FOLDS) | set(NOT_PLAIN), (method, kinds)


def test_dora_layers_are_refused_in_one_line(families, tmp_path):
    folder, auto = families["llama"]
    model, cfg, _ = _adapted(folder, auto, "dora")
    with pytest.raises(ConfigError) as err:
        _write(tmp_path, model, cfg, "dora")
    assert str(err.value) == (
        "the run's DoRALinear layers cannot be written as plain LoRA: DoRA divides W0 + s B A "
        "by its row norms and rescales them by a learned magnitude, which is no low-rank "
        "update; use --format peft (PEFT's use_dora) or --format merged")
    assert not (tmp_path / "lora" / "adapter_config.json").exists()


@pytest.mark.parametrize("method, words", [
    ("houlsby", "its bottleneck adapters are a nonlinear path beside the layers"),
    ("pfeiffer", "its bottleneck adapters are a nonlinear path beside the layers"),
    ("bitfit", "it trains the model's own tensors, not low-rank factors; use --format merged"),
    ("full", "it trains the model's own tensors, not low-rank factors; use --format merged"),
    ("none", "it trains nothing"),
])
def test_methods_that_are_no_low_rank_update_are_refused_before_loading(method, words):
    with pytest.raises(ConfigError, match=re.escape(
            f"method {method!r} cannot be written as plain LoRA: {words}")):
        check_lora_method(method)


# --------------------------------------------------------------------------- through the CLI

BERT_ADALORA = ("configs/smoke/glue.yaml", "train.max_steps=12", "adalora.t_init=2",
                "adalora.t_final=4", "train.eval_every=null")  # as tests/artifacts/test_export.py


def _export(run: Path, fmt: str, dest: Path):
    with pytest.MonkeyPatch.context() as mp:
        mp.chdir(ROOT)
        return CliRunner().invoke(app, ["export", str(run), str(dest), "--format", fmt])


@pytest.fixture(scope="module")
def pruned_run(smoke_runs, tmp_path_factory) -> Path:
    """The AdaLoRA smoke run with its update amplified (masked lam stay 0) and its first
    matrix pruned to rank 0 in the weights and the allocator's mask."""
    run = copy_of(smoke_runs(*BERT_ADALORA), tmp_path_factory.mktemp("lora") / "run")
    path = run / "adapter_model.safetensors"
    state = load_file(str(path))
    first = next(iter(json.loads((run / "rank_pattern.json").read_text()))) + ".lam"
    for name in state:
        if name.endswith(".lam"):
            state[name] = state[name] * 40.0 * (name != first)
        elif name.endswith((".P", ".Q")):
            state[name] = state[name] * 5.0
    save_file(state, str(path))
    return run


def test_an_adalora_run_exports_as_plain_lora_through_the_cli(pruned_run, tmp_path):
    run = pruned_run
    result = _export(run, "lora", tmp_path / "lora")
    assert result.exit_code == 0, result.output
    ranks = json.loads((run / "rank_pattern.json").read_text())
    first = next(iter(ranks))
    want = {p: r for p, r in ranks.items() if p != first and r}
    config = json.loads((tmp_path / "lora" / "adapter_config.json").read_text())
    assert config["target_modules"] == list(want) and first not in config["rank_pattern"]
    assert config["rank_pattern"] == config["alpha_pattern"] == want
    assert config["r"] == config["lora_alpha"] == max(want.values())
    assert config["task_type"] == "SEQ_CLS" and config["modules_to_save"] == ["classifier"]
    state = load_file(str(tmp_path / "lora" / "adapter_model.safetensors"))
    adapter = sum(v.numel() for k, v in state.items() if ".lora_" in k)
    weights = load_file(str(run / "adapter_model.safetensors"))
    assert adapter == sum(r * (weights[f"{p}.P"].shape[0] + weights[f"{p}.Q"].shape[1])
                          for p, r in want.items())  # r (d_out + d_in) per matrix
    left_out = len(ranks) - len(want)
    r = config["r"]
    assert (f"plain LoRA SEQ_CLS adapter: {adapter:,} adapter params over {len(want)} "
            f"matrices (ranks {min(want.values())} to {r}, {left_out} of rank 0 left out)"
            in result.output)
    assert f"r = lora_alpha = {r}: serve it with --max-lora-rank {r} or more" in result.output
    assert "plain LoRA adapter" in (tmp_path / "lora" / "README.md").read_text()

    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(FIXTURES / "tiny-bert")
    batch = dict(tok(["a good movie", "terrible acting and a plot that never ends"],
                     padding=True, return_tensors="pt"))
    ours, _, _ = load_run(run)
    want_logits = _outputs(ours.eval(), batch)
    base_config = tmp_path / "lora" / "base_config.json"
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        theirs = peft.PeftModel.from_pretrained(
            AutoModelForSequenceClassification.from_pretrained(FIXTURES / "tiny-bert",
                                                               num_labels=2),
            tmp_path / "lora").eval()
    assert not [w for w in seen if "pattern" in str(w.message)]  # every key names a module
    assert base_config.is_file()
    got = _outputs(theirs, batch)
    with theirs.disable_adapter():
        assert (_outputs(theirs, batch) - want_logits).abs().max() > 1e-2
    torch.testing.assert_close(got, want_logits, atol=1e-5, rtol=0)
    assert _export(run, "merged", tmp_path / "merged").exit_code == 0
    merged = AutoModelForSequenceClassification.from_pretrained(tmp_path / "merged").eval()
    torch.testing.assert_close(_outputs(merged, batch), got, atol=1e-5, rtol=0)


def test_a_run_that_is_no_plain_lora_is_refused_in_one_line(smoke_runs, tmp_path):
    houlsby = smoke_runs("configs/smoke/glue.yaml", "method.name=houlsby", "train.max_steps=2",
                         "train.eval_every=null")  # as tests/artifacts/test_export.py
    dora = smoke_runs("configs/smoke/glue.yaml", "method.name=dora", "train.max_steps=4",
                      "train.eval_every=null", "adalora.t_init=1", "adalora.t_final=2",
                      "adalora.delta_t=1")  # as tests/artifacts/test_export_baselines.py
    for run, words in [(houlsby, "method 'houlsby' cannot be written as plain LoRA"),
                       (dora, "the run's DoRALinear layers cannot be written as plain LoRA")]:
        result = _export(run, "lora", tmp_path / "out")
        assert result.exit_code == 2, result.output
        assert words in result.output and "Traceback" not in result.output
        assert len(result.output.strip().splitlines()) == 1
        assert not (tmp_path / "out").exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == []


def test_a_run_pruned_to_nothing_is_refused(pruned_run, tmp_path):
    run = copy_of(pruned_run, tmp_path / "run")
    path = run / "adapter_model.safetensors"
    state = load_file(str(path))
    save_file({k: v * 0 if k.endswith(".lam") else v for k, v in state.items()}, str(path))
    result = _export(run, "lora", tmp_path / "out")
    assert result.exit_code == 2, result.output
    assert "every adapted matrix of the run has rank 0 (12 matrices)" in result.output
    assert "use --format merged" in result.output
    assert len(result.output.strip().splitlines()) == 1
    assert sorted(p.name for p in tmp_path.iterdir()) == ["run"]
    shutil.rmtree(run)


def test_the_documented_alpha_of_0_is_what_the_gguf_tool_writes(tmp_path):
    """docs/using-a-run.md sets a converted adapter's alpha to 0 with `gguf-set-metadata`
    (llama.cpp then applies the folded factors at scale 1): run that step on an adapter GGUF
    written as llama.cpp's converter writes one, and read the alpha back."""
    import gguf  # the gguf extra, which make install installs
    docs = (ROOT / "docs" / "using-a-run.md").read_text()
    (line,) = [x for x in docs.splitlines() if x.startswith("gguf-set-metadata ")]
    _, file, key, value, *flags = line.split()
    path = tmp_path / file
    writer = gguf.GGUFWriter(str(path), "llama")
    writer.add_type(gguf.GGUFType.ADAPTER)
    writer.add_string(gguf.Keys.Adapter.TYPE, "lora")
    writer.add_float32(gguf.Keys.Adapter.LORA_ALPHA, 16.0)
    writer.add_tensor("blk.0.attn_q.weight.lora_a", torch.ones(2, 8).numpy())
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    assert key == gguf.Keys.Adapter.LORA_ALPHA
    subprocess.run([sys.executable, "-m", "gguf.scripts.gguf_set_metadata", str(path), key,
                    value, *flags], check=True, capture_output=True)
    field = gguf.GGUFReader(str(path)).get_field(key)
    assert float(field.parts[field.data[0]][0]) == 0.0
