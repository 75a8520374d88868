"""gsm8k_metamath: PEFT's final-answer extraction and accuracy against hand-written replies,
and the task's rows from local files in the two datasets' columns (tests/fixtures/gsm8k)."""

from __future__ import annotations

import hashlib
import json
from decimal import Decimal

import pytest

from adalora_cli.config import ConfigError, load_config
from adalora_cli.tasks import get_task
from adalora_cli.tasks.causal_lm_data import LABEL_PAD
from adalora_cli.tasks.gsm8k import TEMPLATE, accuracy, is_correct, parse_answer, to_number
from adalora_cli.tasks.pretrained import load_tokenizer
from tests.conftest import ROOT

SMOKE = ROOT / "configs/smoke/gsm8k.yaml"


@pytest.mark.parametrize("text, answer", [
    # PEFT's own example (utils.parse_answer's docstring)
    ("Answer: The dot product of a vector with itself is equal to the square of its "
     "magnitude. So, the dot product of vector v with itself is equal to $4^2 = "
     "\\boxed{16}$.The answer is: 16", "16"),
    ("Natalia sold 48/2 = 24 clips in May.\n#### 72", "72"),          # GSM8K's reference
    ("So she pays $18 in all. The answer is 18.", "18"),               # no colon, a full stop
    ("The final answer is: 3/4", "3/4"),
    ("It rose by 50%. The final answer is 50%!", "50"),                # % and ! dropped
    ("The answer is: 5. Or rather... The answer is: 7", "7"),          # its last occurrence
    # the marker is the first of PEFT's list that occurs, "The answer is: " before "The
    # answer is ": its last occurrence, then the end of that line
    ("The answer is: 5\n\nQuestion: another one? The answer is 7", "5"),
    ("The answer is: 12\nThen a new paragraph.", "12"),                # up to its line's end
    ("The answer is: $1,000.", "1,000"),
    ("Half of 10 is 5, so 5 apples.", None),                           # no marker at all
])
def test_parse_answer_takes_what_follows_the_marker(text, answer):
    assert parse_answer(text) == answer


@pytest.mark.parametrize("text, number", [
    ("13", Decimal(13)), ("65.33", Decimal("65.33")), (" 20/14 ", Decimal(20) / Decimal(14)),
    ("1/0", None), ("1,000", None), ("1/2/3", None), ("twelve", None), (None, None),
])
def test_numbers_are_integers_decimals_or_one_fraction(text, number):
    assert to_number(text) == number


def test_is_correct_compares_numbers_as_numbers_and_anything_else_as_text():
    assert is_correct("The answer is: 8.0", "Ada had 10.\n#### 8")
    assert is_correct("The answer is: 20/35", "#### 0.5714285714285714")
    assert is_correct("The answer is: yes", "#### yes")
    assert not is_correct("The answer is: 9", "#### 8")
    assert not is_correct("It is 8.", "#### 8")  # a reply without a marker is wrong
    assert not is_correct("The answer is: 1,000", "#### 1000")  # PEFT reads no commas
    with pytest.raises(ConfigError, match="has no final answer"):
        is_correct("The answer is: 8", "eight, without a marker")


def test_accuracy_is_the_percent_of_right_final_answers():
    references = ["#### 8", "#### 15", "#### 2", "#### 7"]
    replies = ["The answer is: 8", "The answer is 15.", "#### 3", "no idea"]
    assert accuracy(replies, references) == 50.0
    with pytest.raises(ValueError):
        accuracy(replies[:3], references)


def rows(name: str) -> list[dict]:
    path = ROOT / "tests/fixtures/gsm8k" / name
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_local_rows_are_peft_prompts_with_the_long_row_left_out(monkeypatch):
    monkeypatch.chdir(ROOT)
    cfg = load_config(SMOKE)
    task = get_task(cfg)
    tokenizer = load_tokenizer(cfg.model.name_or_path)
    data = task.load_data(tokenizer)
    train = [r for r in rows("train.jsonl") if len(f"{r['query']} {r['response']}") <= 1300]
    assert len(train) == len(rows("train.jsonl")) - 1 == len(data.train)
    first = data.train[0]
    prompt = TEMPLATE.format(query=train[0]["query"])
    expected = (tokenizer(prompt)["input_ids"]
                + tokenizer(train[0]["response"], add_special_tokens=False)["input_ids"]
                + [tokenizer.eos_token_id])
    assert first["input_ids"] == expected
    assert LABEL_PAD not in first["labels"]  # train_on_prompt: every token, as PEFT trains
    scored = data.eval_splits["validation"]
    test = rows("validation.jsonl")
    assert list(scored["reference"]) == [r["answer"] for r in test]
    assert [tokenizer.decode(p, skip_special_tokens=True) for p in scored["prompt_ids"]] == [
        TEMPLATE.format(query=r["question"]) for r in test]
    assert task.metric_names() == ("loss", "perplexity", "exact_match", "rougeL", "accuracy")


# ---------------------------------------------------------------- task.holdout

def lowest_hashes(table: list[dict], n: int) -> list[dict]:
    """The ``n`` rows of lowest sha256 of their cells as sorted JSON, in the table's order
    (the rule of docs/tuning.md, written out here)."""
    def digest(row: dict) -> str:
        text = json.dumps(row, sort_keys=True, ensure_ascii=False)
        return hashlib.sha256(text.encode()).hexdigest()

    chosen = sorted(table, key=digest)[:n]
    return [r for r in table if r in chosen]


def fixture_files(**extra: str) -> list[str]:
    files = {"train": "train.jsonl", "validation": "validation.jsonl", **extra}
    return [f"task.data_files.{k}={ROOT / 'tests/fixtures/gsm8k' / v}" for k, v in files.items()]


