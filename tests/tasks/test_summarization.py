"""Summarization task on the tiny BART fixture: encoding, label masking in the loss,
generation, every method on an encoder-decoder, BART-large's matrix count, and errors."""

from __future__ import annotations

import contextlib
import json
import math

import pytest
import torch
from transformers import AutoModelForSeq2SeqLM, BartConfig, RobertaConfig

from adalora_cli.config import ConfigError, from_dict, load_config
from adalora_cli.methods import apply_method
from adalora_cli.methods.adapters import HoulsbyAdapter, PfeifferAdapter
from adalora_cli.methods.allocator import check_schedule
from adalora_cli.rundir.layout import PREDICTIONS_JSONL as PREDICTIONS
from adalora_cli.tasks import get_task
from adalora_cli.tasks.summarization import LABEL_PAD, pad_batch
from tests.conftest import FIXTURES, ROOT

TINY_BART = FIXTURES / "tiny-bart"
XSUM = FIXTURES / "summarization" / "xsum"
CNN = FIXTURES / "summarization" / "cnn_dailymail"
PAD, BOS, EOS = 1, 0, 2  # the tiny BART tokenizer's <pad>, <s>, </s>
CPU = torch.device("cpu")


def make_task(name: str = "xsum", data_dir=XSUM, model=TINY_BART, **task):
    cfg = from_dict({"task": {"name": name, "data_dir": str(data_dir), **task},
                     "model": {"name_or_path": str(model)}})
    return get_task(cfg)


@pytest.fixture(scope="module")
def loaded():
    torch.manual_seed(0)
    task = make_task(max_length=24, max_target_length=8, num_beams=2, generation_max_length=6,
                     generation_min_length=2)
    model, tokenizer = task.build_model()
    return task, model, tokenizer, task.load_data(tokenizer)


def read_jsonl(path):
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_sources_and_summaries_are_truncated(loaded):
    _, _, _, data = loaded
    assert len(data.train) == 32 and len(data.eval_splits["validation"]) == 8
    for row in data.train:
        assert len(row["input_ids"]) <= 24 and len(row["labels"]) <= 8
        assert row["input_ids"][0] == BOS and row["input_ids"][-1] == EOS
        assert row["labels"][-1] == EOS  # truncation keeps the end-of-summary token
    # every fixture document is longer than 24 tokens
    assert all(len(row["input_ids"]) == 24 for row in data.train)
    assert "reference" not in data.train.column_names


def test_eval_split_keeps_ids_and_full_references(loaded):
    _, _, _, data = loaded
    raw = read_jsonl(XSUM / "validation.jsonl")
    val = data.eval_splits["validation"]
    assert list(val["id"]) == [r["id"] for r in raw] and val["id"][0] == "40000000"
    assert list(val["reference"]) == [r["summary"] for r in raw]  # untruncated text


def test_collate_pads_labels_with_ignore_index():
    items = [{"input_ids": [0, 5, 2], "attention_mask": [1, 1, 1], "labels": [7, 2]},
             {"input_ids": [0, 2], "attention_mask": [1, 1], "labels": [7, 8, 9, 2]}]
    batch = pad_batch(items, pad_id=PAD)
    assert batch["input_ids"].tolist() == [[0, 5, 2], [0, 2, PAD]]
    assert batch["attention_mask"].tolist() == [[1, 1, 1], [1, 1, 0]]
    assert batch["labels"].tolist() == [[7, 2, -100, -100], [7, 8, 9, 2]]
    assert LABEL_PAD == -100


def test_loss_ignores_label_padding(loaded):
    _, model, _, data = loaded
    model.eval()
    items = [data.train[0], {**data.train[1], "labels": data.train[1]["labels"][:3]}]
    batch = data.collate(items)
    labels = batch["labels"]
    assert (labels == -100).sum() == len(items[0]["labels"]) - 3  # padding happened
    with torch.no_grad():
        out = model(**batch)
        # cross-entropy written out: mean over the labelled positions only
        logp = out.logits.log_softmax(-1)
        terms = [-logp[b, t, labels[b, t]] for b in range(labels.shape[0])
                 for t in range(labels.shape[1]) if labels[b, t] != -100]
        assert out.loss.item() == pytest.approx(torch.stack(terms).mean().item(), rel=1e-5)
        # and the short example's logits are what it gets alone, without padding
        alone = model(**data.collate([items[1]])).logits[0]
        assert torch.allclose(out.logits[1, :3], alone, atol=1e-5)


