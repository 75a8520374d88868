"""``gsm8k_metamath``: PEFT's method comparison on math word problems (huggingface/peft,
``method_comparison/MetaMathQA``): train on MetaMathQA, score the greedy answer on GSM8K.

Data, as PEFT's ``data.py`` reads it: the training rows are ``meta-math/MetaMathQA``'s
``train`` split without the rows whose ``f"{query} {response}"`` is longer than
:data:`CHAR_LIMIT` characters (PEFT: 93.8 % of the set is kept, so that query and response
fit in 768 tokens); the scored rows are ``openai/gsm8k``'s ``main`` test split (1,319
problems, PEFT's test set; its 50-row validation sample of GSM8K's train split only watches
training and is not reported). Every prompt is PEFT's :data:`TEMPLATE`; the response is
MetaMathQA's ``response`` (which ends "The answer is: 16") or GSM8K's ``answer`` (which ends
"#### 16"). With ``task.data_files`` or ``task.data_dir`` the same columns come from local
files: ``train`` in MetaMathQA's (``query``, ``response``), ``validation`` in GSM8K's
(``question``, ``answer``).

``task.holdout=N`` (what ``adalora tune`` chooses a learning rate on) scores the split
``heldout``: the N rows of GSM8K's ``main`` train split with the lowest row hashes
(:func:`~.data.lowest_keys`, the rule every held-out slice follows), prompted and scored as
the test rows are; the training rows stay MetaMathQA's, all of them. Choosing on GSM8K test
would choose on the reported figure, and held-out MetaMathQA rows (rephrased GSM8K and MATH
questions, answered "The answer is: N") would be a poor proxy for it; GSM8K train is where
PEFT watches training too. These rows are not unseen: MetaMathQA rephrases GSM8K's train
questions, so their accuracy may run above the test's, as in PEFT's own validation sample.
Locally they are the split :data:`HELDOUT_FILE` (``task.data_files.gsm8k_train=PATH``, or
``gsm8k_train.jsonl`` in ``task.data_dir``), in GSM8K's columns.

Scoring adds ``accuracy`` (x 100) to ``causal_lm``'s: the number after the last answer
marker of the reply (:func:`parse_answer`) equals the reference's, as numbers
(:func:`to_number`: ``20/35`` equals ``0.5714285714285714``), PEFT's ``get_accuracy``.
"""

from __future__ import annotations

from collections.abc import Sequence
from decimal import Decimal, DivisionByZero, InvalidOperation
from pathlib import Path
from typing import Any

import datasets

from ..config import ConfigError, RunConfig
from . import data as rawdata
from .causal_lm import CausalLMTask

TRAIN_DATASET = "meta-math/MetaMathQA"
TEST_DATASET = "openai/gsm8k"
TEST_CONFIG = "main"
HELDOUT_SPLIT = "train"
"""GSM8K's split that ``task.holdout`` takes its rows from (hub ``openai/gsm8k``, ``main``)."""
HELDOUT_FILE = "gsm8k_train"
"""The local split (``task.data_files`` key, ``task.data_dir`` file name) holding GSM8K's
train rows for ``task.holdout``."""
TEMPLATE = "Question: {query} Think step by step.\nAnswer:"
"""PEFT's ``query_template`` (default_training_params.json)."""
CHAR_LIMIT = 1300
"""Longest ``f"{query} {response}"`` of a training row, in characters (PEFT's data.py)."""
QUESTION_COLUMNS = ("question", "query")
"""The columns a problem is read from by ``adalora predict``: GSM8K's, then MetaMathQA's."""
MARKERS = ("The answer is: ", "The answer is ", "The final answer is: ", "The final answer is ",
           "#### ")
"""What precedes the final answer: MetaMathQA's four phrasings, then GSM8K's (PEFT's
``parse_answer``, which takes the first of these found in the text and the text after its
last occurrence)."""


def parse_answer(text: str) -> str | None:
    """The final answer of a solution, as text: what follows the last answer marker, up to
    the end of its line, without surrounding spaces, ``.!?$%``; None when no marker is
    found. ``"... = \\boxed{16}$.The answer is: 16"`` gives ``"16"``."""
    text = text.strip().rstrip(".!?")
    marker = next((m for m in MARKERS if m in text), None)
    if marker is None:
        return None
    answer = text.rpartition(marker)[2].strip().split("\n", 1)[0]
    return answer.strip(" .!?$%")  # GSM8K writes 50 % as 50: no division by 100