def test_holdout_scores_the_gsm8k_train_rows_of_lowest_hash(monkeypatch):
    monkeypatch.chdir(ROOT)
    cfg = load_config(SMOKE, ["task.holdout=4"])
    task = get_task(cfg)
    tokenizer = load_tokenizer(cfg.model.name_or_path)
    data = task.load_data(tokenizer)
    source = rows("gsm8k_train.jsonl")
    held = lowest_hashes(source, 4)
    assert held != source[:4] and held != source[-4:]  # not the file's ends
    scored = data.eval_splits["heldout"]
    assert list(data.eval_splits) == ["validation", "heldout"]
    assert list(scored["reference"]) == [r["answer"] for r in held]
    assert [tokenizer.decode(p, skip_special_tokens=True) for p in scored["prompt_ids"]] == [
        TEMPLATE.format(query=r["question"]) for r in held]
    # MetaMathQA trains whole: nothing is carved out of it
    assert len(data.train) == len(rows("train.jsonl")) - 1
    assert data.info["heldout_examples"] == 4
    assert data.info["heldout_source"] == ("4 rows of tests/fixtures/gsm8k/gsm8k_train.jsonl "
                                           "(lowest row hashes)")


def test_the_held_out_rows_do_not_depend_on_the_file_order(tmp_path):
    source = rows("gsm8k_train.jsonl")
    shuffled = tmp_path / "gsm8k_train.jsonl"
    shuffled.write_text("".join(json.dumps(r) + "\n" for r in source[5:] + source[:5]))
    cfg = load_config(SMOKE, [*fixture_files(), f"task.data_files.gsm8k_train={shuffled}",
                              "task.holdout=4"])
    held = get_task(cfg).raw_splits()["heldout"]
    expected = lowest_hashes(source[5:] + source[:5], 4)  # this file's order
    assert list(held["response"]) == [r["answer"] for r in expected]
    assert sorted(held["response"]) == sorted(r["answer"] for r in lowest_hashes(source, 4))


def test_held_out_replies_are_scored_by_final_answer_accuracy(monkeypatch):
    import contextlib

    import torch

    monkeypatch.chdir(ROOT)
    cfg = load_config(SMOKE, ["task.holdout=4"])
    task = get_task(cfg)
    model, tokenizer = task.build_model()
    data = task.load_data(tokenizer)
    held = lowest_hashes(rows("gsm8k_train.jsonl"), 4)
    answers = [r["answer"].rpartition("#### ")[2] for r in held]
    # right on the first and third rows, a wrong number and no marker on the others
    replies = [f"So it is {answers[0]}.\nThe answer is: {answers[0]}",
               f"The answer is: {int(answers[1]) + 1}",
               f"#### {answers[2]}.0", answers[3]]

    def generate(model, prompts, **kwargs):
        assert len(prompts) == 4
        return replies

    monkeypatch.setattr(task, "generate", generate)
    scores = task.evaluate(model, "heldout", data.eval_splits["heldout"], batch_size=4,
                           collate=data.collate, device=torch.device("cpu"),
                           autocast=contextlib.nullcontext)
    assert scores["accuracy"] == 50.0
    assert scores["exact_match"] == 0.0 and scores["loss"] > 0
    assert [r["reference"] for r in task.predictions["heldout"]] == [r["answer"] for r in held]
    assert [r["prediction"] for r in task.predictions["heldout"]] == replies


def test_holdout_needs_gsm8k_train_rows_among_local_files(tmp_path):
    with pytest.raises(ConfigError) as err:
        get_task(load_config(SMOKE, [*fixture_files(), "task.holdout=4"])).raw_splits()
    assert str(err.value) == (
        "task.holdout=4 scores rows of GSM8K's train split, which the local files do not "
        "give; add task.data_files.gsm8k_train=PATH (GSM8K's question and answer columns)")
    for name in ("train.jsonl", "validation.jsonl"):
        (tmp_path / name).write_text((ROOT / "tests/fixtures/gsm8k" / name).read_text())
    with pytest.raises(ConfigError) as err:
        get_task(load_config(SMOKE, [f"task.data_dir={tmp_path}", "task.holdout=4"])
                 ).raw_splits()
    assert str(err.value) == (
        "task.holdout=4 scores rows of GSM8K's train split, which the local files do not "
        f"give; add gsm8k_train.jsonl (GSM8K's question and answer columns) to {tmp_path}, "
        "or map it with task.data_files.gsm8k_train=PATH")


def test_holdout_refuses_more_rows_than_gsm8k_train_has(monkeypatch):
    monkeypatch.chdir(ROOT)
    n = len(rows("gsm8k_train.jsonl"))
    task = get_task(load_config(SMOKE, [f"task.holdout={n + 1}"]))
    with pytest.raises(ConfigError) as err:
        task.raw_splits()
    assert str(err.value) == (
        f"task.holdout={n + 1} asks for more rows than GSM8K's train split has ({n} in "
        f"tests/fixtures/gsm8k/gsm8k_train.jsonl); hold out at most task.holdout={n}")
    every = get_task(load_config(SMOKE, [f"task.holdout={n}"])).raw_splits()["heldout"]
    assert sorted(every["response"]) == sorted(r["answer"] for r in rows("gsm8k_train.jsonl"))


def test_without_holdout_no_gsm8k_train_rows_are_read(tmp_path):
    # the data_dir of before: train and validation only, as without task.holdout
    for name in ("train.jsonl", "validation.jsonl"):
        (tmp_path / name).write_text((ROOT / "tests/fixtures/gsm8k" / name).read_text())
    raw = get_task(load_config(SMOKE, [f"task.data_dir={tmp_path}"])).raw_splits()
    assert list(raw) == ["train", "validation"]
