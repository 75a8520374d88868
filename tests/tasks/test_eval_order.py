"""Length-sorted evaluation: the batch plan, order restoration, and the same predictions
and metrics as scoring every row alone (no padding at all) on the fixtures, for
classification, SQuAD windows and summarization generation."""

from __future__ import annotations

import contextlib

import numpy as np
import pandas as pd
import pytest
import torch
from sklearn.metrics import accuracy_score

from adalora_cli.config import from_dict
from adalora_cli.tasks import eval_order, get_task, squad_postprocess
from tests.conftest import FIXTURES

TINY_BERT = str(FIXTURES / "tiny-bert")
CPU = torch.device("cpu")
NULL = contextlib.nullcontext


# --------------------------------------------------------------------------- the plan


def test_batches_run_longest_first_and_ties_keep_data_order():
    lengths = [3, 9, 5, 9, 1, 5, 7]
    assert eval_order.sorted_batches(lengths, 3) == [[1, 3, 6], [2, 5, 0], [4]]
    assert eval_order.sorted_batches(lengths, 10) == [[1, 3, 6, 2, 5, 0, 4]]
    assert eval_order.sorted_batches([], 4) == []
    with pytest.raises(ValueError, match="batch_size"):
        eval_order.sorted_batches(lengths, 0)


def test_restore_puts_every_output_back_on_its_row():
    lengths = [4, 2, 8, 6, 2, 8, 1, 3]
    batches = eval_order.sorted_batches(lengths, 3)
    rows = [i for b in batches for i in b]
    assert sorted(rows) == list(range(8)) and rows != list(range(8))
    produced = [f"row{i}" for i in rows]  # what a model would emit batch after batch
    assert eval_order.restore_order(produced, batches) == [f"row{i}" for i in range(8)]
    arr = np.array([[i, 10 * i] for i in rows])
    assert eval_order.restore_array(arr, batches).tolist() == [[i, 10 * i] for i in range(8)]
    with pytest.raises(ValueError, match="7 outputs for 8 rows"):
        eval_order.restore_order(produced[:7], batches)


def test_sorting_cuts_padding_on_uneven_lengths():
    lengths = [5, 60, 7, 58, 6, 61, 8, 59]
    def padded(batches):
        return sum(max(lengths[i] for i in b) * len(b) for b in batches)
    in_order = [list(range(i, i + 2)) for i in range(0, 8, 2)]
    assert padded(in_order) == 2 * (60 + 58 + 61 + 59)
    assert padded(eval_order.sorted_batches(lengths, 2)) == 2 * (61 + 59 + 8 + 6)


# --------------------------------------------------------------------------- classification


def uneven_split(path, name: str) -> None:
    """The fixture's rows with 0-11 extra words appended, so lengths really differ."""
    rows = pd.read_json(FIXTURES / "glue" / "sst2" / f"{name}.jsonl", lines=True)
    rows["sentence"] = [s + " very" * (7 * i % 12) for i, s in enumerate(rows["sentence"])]
    rows.to_json(path / f"{name}.jsonl", orient="records", lines=True)


def test_classification_matches_rows_scored_alone(tmp_path):
    for split in ("train", "validation"):
        uneven_split(tmp_path, split)
    torch.manual_seed(0)
    cfg = from_dict({"task": {"name": "sst2", "data_dir": str(tmp_path)},
                     "model": {"name_or_path": TINY_BERT}})
    task = get_task(cfg)
    model, tokenizer = task.build_model()
    data = task.load_data(tokenizer)
    ds = data.eval_splits["validation"]
    lengths = eval_order.input_lengths(ds)
    assert len(set(lengths)) > 3  # the fixture really has uneven rows to reorder
    logits, labels = task.predict(model, ds, batch_size=5, collate=data.collate, device=CPU,
                                  autocast=NULL)
    model.eval()
    with torch.no_grad():
        alone = np.concatenate([model(**data.collate([ds[i]])).logits.numpy()
                                for i in range(len(ds))])
    assert labels.tolist() == list(ds["labels"])  # data order, exactly
    np.testing.assert_allclose(logits, alone, atol=1e-5)
    assert (logits.argmax(-1) == alone.argmax(-1)).all()
    metrics = task.evaluate(model, "validation", ds, batch_size=5, collate=data.collate,
                            device=CPU, autocast=NULL)
    assert metrics["accuracy"] == pytest.approx(accuracy_score(labels, alone.argmax(-1)),
                                                abs=0)


# --------------------------------------------------------------------------- QA windows


def test_squad_windows_match_windows_scored_alone():
    torch.manual_seed(0)
    cfg = from_dict({"task": {"name": "squad_v2", "data_dir": str(FIXTURES / "squad" / "v2"),
                              "max_length": 64, "doc_stride": 16},
                     "model": {"name_or_path": TINY_BERT}})
    task = get_task(cfg)
    model, tokenizer = task.build_model()
    data = task.load_data(tokenizer)
    feats = data.eval_splits["validation"]
    assert len(set(eval_order.input_lengths(feats))) > 3
    starts, ends = task.predict_logits(model, feats, batch_size=4, collate=data.collate,
                                       device=CPU, autocast=NULL)
    model.eval()
    with torch.no_grad():
        outs = [model(**data.collate([feats[i]])) for i in range(len(feats))]
    for i, out in enumerate(outs):
        n = len(feats.inputs["input_ids"][i])
        np.testing.assert_allclose(starts[i][:n], out.start_logits[0].numpy(), atol=1e-5)
        np.testing.assert_allclose(ends[i][:n], out.end_logits[0].numpy(), atol=1e-5)
    t = cfg.task
    expected = squad_postprocess.decode(
        [ex.context for ex in feats.examples], feats.example_index,
        [o.start_logits[0].numpy() for o in outs], [o.end_logits[0].numpy() for o in outs],
        feats.offsets, feats.cls_index, n_best=t.n_best, max_answer_length=t.max_answer_length,
        version_2=True, null_threshold=t.null_score_threshold)
    assert list(task.answers(feats, starts, ends).values()) == expected


# --------------------------------------------------------------------------- generation


def test_summaries_come_back_in_data_order():
    torch.manual_seed(0)
    cfg = from_dict({"task": {"name": "xsum", "data_dir": str(FIXTURES / "summarization" / "xsum"),
                              "max_length": 96, "max_target_length": 8, "num_beams": 2,
                              "generation_max_length": 6, "generation_min_length": 2},
                     "model": {"name_or_path": str(FIXTURES / "tiny-bart")}})
    task = get_task(cfg)
    model, tokenizer = task.build_model()
    data = task.load_data(tokenizer)
    val = data.eval_splits["validation"]
    lengths = eval_order.input_lengths(val)
    assert eval_order.sorted_batches(lengths, 3) != [[0, 1, 2], [3, 4, 5], [6, 7]]
    got = task.generate(model, val, batch_size=3, device=CPU, autocast=NULL)
    model.eval()
    expected = []
    with torch.no_grad():
        for i in range(len(val)):
            batch = {k: torch.tensor([val[i][k]]) for k in ("input_ids", "attention_mask")}
            ids = model.generate(**batch, **task.generation_kwargs())
            expected.append(tokenizer.decode(ids[0], skip_special_tokens=True).strip())
    assert got == expected
    task.evaluate(model, "validation", val, batch_size=3, collate=data.collate, device=CPU,
                  autocast=NULL)
    rows = task.predictions["validation"]
    assert [r["id"] for r in rows] == list(val["id"])
    assert [r["prediction"] for r in rows] == expected