def to_number(text: str | None) -> Decimal | None:
    """A number written as an integer, a decimal or one fraction (``20/14``); None for
    anything else (``1,000`` included, as PEFT reads it)."""
    if text is None:
        return None
    try:
        parts = text.strip().split("/")
        if len(parts) == 1:
            return Decimal(parts[0])
        if len(parts) != 2 or Decimal(parts[1].strip()) == 0:
            return None
        return Decimal(parts[0].strip()) / Decimal(parts[1].strip())
    except (DivisionByZero, InvalidOperation, ValueError):
        return None


def _value(answer: str | None) -> float | str | None:
    number = to_number(answer)
    return float(number) if number is not None else answer


def is_correct(prediction: str, reference: str) -> bool:
    """PEFT's ``get_accuracy`` for one row: both answers found and equal, as floats when
    both are numbers, else as text."""
    expected = parse_answer(reference)
    if expected is None:
        raise ConfigError(f"reference answer {reference[-60:]!r} has no final answer "
                          f"(none of {', '.join(repr(m.strip()) for m in MARKERS)}); GSM8K "
                          "answers end '#### <number>'")
    got, want = _value(parse_answer(prediction)), _value(expected)
    return got is not None and want is not None and got == want


def accuracy(predictions: list[str], references: list[str]) -> float:
    """Percent of replies whose final answer is the reference's."""
    if len(predictions) != len(references):
        raise ValueError(f"{len(predictions)} predictions for {len(references)} references")
    right = sum(is_correct(p, r) for p, r in zip(predictions, references))
    return 100.0 * right / max(len(predictions), 1)


def prompt_rows(ds: datasets.Dataset, query: str, response: str, where: str
                ) -> datasets.Dataset:
    """``prompt`` (PEFT's template around ``query``) and ``response`` columns."""
    rawdata.require_columns(ds, [query, response], where)
    return datasets.Dataset.from_dict({
        "prompt": [TEMPLATE.format(query=q) for q in ds[query]],
        "response": [str(r) for r in ds[response]]})


def short_enough(ds: datasets.Dataset) -> datasets.Dataset:
    """MetaMathQA rows within :data:`CHAR_LIMIT` (PEFT's ``get_filtered_dataset``)."""
    keep = [i for i, (q, r) in enumerate(zip(ds["query"], ds["response"]))
            if len(f"{q} {r}") <= CHAR_LIMIT]
    return ds.select(keep)


