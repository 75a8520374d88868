"""SQuAD v1.1 and v2.0 (docs/maths.md#task-hyperparameters, #tasks-and-metrics): extractive
question answering.

Data come from the hub (``rajpurkar/squad``, ``rajpurkar/squad_v2``: ``train`` and
``validation``) or from local files given by ``task.data_files`` / ``task.data_dir``. A
local file may be the official SQuAD JSON (``{"data": [{"title", "paragraphs": [{"context",
"qas": [{"id", "question", "answers", "is_impossible", "plausible_answers"}]}]}]}``),
which is flattened to the hub's columns here, or a table already in those columns
(``id, title, context, question, answers{text, answer_start}``; see :mod:`.data` for the
file types). v2's ``plausible_answers`` are not gold answers and are ignored, as the
official evaluation ignores them.

The model is ``AutoModelForQuestionAnswering`` (a start/end span head, ``qa_outputs``, on
top of the backbone) with a fast tokenizer, whose offset mappings tie tokens to context
characters. Windows and labels are built in :mod:`.squad_features`, logits are decoded
to answers in :mod:`.squad_postprocess`, and answers are scored exactly as the official
scripts do in :mod:`.squad_scoring`. The last evaluation's answers are kept and written
by :meth:`SquadTask.save_predictions` as ``predictions.json`` (id -> answer, the format
the official scripts read).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import datasets
import numpy as np
import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset

from ..config import ConfigError, RunConfig
from ..errors import writing
from ..rundir.layout import PREDICTIONS, split_predictions
from . import data as rawdata
from . import eval_order, progress, squad_postprocess, squad_scoring
from .base import Task, TaskData, no_autocast, require
from .pretrained import LOAD_ERRORS, from_pretrained, load_failed, load_tokenizer
from .squad_features import QAExample, QAFeatures, build_features

COLUMNS = ("id", "context", "question", "answers")
"""Flat columns the task reads (``title`` is optional)."""


@dataclass(frozen=True)
class SquadSpec:
    name: str
    hub_dataset: str
    version_2: bool
    """True: unanswerable questions exist; decode a null answer and report HasAns/NoAns."""


SQUAD_SPECS: dict[str, SquadSpec] = {s.name: s for s in [
    SquadSpec("squad_v1", "rajpurkar/squad", version_2=False),
    SquadSpec("squad_v2", "rajpurkar/squad_v2", version_2=True),
]}

SPLITS = ("train", "validation")


# --------------------------------------------------------------------------- raw data


def flatten_official(doc: dict[str, Any]) -> list[QAExample]:
    """The questions of an official SQuAD JSON document, one example each."""
    out = []
    for article in doc["data"]:
        title = article.get("title", "")
        for paragraph in article["paragraphs"]:
            context = paragraph["context"]
            for qa in paragraph["qas"]:
                answers = [] if qa.get("is_impossible") else qa.get("answers", [])
                out.append(QAExample(
                    id=str(qa["id"]), question=qa["question"], context=context, title=title,
                    answers=tuple(a["text"] for a in answers),
                    answer_starts=tuple(int(a["answer_start"]) for a in answers)))
    return out


def _answers_field(value: Any, where: str, row: int) -> tuple[tuple[str, ...], tuple[int, ...]]:
    """The hub's ``answers`` struct; a CSV cell holds it as a JSON string."""
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except json.JSONDecodeError:
            value = None
    if not isinstance(value, dict) or "text" not in value or "answer_start" not in value:
        raise ConfigError(f"{where} row {row}: answers must be {{\"text\": [...], "
                          f"\"answer_start\": [...]}}, got {str(value)[:80]!r}")
    texts = tuple(str(t) for t in value["text"])
    starts = tuple(int(s) for s in value["answer_start"])
    if len(texts) != len(starts):
        raise ConfigError(f"{where} row {row}: answers has {len(texts)} texts but "
                          f"{len(starts)} answer_start values; give one start per text")
    return texts, starts


def examples_from_table(ds: datasets.Dataset, where: str) -> list[QAExample]:
    """Rows in the hub's flat columns as examples."""
    rawdata.require_columns(ds, COLUMNS, where)
    titles = ds["title"] if "title" in ds.column_names else [""] * len(ds)
    out = []
    for row, (qid, title, context, question, answers) in enumerate(
            zip(ds["id"], titles, ds["context"], ds["question"], ds["answers"])):
        texts, starts = _answers_field(answers, where, row)
        out.append(QAExample(id=str(qid), question=str(question), context=str(context),
                             answers=texts, answer_starts=starts, title=str(title or "")))
    return out