def test_generation_produces_text_for_every_example(loaded, tmp_path, monkeypatch):
    task, model, _, data = loaded
    val = data.eval_splits["validation"]
    shapes = []
    generate = model.generate

    def spy(**kwargs):
        out = generate(**kwargs)
        shapes.append((kwargs["num_beams"], out.shape))
        return out

    monkeypatch.setattr(model, "generate", spy)
    model.train()
    metrics = task.evaluate(model, "validation", val, batch_size=3, collate=data.collate,
                            device=CPU, autocast=contextlib.nullcontext)
    assert model.training  # train mode restored after generating
    assert [n for n, _ in shapes] == [2, 2, 2]  # 8 examples in batches of 3, 2 beams
    assert [s[0] for _, s in shapes] == [3, 3, 2]
    assert all(s[1] <= 1 + 6 for _, s in shapes)  # decoder start + at most 6 new tokens
    assert set(metrics) == {"rouge1", "rouge2", "rougeL", "rougeLsum"}
    assert all(isinstance(v, float) and 0.0 <= v <= 100.0 for v in metrics.values())
    rows = task.predictions["validation"]
    assert len(rows) == 8 and all(r["prediction"].strip() for r in rows)
    (path,) = task.save_predictions(tmp_path)
    assert path.name == PREDICTIONS
    saved = read_jsonl(path)
    assert [r["id"] for r in saved] == list(val["id"])
    assert [r["reference"] for r in saved] == list(val["reference"])
    assert all(set(r) == {"id", "prediction", "reference"} for r in saved)


def test_cnn_columns_and_multiline_highlights():
    task = make_task("cnn_dailymail", CNN, max_length=32, max_target_length=16)
    _, tokenizer = task.build_model()
    val = task.load_data(tokenizer).eval_splits["validation"]
    assert len(val) == 6 and all(len(i) == 40 for i in val["id"])  # hex ids kept as text
    assert all(r.count("\n") == 2 for r in val["reference"])


@pytest.mark.parametrize("method", ["adalora", "lora", "houlsby", "pfeiffer", "bitfit", "full"])
def test_every_method_trains_on_bart(loaded, method):
    _, _, tokenizer, data = loaded
    torch.manual_seed(0)
    model = AutoModelForSeq2SeqLM.from_pretrained(TINY_BART)
    cfg = from_dict({"method": {"name": method}, "adalora": {"init_rank": 2},
                     "lora": {"r": 2}, "adapter": {"dim": 4}})
    handle = apply_method(model, cfg, None)
    loss = model(**data.collate([data.train[i] for i in range(4)])).loss
    loss.backward()
    assert any(p.grad is not None and p.grad.abs().sum() > 0 for p in handle.adapter)
    assert all(p.grad is None for p in model.parameters() if not p.requires_grad)


def test_houlsby_and_pfeiffer_sit_in_encoder_and_decoder_layers():
    model = AutoModelForSeq2SeqLM.from_pretrained(TINY_BART)
    handle = apply_method(model, from_dict({"method": {"name": "houlsby"},
                                            "adapter": {"dim": 4}}), None)
    houlsby = [p for p, m in model.named_modules() if isinstance(m, HoulsbyAdapter)]
    # 2 encoder + 2 decoder layers, one after self-attention and one after the FFN each
    assert sorted(houlsby) == sorted(f"model.{stack}.layers.{i}.{site}"
                                     for stack in ("encoder", "decoder") for i in range(2)
                                     for site in ("self_attn.out_proj", "fc2"))
    # down (4 x 32 + 4) + up (32 x 4 + 32) = 292 per adapter
    assert handle.adapter_params == 8 * 292
    model = AutoModelForSeq2SeqLM.from_pretrained(TINY_BART)
    apply_method(model, from_dict({"method": {"name": "pfeiffer"}, "adapter": {"dim": 4}}), None)
    pfeiffer = [p for p, m in model.named_modules() if isinstance(m, PfeifferAdapter)]
    assert sorted(pfeiffer) == sorted(f"model.{s}.layers.{i}.fc2"
                                      for s in ("encoder", "decoder") for i in range(2))