class Gsm8kMetaMathTask(CausalLMTask):
    """``causal_lm`` on MetaMathQA, scored on GSM8K by final-answer accuracy."""

    name = "gsm8k_metamath"
    holds_out = True
    """``task.holdout`` scores rows of GSM8K's train split as ``heldout`` (module doc)."""

    def __init__(self, cfg: RunConfig):
        super().__init__(cfg)
        self._raw: dict[str, datasets.Dataset] | None = None

    def _local(self) -> bool:
        return bool(self.cfg.task.data_files or self.cfg.task.data_dir)

    def _heldout_source(self) -> str:
        """Where GSM8K's train rows come from."""
        task = self.cfg.task
        if self._local():
            return rawdata.describe_source(task, HELDOUT_FILE, dataset=None)
        return rawdata.describe_source(task, HELDOUT_SPLIT, dataset=TEST_DATASET,
                                       config_name=TEST_CONFIG)

    def where(self, split: str) -> str:
        if split == rawdata.HELDOUT:
            return (f"{self.cfg.task.holdout} rows of {self._heldout_source()} "
                    "(lowest row hashes)")
        if self._local():
            return super().where(split)
        task = self.cfg.task
        if split == "train":
            return (rawdata.describe_source(task, "train", dataset=TRAIN_DATASET)
                    + f" (rows of at most {CHAR_LIMIT} characters)")
        return rawdata.describe_source(task, "test", dataset=TEST_DATASET,
                                       config_name=TEST_CONFIG)

    def _check_local_heldout(self) -> None:
        """``task.holdout`` with local files needs GSM8K's train rows among them."""
        task = self.cfg.task
        asked = (f"task.holdout={task.holdout} scores rows of GSM8K's train split, "
                 "which the local files do not give")
        columns = "GSM8K's question and answer columns"
        if task.data_files:
            if HELDOUT_FILE not in task.data_files:
                raise ConfigError(f"{asked}; add task.data_files.{HELDOUT_FILE}=PATH "
                                  f"({columns})")
            return
        folder = Path(str(task.data_dir))
        if folder.is_dir() and not any((folder / f"{HELDOUT_FILE}.{ext}").is_file()
                                       for ext in rawdata.EXTENSIONS):
            raise ConfigError(f"{asked}; add {HELDOUT_FILE}.jsonl ({columns}) to {folder}, "
                              f"or map it with task.data_files.{HELDOUT_FILE}=PATH")

    def raw_splits(self) -> dict[str, datasets.Dataset]:
        task = self.cfg.task
        gsm8k_train = None
        if self._local():
            splits = ["train", "validation"]
            if task.holdout:
                self._check_local_heldout()
                splits.append(HELDOUT_FILE)
            loaded = rawdata.load_splits(task, splits, dataset=None)
            train, test = loaded["train"], loaded["validation"]
            gsm8k_train = loaded.get(HELDOUT_FILE)
        else:
            train = rawdata.load_splits(task, ("train",), dataset=TRAIN_DATASET)["train"]
            splits = ["test", HELDOUT_SPLIT] if task.holdout else ["test"]
            gsm8k = rawdata.load_splits(task, splits, dataset=TEST_DATASET,
                                        config_name=TEST_CONFIG)
            test, gsm8k_train = gsm8k["test"], gsm8k.get(HELDOUT_SPLIT)
        rawdata.require_columns(train, ["query", "response"], self.where("train"))
        out = {"train": prompt_rows(short_enough(train), "query", "response",
                                    self.where("train")),
               "validation": prompt_rows(test, "question", "answer",
                                         self.where("validation"))}
        if task.holdout:
            out[rawdata.HELDOUT] = self._heldout(gsm8k_train)
        return out

    def _heldout(self, gsm8k_train: datasets.Dataset) -> datasets.Dataset:
        """The ``task.holdout`` rows of GSM8K's train split with the lowest row hashes,
        prompted as the test rows are."""
        rows, source = int(self.cfg.task.holdout), self._heldout_source()
        rawdata.require_columns(gsm8k_train, ["question", "answer"], source)
        if rows > len(gsm8k_train):
            raise ConfigError(f"task.holdout={rows} asks for more rows than GSM8K's train "
                              f"split has ({len(gsm8k_train)} in {source}); hold out at most "
                              f"task.holdout={len(gsm8k_train)}")
        held = gsm8k_train.select(rawdata.lowest_keys(gsm8k_train, rows))
        return prompt_rows(held, "question", "answer", self.where(rawdata.HELDOUT))

    def load_raw(self) -> dict[str, datasets.Dataset]:
        """The prompted splits, ``heldout`` among them under ``task.holdout`` (read once:
        ``adalora tune`` checks the held-out slice with it before any trial starts)."""
        if self._raw is None:
            self._raw = self.raw_splits()
        return self._raw

    def metric_names(self) -> tuple[str, ...]:
        generated = ("accuracy",) if self.cfg.task.max_new_tokens > 0 else ()
        return (*super().metric_names(), *generated)

    def _generation_scores(self, model, split, data, batch_size, device, autocast,
                           n_new) -> dict[str, float]:
        scores = super()._generation_scores(model, split, data, batch_size, device,
                                            autocast, n_new)
        rows = self.predictions[split]
        scores["accuracy"] = accuracy([r["prediction"] for r in rows],
                                      [r["reference"] for r in rows])
        return scores


    # ---------------------------------------------------------------- predict

    def predict_columns(self, columns: Sequence[str], where: str) -> list[str]:
        """GSM8K's ``question`` (or MetaMathQA's ``query``), asked as training asks it;
        otherwise what ``causal_lm`` reads."""
        asked = [c for c in QUESTION_COLUMNS if c in columns]
        return asked[:1] if asked else super().predict_columns(columns, where)

    def predict_rows(self, model: Any, tokenizer: Any, ds: datasets.Dataset,
                     device: Any) -> list[dict[str, Any]]:
        """A ``response`` to each question, asked in PEFT's template (a ``prompt`` column
        goes through unchanged, as in ``causal_lm``)."""
        asked = [c for c in QUESTION_COLUMNS if c in ds.column_names]
        if asked and self.cfg.task.prompt_column not in ds.column_names:
            ds = datasets.Dataset.from_dict({self.cfg.task.prompt_column: [
                TEMPLATE.format(query="" if q is None else q) for q in ds[asked[0]]]})
        return super().predict_rows(model, tokenizer, ds, device)


def gsm8k_metamath_task(cfg: RunConfig) -> Gsm8kMetaMathTask:
    return Gsm8kMetaMathTask(cfg)