def read_local(path: Path) -> list[QAExample]:
    """A local split: official SQuAD JSON, or any table :func:`.data.read_table` reads."""
    if path.suffix.lower() == ".json" and path.is_file():
        with path.open(encoding="utf-8") as handle:
            head = handle.read(1024).lstrip()
        if head.startswith("{"):
            try:
                doc = json.loads(path.read_text(encoding="utf-8"))
            except json.JSONDecodeError:
                doc = None  # JSON lines: one record per line, read as a table below
            if isinstance(doc, dict) and "data" in doc:
                try:
                    return flatten_official(doc)
                except (KeyError, TypeError) as err:
                    raise ConfigError(f"{path}: not valid SQuAD JSON (missing {err}); each "
                                      "question needs id, question and answers") from None
    return examples_from_table(rawdata.read_table(path), str(path))


# --------------------------------------------------------------------------- the task


class SquadTask(Task):
    """Extractive QA on SQuAD v1.1 / v2.0 with any backbone that has a fast tokenizer."""

    model_class = "AutoModelForQuestionAnswering"

    def __init__(self, spec: SquadSpec, cfg: RunConfig):
        t = cfg.task
        if not 0 <= t.doc_stride < t.max_length:
            raise ConfigError(f"task.doc_stride={t.doc_stride} must lie in [0, "
                              f"task.max_length={t.max_length}); set task.max_length=384 "
                              "(SQuAD's usual, with doc_stride 128) or lower task.doc_stride")
        self.spec, self.cfg, self.name = spec, cfg, spec.name
        self.primary_metric = "f1"
        self.predictions: dict[str, dict[str, str]] = {}
        """Answers of the last evaluation of each split: {split: {id: answer}}."""

    def build_model(self, dtype: torch.dtype = torch.float32) -> tuple[nn.Module, Any]:
        import transformers

        path = self.cfg.model.name_or_path
        try:
            tokenizer = load_tokenizer(path)
            # checked before the (slow) model load: without offsets nothing below can work
            if not getattr(tokenizer, "is_fast", False):
                raise ConfigError(
                    f"{self.name} needs a fast tokenizer for offset mappings, but {path} loads "
                    f"{type(tokenizer).__name__}; add a tokenizer.json to the model folder "
                    "(or install tokenizers and sentencepiece)")
            model = from_pretrained(getattr(transformers, self.model_class), path, dtype)
        except LOAD_ERRORS as err:  # missing folder, hub unreachable, no such or gated repo
            raise load_failed(path, err) from None
        return model, tokenizer

    def _dataset(self) -> str:
        return self.cfg.task.dataset or self.spec.hub_dataset

    def where(self, split: str) -> str:
        return rawdata.describe_source(self.cfg.task, split, dataset=self._dataset())

    def load_examples(self) -> dict[str, list[QAExample]]:
        """Raw train and validation questions, from local files if configured, else the hub."""
        task = self.cfg.task
        if task.data_files or task.data_dir:
            if task.data_files:
                missing = [s for s in SPLITS if s not in task.data_files]
                if missing:
                    raise ConfigError(f"task.data_files has no entry for split {missing[0]}; "
                                      f"add task.data_files.{missing[0]}=PATH")
                paths = {s: Path(task.data_files[s]) for s in SPLITS}
            else:
                paths = rawdata.find_split_files(task.data_dir, SPLITS)
            for split, path in paths.items():
                if not path.is_file():
                    raise ConfigError(f"data file {path} does not exist; fix task.data_files."
                                      f"{split} or task.data_dir")
            return {s: read_local(p) for s, p in paths.items()}
        hub = rawdata.load_splits(task, SPLITS, dataset=self._dataset())
        return {s: examples_from_table(ds, self.where(s)) for s, ds in hub.items()}

    def load_data(self, tokenizer: Any) -> TaskData:
        from transformers import DataCollatorWithPadding

        task = self.cfg.task
        raw = self.load_examples()
        train = raw["train"][:task.max_train_samples]
        valid = raw["validation"][:task.max_eval_samples]
        for split, examples in (("train", train), ("validation", valid)):
            if not examples:
                raise ConfigError(f"{self.where(split)} has no questions; give the split data")
        if not self.spec.version_2:
            unanswerable = next((ex.id for ex in valid if not ex.answers), None)
            if unanswerable is not None:
                raise ConfigError(f"{self.where('validation')} has unanswerable question "
                                  f"{unanswerable!r}, which SQuAD v1.1 cannot score; use "
                                  "task.name=squad_v2")
        kwargs = {"max_length": task.max_length, "doc_stride": task.doc_stride}
        train_features = build_features(tokenizer, train, training=True, **kwargs)
        valid_features = build_features(tokenizer, valid, training=False, **kwargs)
        info = {"task": self.name, "train_examples": len(train),
                "train_features": len(train_features), "validation_examples": len(valid),
                "validation_features": len(valid_features),
                "train_source": self.where("train"),
                "validation_source": self.where("validation")}
        return TaskData(train=train_features, eval_splits={"validation": valid_features},
                        collate=DataCollatorWithPadding(tokenizer), info=info)

    @torch.no_grad()
    def predict_logits(self, model: nn.Module, data: QAFeatures, *, batch_size: int,
                       collate: Callable, device: torch.device,
                       autocast: Callable[[], Any]) -> tuple[list[np.ndarray], list[np.ndarray]]:
        """Start and end logits of every window, in feature order (computed in
        length-sorted batches, see :mod:`.eval_order`)."""
        was_training = model.training
        model.eval()
        starts: list[np.ndarray] = []
        ends: list[np.ndarray] = []
        batches = eval_order.sorted_batches(eval_order.input_lengths(data), batch_size)
        try:
            for batch in progress.counted(
                    DataLoader(data, batch_sampler=batches, collate_fn=collate),
                    "scoring windows", total=len(data), size=lambda b: len(b["input_ids"])):
                batch = {k: v.to(device) for k, v in batch.items()}
                with autocast():
                    out = model(**batch)
                starts.extend(out.start_logits.float().cpu().numpy())
                ends.extend(out.end_logits.float().cpu().numpy())
        finally:
            model.train(was_training)
        return (eval_order.restore_order(starts, batches),
                eval_order.restore_order(ends, batches))

    def answers(self, data: QAFeatures, starts: list[np.ndarray],
                ends: list[np.ndarray]) -> dict[str, str]:
        """Decoded answer per question id."""
        t = self.cfg.task
        texts = squad_postprocess.decode(
            [ex.context for ex in data.examples], data.example_index, starts, ends,
            data.offsets, data.cls_index, n_best=t.n_best,
            max_answer_length=t.max_answer_length, version_2=self.spec.version_2,
            null_threshold=t.null_score_threshold)
        return {ex.id: text for ex, text in zip(data.examples, texts)}

    @torch.no_grad()
    def evaluate(self, model: nn.Module, split: str, data: Dataset, *, batch_size: int,
                 collate: Callable, device: torch.device,
                 autocast: Callable[[], Any]) -> dict[str, float]:
        if not isinstance(data, QAFeatures) or not data.offsets:
            raise TypeError(f"{self.name} evaluates the QAFeatures of its own load_data")
        starts, ends = self.predict_logits(model, data, batch_size=batch_size, collate=collate,
                                           device=device, autocast=autocast)
        predictions = self.answers(data, starts, ends)
        self.predictions[split] = predictions
        golds = {ex.id: list(ex.answers) for ex in data.examples}
        return squad_scoring.score(predictions, golds, version_2=self.spec.version_2)

    def metric_names(self) -> tuple[str, ...]:
        """squad_scoring.score's names: v2 adds each group's exact, f1 and count."""
        groups = (f"{g}_{m}" for g in ("HasAns", "NoAns") for m in ("exact", "f1", "total"))
        return ("exact_match", "f1", *(groups if self.spec.version_2 else ()))

    # ---------------------------------------------------------------- predict

    def predict_columns(self, columns: Sequence[str], where: str) -> list[str]:
        return require(columns, ("question", "context"), where)

    @torch.no_grad()
    def predict_rows(self, model: nn.Module, tokenizer: Any, ds: datasets.Dataset,
                     device: torch.device) -> list[dict[str, Any]]:
        """``answer`` per row, decoded as evaluation decodes ("" when a v2 model prefers
        no answer)."""
        from transformers import DataCollatorWithPadding

        keys = [str(i) for i in range(len(ds))]  # row positions: input ids may repeat
        examples = [QAExample(id=k, question=str(q), context=str(c), answers=(),
                              answer_starts=())
                    for k, q, c in zip(keys, ds["question"], ds["context"])]
        t = self.cfg.task
        features = build_features(tokenizer, examples, max_length=t.max_length,
                                  doc_stride=t.doc_stride, training=False)
        starts, ends = self.predict_logits(model, features, batch_size=len(features) or 1,
                                           collate=DataCollatorWithPadding(tokenizer),
                                           device=device, autocast=no_autocast)
        answers = self.answers(features, starts, ends)
        return [{"answer": answers[k]} for k in keys]

    def save_predictions(self, run_dir: Path) -> list[Path]:
        """``predictions.json`` ({id: answer}) of the last evaluation (one file per split
        when there are several: ``predictions_<split>.json``)."""
        written = []
        for split, predictions in self.predictions.items():
            name = PREDICTIONS if len(self.predictions) == 1 else split_predictions(split)
            path = Path(run_dir) / name
            with writing(path):  # a full disk: the error names the file
                path.write_text(json.dumps(predictions, indent=1, ensure_ascii=False) + "\n",
                                encoding="utf-8")
            written.append(path)
        return written


def squad_task(cfg: RunConfig) -> SquadTask:
    return SquadTask(SQUAD_SPECS[cfg.task.name], cfg)