def test_lora_r8_on_bart_large_seq2seq_is_4_3m():
    # Table 3's 1.10% level; the classification-head variant is in tests/methods/test_inject.
    config = BartConfig(d_model=1024, encoder_layers=12, decoder_layers=12,
                        encoder_ffn_dim=4096, decoder_ffn_dim=4096, encoder_attention_heads=16,
                        decoder_attention_heads=16, vocab_size=50265)
    with torch.device("meta"):  # shapes only: nothing allocated or downloaded
        model = AutoModelForSeq2SeqLM.from_config(config)
    handle = apply_method(model, from_dict({"method": {"name": "lora"}, "lora": {"r": 8}}), None)
    assert handle.n_matrices == 192  # 12 x 6 encoder + 12 x 10 decoder (cross-attention too)
    # 8 (d_in + d_out) per matrix; an encoder + decoder layer pair holds 12 attention
    # projections (4 self, 4 self, 4 cross) of 1024 + 1024 and 4 FFN matrices of 1024 + 4096
    assert handle.adapter_params == 12 * 8 * (12 * 2048 + 4 * 5120) == 4_325_376
    assert handle.head_params == 0  # the LM head is tied to the embeddings


def test_config_errors_are_one_line_and_name_the_fix(tmp_path):
    with pytest.raises(ConfigError, match="task.num_beams must be >= 1"):
        make_task(num_beams=0)
    with pytest.raises(ConfigError, match="generation_min_length"):
        make_task(generation_max_length=4, generation_min_length=5)
    bad = tmp_path / "bad"
    bad.mkdir()
    (bad / "train.jsonl").write_text('{"text": "a", "summary": "b"}\n')
    (bad / "validation.jsonl").write_text('{"text": "a", "summary": "b"}\n')
    task = make_task(data_dir=bad)
    _, tokenizer = task.build_model()
    with pytest.raises(ConfigError, match="lacks column 'document'") as err:
        task.load_data(tokenizer)
    assert "\n" not in str(err.value)
    encoder_only = tmp_path / "roberta"
    RobertaConfig(vocab_size=10, hidden_size=8, num_hidden_layers=1, num_attention_heads=2,
                  intermediate_size=8).save_pretrained(encoder_only)
    with pytest.raises(ConfigError, match="cannot generate summaries"):
        make_task(model=encoder_only).build_model()


@pytest.mark.parametrize("name, n_train, lr, batch, epochs, t_i, t_f, lengths, beams", [
    ("xsum", 204_045, 5e-4, 64, 25, 6000, 50000, (768, 64), 8),
    ("cnn_dailymail", 287_113, 5e-4, 32, 15, 5000, 85000, (1024, 160), 4),
])
def test_paper_configs_carry_spec_values(name, n_train, lr, batch, epochs, t_i, t_f, lengths,
                                         beams):
    cfg = load_config(ROOT / "configs" / "summarization" / f"{name}.yaml")
    a, t, task = cfg.adalora, cfg.train, cfg.task
    assert (task.name, cfg.model.name_or_path) == (name, "facebook/bart-large")
    assert (t.learning_rate, t.batch_size * t.grad_accum, t.epochs) == (lr, batch, epochs)
    assert (a.gamma, a.t_init, a.delta_t, a.t_final, a.alpha) == (0.1, t_i, 100, t_f, 32)
    assert (task.max_length, task.max_target_length, task.num_beams) == (*lengths, beams)
    # mean final rank 8 over 192 matrices; r0 = ceil(1.5 x 8); LoRA r = 8
    # (docs/maths.md#budget-levels)
    assert (a.budget, a.init_rank, cfg.lora.r) == (192 * 8, 12, 8)
    T = math.ceil(n_train / batch) * epochs
    assert T > t_i + t_f
    check_schedule(192 * a.init_rank, a.budget, a.t_init, a.t_final, T)  # does not raise
