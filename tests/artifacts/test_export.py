"""``adalora export``: PEFT and merged folders loaded by the real PEFT / transformers.

Runs are trained through the CLI on the tiny fixtures (a few optimizer steps). The tiny
models learn little in that time, so each trained run's adapter is amplified in its weights
file (masked singular values stay exactly zero) to make Delta W move the logits far more
than the 1e-5 the exports must match: a wrong scaling or a dropped triplet would show.
"""

from __future__ import annotations

import json
from pathlib import Path

import peft  # the `test` extra (make test installs it): the real library, offline
import pytest
import torch
from safetensors.torch import load_file, save_file
from transformers import AutoModelForSeq2SeqLM, AutoModelForSequenceClassification
from typer.testing import CliRunner

from adalora_cli.artifacts.load import load_run
from adalora_cli.cli import app
from tests.conftest import copy_of

# PEFT applies an AdaLoRA rank_pattern while loading the weights, after its generic LoRA
# injection has warned that the pattern's keys name no module; its own saved adapters warn
# the same way.
pytestmark = pytest.mark.filterwarnings("ignore:The following rank_pattern keys")

ROOT = Path(__file__).resolve().parents[2]
TINY_BERT = str(ROOT / "tests/fixtures/tiny-bert")
TINY_BART = str(ROOT / "tests/fixtures/tiny-bart")

RUNS = {
    "bert-adalora": ("configs/smoke/glue.yaml", ["train.max_steps=12", "adalora.t_init=2",
                                                 "adalora.t_final=4", "train.eval_every=null"]),
    "bert-lora": ("configs/smoke/glue.yaml", ["method.name=lora", "train.max_steps=4",
                                              "train.eval_every=null"]),
    "bart-adalora": ("configs/smoke/summarization.yaml", [
        "train.max_steps=6", "adalora.t_init=1", "adalora.t_final=2", "task.max_eval_samples=2"]),
    "bart-lora": ("configs/smoke/summarization.yaml", [
        "method.name=lora", "train.max_steps=2", "task.max_eval_samples=2"]),
    "bert-squad-lora": ("configs/smoke/squad.yaml", ["method.name=lora", "train.max_steps=3",
                                                     "train.eval_every=null"]),
    "bert-houlsby": ("configs/smoke/glue.yaml", ["method.name=houlsby", "train.max_steps=2",
                                                 "train.eval_every=null"]),
}


def amplify(run_dir: Path, factor: float) -> None:
    """Scale lam, P, Q (AdaLoRA) or B (LoRA) in the run's weights: a larger Delta W of the
    same rank pattern (masked singular values stay 0)."""
    path = run_dir / "adapter_model.safetensors"
    state = load_file(str(path))
    for name in state:
        if name.endswith((".lam", ".B")):
            state[name] = state[name] * factor
        elif name.endswith((".P", ".Q")):
            state[name] = state[name] * 5.0
    save_file(state, str(path))


@pytest.fixture(scope="module")
def runs(smoke_runs, tmp_path_factory):
    root = tmp_path_factory.mktemp("runs")
    out = {}
    for name, (config, overrides) in RUNS.items():
        out[name] = smoke_runs(config, *overrides)
        if "houlsby" not in name:  # amplify rewrites the weights: on a copy
            out[name] = copy_of(out[name], root / name)
            amplify(out[name], 40.0)
    return out


def export(run: Path, fmt: str, dest: Path):
    with pytest.MonkeyPatch.context() as mp:
        mp.chdir(ROOT)
        return CliRunner().invoke(app, ["export", str(run), str(dest), "--format", fmt])


def cls_batch():
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(TINY_BERT)
    return tok(["a good movie", "terrible acting and a plot that never ends"], padding=True,
               return_tensors="pt")


def seq2seq_batch():
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(TINY_BART)
    return tok(["the cat sat on the mat while the dog ran", "news of the day"], padding=True,
               return_tensors="pt")


