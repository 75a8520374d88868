"""PEFT's MetaMathQA -> GSM8K setup (configs/causal_lm/gsm8k_metamath.yaml) reading both
datasets as the hub lays them out (tests/fixtures/hub/dataset_repos.py): MetaMathQA's one
JSON file with its long row left out, GSM8K's ``main`` config and its test split, PEFT's
prompt, and the final-answer accuracy computed from the replies the run wrote; under
``task.holdout`` the rows of GSM8K's train split of lowest row hash, scored alike."""

from __future__ import annotations

import json

import pytest

from adalora_cli.tasks.gsm8k import TEMPLATE, accuracy
from tests.fixtures.hub.dataset_repos import METAMATH_ROWS, gsm8k_configs
from tests.tasks.test_gsm8k import lowest_hashes

from .conftest import read_jsonl

pytestmark = pytest.mark.mirror

SHORT = ["train.max_steps=4", "train.warmup_steps=1", "adalora.t_init=1", "adalora.delta_t=1",
         "adalora.t_final=1", "train.batch_size=4", "train.eval_batch_size=4",
         "task.max_length=96", "task.max_new_tokens=8", "train.precision=fp32",
         "adalora.init_rank=4", "adalora.target_rank=2"]  # the stand-in's v_proj is 16 wide


def test_metamath_trains_and_gsm8k_test_is_scored(local_hub, access_token, tmp_path):
    run = tmp_path / "run"
    done = local_hub.run("train", "configs/causal_lm/gsm8k_metamath.yaml", *SHORT,
                         "--run-dir", str(run), "--quiet", token=access_token)
    assert done.returncode == 0, done.stderr[-3000:]
    summary = json.loads((run / "summary.json").read_text())
    data = summary["data"]
    assert data["train_examples"] == METAMATH_ROWS - 1  # the long row left out, as PEFT does
    test = gsm8k_configs()["main"][1]["test"]
    assert data["validation_examples"] == len(test["question"])
    assert data["train_source"] == ("hub meta-math/MetaMathQA split train (rows of at most "
                                    "1300 characters)")
    assert data["validation_source"] == "hub openai/gsm8k/main split test"
    rows = read_jsonl(run / "predictions.jsonl")
    assert [r["reference"] for r in rows] == test["answer"]
    assert [r["prompt"].removeprefix("<|begin_of_text|>") for r in rows] == [
        TEMPLATE.format(query=q) for q in test["question"]]
    scores = summary["metrics"]["validation"]
    assert scores["accuracy"] == accuracy([r["prediction"] for r in rows], test["answer"])


def test_holdout_scores_gsm8k_train_rows_of_lowest_hash(local_hub, access_token, tmp_path):
    run = tmp_path / "run"
    done = local_hub.run("train", "configs/causal_lm/gsm8k_metamath.yaml", *SHORT,
                         "task.holdout=5", "--run-dir", str(run), "--quiet",
                         token=access_token)
    assert done.returncode == 0, done.stderr[-3000:]
    summary = json.loads((run / "summary.json").read_text())
    data = summary["data"]
    assert data["train_examples"] == METAMATH_ROWS - 1  # MetaMathQA trains whole
    assert data["heldout_examples"] == 5
    assert data["heldout_source"] == ("5 rows of hub openai/gsm8k/main split train (lowest "
                                      "row hashes)")
    train = gsm8k_configs()["main"][1]["train"]
    table = [{"question": q, "answer": a} for q, a in zip(train["question"], train["answer"])]
    held = lowest_hashes(table, 5)
    assert held != table[:5]  # rows 0, 3, 5, 8 and 13 of the 16
    rows = [r for r in read_jsonl(run / "predictions.jsonl") if r["id"].startswith("heldout")]
    assert [r["reference"] for r in rows] == [r["answer"] for r in held]
    assert [r["prompt"].removeprefix("<|begin_of_text|>") for r in rows] == [
        TEMPLATE.format(query=r["question"]) for r in held]
    assert summary["metrics"]["heldout"]["accuracy"] == accuracy(
        [r["prediction"] for r in rows], [r["answer"] for r in held])
