"""train.length_split: a batch run as length-sorted pieces, each padded on its own, gives
the gradient of the whole batch's mean loss (dropout off), with fewer padded tokens."""

from __future__ import annotations

import random

import pytest
import torch
from transformers import (
    AutoModelForSeq2SeqLM,
    AutoModelForSequenceClassification,
    AutoTokenizer,
    DataCollatorWithPadding,
)

from adalora_cli.engine.split import LengthSplit, loss_units
from adalora_cli.tasks.summarization import pad_batch


def bert_items(tokenizer, n: int, seed: int = 0) -> list[dict]:
    rng = random.Random(seed)
    words = "good bad plot film actor slow funny sharp dull warm".split()
    texts = [" ".join(rng.choice(words) for _ in range(rng.randint(1, 20))) for _ in range(n)]
    return [{**tokenizer(t), "labels": k % 2} for k, t in enumerate(texts)]


def bart_items(n: int, seed: int = 0) -> list[dict]:
    rng = random.Random(seed)
    items = []
    for _ in range(n):
        src, tgt = rng.randint(3, 30), rng.randint(2, 12)
        ids = [0] + [rng.randint(4, 90) for _ in range(src)] + [2]
        items.append({"input_ids": ids, "attention_mask": [1] * len(ids),
                      "labels": [rng.randint(4, 90) for _ in range(tgt)] + [2]})
    return items


def grads(model, pieces: list[tuple[dict, float]]) -> dict[str, torch.Tensor]:
    """What the loop accumulates: sum over pieces of share x the piece's mean loss."""
    model.zero_grad(set_to_none=True)
    for batch, share in pieces:
        (model(**batch).loss * share).backward()
    return {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}


def padded_tokens(pieces) -> int:
    return sum(b["input_ids"].numel() for b, _ in pieces)


def test_one_piece_is_the_collate_functions_batch_untouched(tiny_bert):
    tokenizer = AutoTokenizer.from_pretrained(tiny_bert)
    items, collate = bert_items(tokenizer, 9), DataCollatorWithPadding(tokenizer)
    [(batch, share)] = LengthSplit(collate, 1)(items)
    reference = collate(items)
    assert share == 1.0 and batch.keys() == reference.keys()
    assert all(torch.equal(batch[k], reference[k]) for k in batch)


def test_pieces_are_sorted_cover_the_batch_once_and_pad_less(tiny_bert):
    tokenizer = AutoTokenizer.from_pretrained(tiny_bert)
    items, collate = bert_items(tokenizer, 10), DataCollatorWithPadding(tokenizer)
    pieces = LengthSplit(collate, 4)(items)
    sizes = [len(b["input_ids"]) for b, _ in pieces]
    assert sizes == [2, 3, 2, 3]  # n=10 cut at (j*10)//4 = 0, 2, 5, 7, 10
    assert [s for _, s in pieces] == pytest.approx([0.2, 0.3, 0.2, 0.3])
    lengths = sorted((len(i["input_ids"]) for i in items), reverse=True)
    widths = [b["input_ids"].shape[1] for b, _ in pieces]
    assert widths == [lengths[0], lengths[2], lengths[5], lengths[7]]  # each its own longest
    seen = sorted(tuple(row[m.bool()].tolist()) for b, _ in pieces
                  for row, m in zip(b["input_ids"], b["attention_mask"]))
    assert seen == sorted(tuple(i["input_ids"]) for i in items)
    assert padded_tokens(pieces) < padded_tokens(LengthSplit(collate, 1)(items))
    # more pieces than examples: one example per piece
    assert len(LengthSplit(collate, 8)(items[:3])) == 3


def test_classification_gradient_is_the_whole_batchs(tiny_bert):
    torch.manual_seed(0)
    model = AutoModelForSequenceClassification.from_pretrained(tiny_bert, num_labels=2).eval()
    tokenizer = AutoTokenizer.from_pretrained(tiny_bert)
    items, collate = bert_items(tokenizer, 12, seed=3), DataCollatorWithPadding(tokenizer)
    whole = grads(model, [(collate(items), 1.0)])
    split = grads(model, LengthSplit(collate, 3)(items))
    assert whole.keys() == split.keys()
    for name in whole:
        torch.testing.assert_close(split[name], whole[name], rtol=1e-4, atol=1e-6)


def test_sequence_loss_pieces_are_weighted_by_target_tokens(fixtures):
    model = AutoModelForSeq2SeqLM.from_pretrained(fixtures / "tiny-bart").eval()
    items = bart_items(10, seed=1)

    def collate(chunk):
        return pad_batch(chunk, pad_id=1)

    pieces = LengthSplit(collate, 3)(items)
    # by hand: sort by source length (stable, longest first), cut 10 at 0, 3, 6, 10
    ranked = sorted(items, key=lambda i: -len(i["input_ids"]))
    tokens = [sum(len(i["labels"]) for i in ranked[a:b]) for a, b in ((0, 3), (3, 6), (6, 10))]
    assert [loss_units(b) for b, _ in pieces] == tokens
    assert [s for _, s in pieces] == pytest.approx([t / sum(tokens) for t in tokens])
    whole = grads(model, [(collate(items), 1.0)])
    split = grads(model, pieces)
    for name in whole:
        torch.testing.assert_close(split[name], whole[name], rtol=1e-4, atol=1e-6)
    # weighting by examples instead would be a different gradient: the test can tell
    by_examples = grads(model, [(b, len(b["input_ids"]) / len(items)) for b, _ in pieces])
    assert any(not torch.allclose(by_examples[n], whole[n], rtol=1e-3, atol=1e-6)
               for n in whole)


def test_loss_units_counts_examples_or_target_tokens():
    assert loss_units({"input_ids": torch.ones(5, 7), "labels": torch.zeros(5)}) == 5
    labels = torch.tensor([[3, 4, -100], [5, -100, -100]])
    assert loss_units({"input_ids": torch.ones(2, 4), "labels": labels}) == 3
    # span extraction: a mean over examples
    assert loss_units({"input_ids": torch.ones(4, 9), "start_positions": torch.zeros(4)}) == 4


@pytest.mark.e2e
def test_a_split_run_resumes_exactly(smoke, tmp_path):
    from .conftest import forked, same_outputs

    straight, killed = tmp_path / "a", tmp_path / "b"
    args = ("train.length_split=3", "train.save_every=5")  # dropout on: draws per piece
    assert forked(smoke(straight, *args)) == 0
    assert forked(smoke(killed, *args), "kill@step=13") == -9
    assert forked(["train", "--resume", str(killed), "--quiet"]) == 0
    assert same_outputs(straight, killed) == []


@pytest.mark.parametrize("value", ["0", "9"])
def test_a_split_outside_one_to_batch_size_is_one_line(smoke, tmp_path, value):
    from typer.testing import CliRunner

    from adalora_cli.cli import app

    result = CliRunner().invoke(app, smoke(tmp_path / "run", f"train.length_split={value}"))
    assert result.exit_code == 2
    assert result.output.strip().splitlines() == [  # one line, no traceback
        "error: train.length_split must lie between 1 and train.batch_size (8), got "
        f"{value}"]
    assert not (tmp_path / "run").exists()