@torch.no_grad()
def ours_logits(run: Path, batch, **kw):
    model, _, _ = load_run(run)
    return model.eval()(**batch, **kw).logits


@pytest.mark.parametrize("method", ["adalora", "lora"])
def test_peft_export_of_bert_classifier_loads_with_peft_and_matches(runs, tmp_path, method):
    run = runs[f"bert-{method}"]
    result = export(run, "peft", tmp_path / "peft")
    assert result.exit_code == 0, result.output
    batch = cls_batch()
    ref = ours_logits(run, batch)
    base = AutoModelForSequenceClassification.from_pretrained(TINY_BERT, num_labels=2)
    model = peft.PeftModel.from_pretrained(base, tmp_path / "peft").eval()
    with torch.no_grad():
        got = model(**batch).logits
        with model.disable_adapter():
            without = model(**batch).logits
    assert torch.allclose(got, ref, atol=1e-5, rtol=0)
    # the adapters really matter: without them the logits are far from ours
    assert (without - ref).abs().max() > 1e-2
    config = json.loads((tmp_path / "peft" / "adapter_config.json").read_text())
    assert config["peft_type"] == method.upper()
    assert config["task_type"] == "SEQ_CLS" and config["modules_to_save"] == ["classifier"]


def test_adalora_peft_export_is_compact(runs, tmp_path):
    run = runs["bert-adalora"]
    result = export(run, "peft", tmp_path / "peft")
    assert result.exit_code == 0, result.output
    summary = json.loads((run / "summary.json").read_text())
    ranks = json.loads((run / "rank_pattern.json").read_text())
    config = json.loads((tmp_path / "peft" / "adapter_config.json").read_text())
    assert (config["init_r"], config["lora_alpha"]) == (4, 8)
    assert config["target_modules"] == list(ranks)
    # one keep-flag per initial triplet; kept flags per matrix = its final rank
    pattern = {k.removesuffix(".lora_E"): v for k, v in config["rank_pattern"].items()}
    assert {k: (len(v), sum(v)) for k, v in pattern.items()} == {k: (4, r) for k, r in
                                                                  ranks.items()}
    state = load_file(str(tmp_path / "peft" / "adapter_model.safetensors"))
    adapter = {k: v for k, v in state.items() if ".lora_" in k}
    for path, r in ranks.items():
        key = f"base_model.model.{path}"
        assert state[f"{key}.lora_E"].shape == (r, 1)
        assert state[f"{key}.lora_A"].shape[0] == state[f"{key}.lora_B"].shape[1] == r
    # the file holds exactly the kept triplets: the paper's "# Params" of the run
    assert sum(v.numel() for v in adapter.values()) == summary["final_adapter_params"]
    assert f"{summary['final_adapter_params']:,} adapter params (of 3,200 at r0)" in result.output


@pytest.mark.parametrize("method", ["adalora", "lora"])
def test_peft_export_of_bart_generates_the_same_ids(runs, tmp_path, method):
    run = runs[f"bart-{method}"]
    result = export(run, "peft", tmp_path / "peft")
    assert result.exit_code == 0, result.output
    batch = seq2seq_batch()
    ours, _, _ = load_run(run)
    base = AutoModelForSeq2SeqLM.from_pretrained(TINY_BART)
    theirs = peft.PeftModel.from_pretrained(base, tmp_path / "peft").eval()
    kw = {"max_new_tokens": 12, "num_beams": 2, "do_sample": False}
    with torch.no_grad():
        ref_ids = ours.eval().generate(**batch, **kw)
        got_ids = theirs.generate(**batch, **kw)
        ref = ours(**batch, decoder_input_ids=ref_ids).logits
        got = theirs(**batch, decoder_input_ids=ref_ids).logits
        with theirs.disable_adapter():
            without = theirs(**batch, decoder_input_ids=ref_ids).logits
    assert torch.equal(got_ids, ref_ids)
    assert torch.allclose(got, ref, atol=1e-5, rtol=0)
    assert (without - ref).abs().max() > 1e-2
    assert json.loads((tmp_path / "peft" / "adapter_config.json").read_text())[
        "task_type"] == "SEQ_2_SEQ_LM"


def test_peft_export_of_a_bert_span_head_matches(runs, tmp_path):
    from transformers import AutoModelForQuestionAnswering, AutoTokenizer

    run = runs["bert-squad-lora"]
    result = export(run, "peft", tmp_path / "peft")
    assert result.exit_code == 0, result.output
    tok = AutoTokenizer.from_pretrained(TINY_BERT)
    batch = tok(["who sat on the mat ?"], ["the cat sat on the mat all day"],
                return_tensors="pt")  # a pair: segment ids matter
    model, _, _ = load_run(run)
    base = AutoModelForQuestionAnswering.from_pretrained(TINY_BERT)
    theirs = peft.PeftModel.from_pretrained(base, tmp_path / "peft").eval()
    with torch.no_grad():
        ref, got = model.eval()(**batch), theirs(**batch)
    assert torch.allclose(got.start_logits, ref.start_logits, atol=1e-5, rtol=0)
    assert torch.allclose(got.end_logits, ref.end_logits, atol=1e-5, rtol=0)
    config = json.loads((tmp_path / "peft" / "adapter_config.json").read_text())
    assert config["modules_to_save"] == ["qa_outputs"]


@pytest.mark.parametrize("name, auto", [("bert-adalora", AutoModelForSequenceClassification),
                                        ("bert-lora", AutoModelForSequenceClassification),
                                        ("bart-adalora", AutoModelForSeq2SeqLM)])
def test_merged_export_is_a_plain_transformers_model(runs, tmp_path, name, auto):
    run = runs[name]
    result = export(run, "merged", tmp_path / "merged")
    assert result.exit_code == 0, result.output
    batch = cls_batch() if name.startswith("bert") else seq2seq_batch()
    kw = {} if name.startswith("bert") else {"decoder_input_ids": batch["input_ids"][:, :5]}
    ref = ours_logits(run, batch, **kw)
    merged = auto.from_pretrained(tmp_path / "merged").eval()
    with torch.no_grad():
        got = merged(**batch, **kw).logits
    assert torch.allclose(got, ref, atol=1e-5, rtol=0)
    names = load_file(str(tmp_path / "merged" / "model.safetensors"))
    assert not [k for k in names if k.endswith((".P", ".Q", ".lam", ".A", ".B", ".base.weight"))]
    assert (tmp_path / "merged" / "tokenizer_config.json").is_file()


def test_export_facts_are_recorded_in_the_summary(runs):
    facts = json.loads((runs["bert-adalora"] / "summary.json").read_text())["export"]
    ranks = json.loads((runs["bert-adalora"] / "rank_pattern.json").read_text())
    assert facts["base_model"] == "tests/fixtures/tiny-bert"
    assert facts["model_class"] == "BertForSequenceClassification"
    assert facts["target_modules"] == list(ranks) and len(ranks) == 12
    assert facts["head_modules"] == ["classifier"]
    assert facts["hyperparameters"]["budget"] == 16
    assert facts["hyperparameters"]["init_rank"] == 4
    assert "revision" in facts


def _left_behind(parent: Path) -> list[str]:
    return sorted(p.name for p in parent.iterdir())


def test_export_bad_input_is_one_line_and_writes_nothing(runs, tmp_path):
    run = runs["bert-lora"]
    cases = [
        (tmp_path / "missing-run", "peft", "does not exist"),
        (run, "onnx", "unknown export format 'onnx'"),
        (runs["bert-houlsby"], "peft", "PEFT has no format for method 'houlsby'"),
        (runs["bert-houlsby"], "merged", "method 'houlsby' cannot be merged"),
    ]
    for source, fmt, message in cases:
        result = export(source, fmt, tmp_path / "out")
        assert result.exit_code == 2, result.output
        assert message in result.output and "Traceback" not in result.output
        assert len(result.output.strip().splitlines()) == 1
        assert not (tmp_path / "out").exists()
    # an existing output folder is never overwritten
    (tmp_path / "taken").mkdir()
    result = export(run, "merged", tmp_path / "taken")
    assert result.exit_code == 2 and "already exists" in result.output
    assert not any((tmp_path / "taken").iterdir())
    # a run that has not finished
    unfinished = tmp_path / "unfinished"
    unfinished.mkdir()
    (unfinished / "status.json").write_text('{"status": "running"}')
    result = export(unfinished, "peft", tmp_path / "out")
    assert result.exit_code == 2 and "not a finished run (status: running)" in result.output
    assert _left_behind(tmp_path) == ["taken", "unfinished"]


@pytest.mark.slow
def test_warm_started_demo_model_exports_merged_not_peft(tmp_path):
    """The BBC demo's BART is built from the MiniLM BERT: PEFT has no base to load, the
    merged folder is the whole model."""
    run = tmp_path / "bbc"
    with pytest.MonkeyPatch.context() as mp:
        mp.chdir(ROOT)
        result = CliRunner().invoke(app, [
            "train", "configs/demo/bbc_news.yaml", "train.max_steps=2",
            "task.max_train_samples=8", "task.max_eval_samples=2", "adalora.t_init=0",
            "adalora.t_final=1", "--run-dir", str(run), "--quiet"])
    assert result.exit_code == 0, result.output
    result = export(run, "peft", tmp_path / "peft")
    assert result.exit_code == 2 and "use --format merged" in result.output
    assert not (tmp_path / "peft").exists()
    result = export(run, "merged", tmp_path / "merged")
    assert result.exit_code == 0, result.output
    model, tok, _ = load_run(run)
    enc = tok(["the government said on monday that taxes will rise"], return_tensors="pt")
    batch = {"input_ids": enc["input_ids"], "attention_mask": enc["attention_mask"],
             "decoder_input_ids": enc["input_ids"][:, :4]}
    merged = AutoModelForSeq2SeqLM.from_pretrained(tmp_path / "merged").eval()
    with torch.no_grad():
        assert torch.allclose(merged(**batch).logits, model.eval()(**batch).logits, atol=1e-5,
                              rtol=0)


def test_the_documented_filter_quiets_peft_on_an_adalora_export(runs, tmp_path):
    """PEFT warns about AdaLoRA's rank_pattern keys (its own adapters' format) on every
    load; docs/using-a-run.md gives a filter, and that exact filter silences it, while the
    ranks still apply (the loaded logits are ours)."""
    import re
    import warnings

    docs = (ROOT / "docs" / "using-a-run.md").read_text()
    (call,) = re.findall(r"^warnings\.filterwarnings\((.*)\)$", docs, flags=re.M)
    message = re.search(r'message="([^"]+)"', call).group(1)
    run = runs["bert-adalora"]
    result = export(run, "peft", tmp_path / "peft")
    assert result.exit_code == 0 and "docs/using-a-run.md" in result.output
    batch = cls_batch()

    def load(quiet: bool):
        with warnings.catch_warnings(record=True) as seen:
            warnings.simplefilter("always")
            if quiet:
                warnings.filterwarnings("ignore", message=message, category=RuntimeWarning)
            base = AutoModelForSequenceClassification.from_pretrained(TINY_BERT, num_labels=2)
            model = peft.PeftModel.from_pretrained(base, tmp_path / "peft").eval()
        return model, [str(w.message) for w in seen if "rank_pattern" in str(w.message)]

    _, loud = load(quiet=False)
    assert len(loud) == 1 and ".lora_E" in loud[0]  # PEFT's check, our keys in its format
    model, quiet = load(quiet=True)
    assert quiet == []
    with torch.no_grad():
        assert torch.allclose(model(**batch).logits, ours_logits(run, batch), atol=1e-5, rtol=0)
