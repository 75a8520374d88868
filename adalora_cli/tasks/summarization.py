"""Abstractive summarization (docs/maths.md#task-hyperparameters, #tasks-and-metrics): XSum
and CNN/DailyMail on BART, ROUGE.

A :class:`SummarizationSpec` names the source and target columns and the default data
(``EdinburghNLP/xsum`` document -> summary; ``abisee/cnn_dailymail`` 3.0.0 article ->
highlights; the bundled BBC News demo, body -> lead, see :mod:`.bbc_news`); local files
with the same columns replace the hub (:mod:`.data`). An ``id`` column is optional: rows
without one are numbered.

Training is plain teacher-forced cross-entropy: sources truncated to ``task.max_length``
tokens, summaries to ``task.max_target_length``, and labels padded with -100 so that
padding never counts in the loss (the model shifts labels right itself to build the
decoder input). Evaluation generates a summary for every example with batched beam search
(``task.num_beams``, length limits, length penalty, n-gram blocking from the task config),
without gradients and in eval mode, then scores ROUGE-1/2/L/Lsum F x 100 (:mod:`.rouge`)
against the untruncated references. The last evaluation's summaries are kept and written
as ``predictions.jsonl`` (id, prediction, reference) by :meth:`save_predictions`.

The model is ``AutoModelForSeq2SeqLM`` (``facebook/bart-large`` in the paper; T5 and mT5, with
relative position attention, work the same way, with ``task.source_prefix: "summarize: "``
for checkpoints pretrained on prefixed tasks); a BERT
checkpoint (the offline demo's MiniLM) is warm-started into the same BART shape by
:mod:`.warm_start`, since an encoder alone cannot generate.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import datasets
import torch
from torch import nn
from torch.utils.data import Dataset

from ..config import ConfigError, RunConfig
from ..rundir.layout import PREDICTIONS_JSONL
from . import bbc_news, eval_order, progress
from . import data as rawdata
from .base import Task, TaskData, require
from .pretrained import from_pretrained, load_config, load_tokenizer

# The BART warm start (transformers' BART classes) and ROUGE (rouge-score, nltk) are
# imported where they are used, so a run that never builds a warm start or scores ROUGE
# does not load them.

LABEL_PAD = -100
"""Label id that cross-entropy ignores (PyTorch's default ``ignore_index``)."""
SPLITS = ("train", "validation")


@dataclass(frozen=True)
class SummarizationSpec:
    name: str
    source_column: str
    target_column: str
    hub_dataset: str | None
    """Default hub source; None means local files or the bundled corpus only."""
    hub_config: str | None = None
    bundled: Callable[[], dict[str, datasets.Dataset]] | None = None
    """Loader of packaged data used when no data source is configured (the demo)."""
    id_column: str = "id"


SUMMARIZATION_SPECS: dict[str, SummarizationSpec] = {s.name: s for s in [
    SummarizationSpec("xsum", "document", "summary", "EdinburghNLP/xsum"),
    SummarizationSpec("cnn_dailymail", "article", "highlights", "abisee/cnn_dailymail",
                      hub_config="3.0.0"),
    SummarizationSpec("bbc_news", "document", "summary", None, bundled=bbc_news.load_corpus),
]}


def pad_batch(items: list[dict[str, Any]], pad_id: int) -> dict[str, torch.Tensor]:
    """Right-pad ``input_ids`` (with ``pad_id``), ``attention_mask`` (0) and, when present,
    ``labels`` (-100, so padded positions are ignored by the loss) into tensors."""
    def pad(rows: list[list[int]], value: int) -> torch.Tensor:
        width = max(len(r) for r in rows)
        return torch.tensor([list(r) + [value] * (width - len(r)) for r in rows])

    batch = {"input_ids": pad([i["input_ids"] for i in items], pad_id),
             "attention_mask": pad([i["attention_mask"] for i in items], 0)}
    if "labels" in items[0]:
        batch["labels"] = pad([i["labels"] for i in items], LABEL_PAD)
    return batch


class SummarizationTask(Task):
    """A sequence-to-sequence summarization task built from a spec."""

    model_class = "AutoModelForSeq2SeqLM"

    def __init__(self, spec: SummarizationSpec, cfg: RunConfig):
        self.spec, self.cfg, self.name = spec, cfg, spec.name
        self.primary_metric = "rouge1"
        self.eval_split_names = ("validation",)
        self.tokenizer: Any = None  # set by load_data; generation decodes with it
        # the last evaluation's rows per split: id, prediction, reference
        self.predictions: dict[str, list[dict[str, str]]] = {}
        t = cfg.task  # its keys' own ranges are checked by TaskConfig
        if self.max_new_tokens < max(1, t.generation_min_length):
            raise ConfigError(f"task.generation_max_length ({self.max_new_tokens}) must be >= 1 "
                              f"and >= task.generation_min_length ({t.generation_min_length})")

    @property
    def max_new_tokens(self) -> int:
        t = self.cfg.task
        return t.max_target_length if t.generation_max_length is None else t.generation_max_length

    # ---------------------------------------------------------------- model

    def check_model_config(self, config: Any) -> None:
        if config.model_type != "bert" and not getattr(config, "is_encoder_decoder", False):
            raise ConfigError(f"model {self.cfg.model.name_or_path} ({config.model_type}) "
                              "cannot generate summaries; use a sequence-to-sequence checkpoint "
                              "such as facebook/bart-large (or a BERT checkpoint, which is "
                              "warm-started into one)")

    def build_model(self, dtype: torch.dtype = torch.float32) -> tuple[nn.Module, Any]:
        import transformers

        path = self.cfg.model.name_or_path
        config = load_config(path)  # OSError: reported by the training loop
        self.check_model_config(config)
        if config.model_type == "bert":
            from . import warm_start

            return warm_start.bart_from_bert(path, dtype)
        return (from_pretrained(getattr(transformers, self.model_class), path, dtype),
                load_tokenizer(path))

    def skeleton(self, config: Any) -> nn.Module:
        """A BERT checkpoint plans as the BART it is warm-started into (:mod:`.warm_start`)."""
        if config.model_type == "bert":
            from types import SimpleNamespace

            from .warm_start import bart_config_from_bert

            # The special-token ids only fill config fields; they shape no module, so no
            # tokenizer file is read for them.
            ids = SimpleNamespace(cls_token_id=0, sep_token_id=1, pad_token_id=2)
            config = bart_config_from_bert(config, ids)
        return super().skeleton(config)

    # ---------------------------------------------------------------- data

    def _local_or_hub(self) -> bool:
        task = self.cfg.task
        return self.spec.bundled is None or bool(task.data_files or task.data_dir or task.dataset)

    def _hub(self) -> tuple[str | None, str | None]:
        dataset = self.cfg.task.dataset or self.spec.hub_dataset
        return dataset, self.spec.hub_config if dataset == self.spec.hub_dataset else None

    def load_raw(self) -> dict[str, datasets.Dataset]:
        """Raw train and validation splits with the spec's columns."""
        if not self._local_or_hub():
            return self.spec.bundled()
        dataset, config_name = self._hub()
        return rawdata.load_splits(self.cfg.task, SPLITS, dataset=dataset, config_name=config_name)

    def where(self, split: str) -> str:
        if not self._local_or_hub():
            return f"bundled {self.name} corpus ({split})"
        dataset, config_name = self._hub()
        return rawdata.describe_source(self.cfg.task, split, dataset=dataset,
                                       config_name=config_name)

    def source_texts(self, values: list[Any]) -> list[str]:
        """Sources as the model reads them: ``task.source_prefix`` (T5's "summarize: ") first."""
        prefix = self.cfg.task.source_prefix
        return [prefix + ("" if x is None else str(x)) for x in values]

    def encode(self, ds: datasets.Dataset, split: str, tokenizer: Any) -> datasets.Dataset:
        """Token ids of sources and labels; evaluation splits keep ``id`` and ``reference``."""
        spec, task = self.spec, self.cfg.task
        rawdata.require_columns(ds, [spec.source_column, spec.target_column], self.where(split))
        keep_text = split != "train"  # scoring needs the raw reference and the row's id

        def tokenize(batch: dict[str, list]) -> dict[str, list]:
            sources = self.source_texts(batch[spec.source_column])
            targets = ["" if x is None else str(x) for x in batch[spec.target_column]]
            enc = tokenizer(sources, max_length=task.max_length, truncation=True)
            labels = tokenizer(text_target=targets, max_length=task.max_target_length,
                               truncation=True)["input_ids"]
            out = {"input_ids": enc["input_ids"], "attention_mask": enc["attention_mask"],
                   "labels": labels}
            if keep_text:
                out["reference"] = targets
            return out

        encoded = ds.map(tokenize, batched=True, remove_columns=ds.column_names,
                         desc=f"tokenizing {self.name} {split}")
        if not keep_text:
            return encoded
        ids = ([str(x) for x in ds[spec.id_column]] if spec.id_column in ds.column_names
               else [f"{split}-{i}" for i in range(len(ds))])  # local files may lack ids
        return encoded.add_column("id", ids)

    def load_data(self, tokenizer: Any) -> TaskData:
        if tokenizer.pad_token_id is None:
            raise ConfigError(f"the tokenizer of {self.cfg.model.name_or_path} has no padding "
                              "token; use a checkpoint whose tokenizer defines one")
        self.tokenizer = tokenizer
        task = self.cfg.task
        info: dict[str, Any] = {"task": self.name}
        splits: dict[str, datasets.Dataset] = {}
        for split, ds in self.load_raw().items():
            limit = task.max_train_samples if split == "train" else task.max_eval_samples
            splits[split] = self.encode(rawdata.take(ds, limit), split, tokenizer)
            info[f"{split}_examples"] = len(splits[split])
            info[f"{split}_source"] = self.where(split)
            if len(splits[split]) == 0:
                raise ConfigError(f"{self.where(split)} has no rows; give the split some data")
        train = splits.pop("train")
        pad_id = tokenizer.pad_token_id
        return TaskData(train=train, eval_splits=splits,
                        collate=lambda items: pad_batch(items, pad_id), info=info)

    # ---------------------------------------------------------------- scoring

    def generation_kwargs(self) -> dict[str, Any]:
        """Arguments of ``model.generate`` from the task config."""
        t = self.cfg.task
        kwargs = {"num_beams": t.num_beams, "max_new_tokens": self.max_new_tokens,
                  "min_new_tokens": t.generation_min_length,
                  "no_repeat_ngram_size": t.no_repeat_ngram_size, "do_sample": False}
        if t.num_beams > 1:  # beam-only settings (greedy search warns about them)
            # early stopping: a batch ends once every example has num_beams finished beams
            kwargs.update(length_penalty=t.length_penalty, early_stopping=True)
        return kwargs

    @torch.no_grad()
    def generate(self, model: nn.Module, data: Dataset, *, batch_size: int,
                 device: torch.device, autocast: Callable[[], Any], split: str = "") -> list[str]:
        """One generated summary per example of an encoded split, in data order
        (generated in length-sorted batches, see :mod:`.eval_order`)."""
        if self.tokenizer is None:
            raise RuntimeError("call load_data before generating")
        was_training = model.training
        model.eval()
        out: list[str] = []
        batches = eval_order.sorted_batches(eval_order.input_lengths(data), batch_size)
        try:  # the run's progress display (or eval's) shows how far along it is
            for rows in progress.counted(batches, "generating"):
                picked = data[rows]  # columns -> lists, in the batch's row order
                items = [{"input_ids": i, "attention_mask": m}
                         for i, m in zip(picked["input_ids"], picked["attention_mask"])]
                batch = {k: v.to(device) for k, v in
                         pad_batch(items, self.tokenizer.pad_token_id).items()}
                with autocast():
                    ids = model.generate(**batch, **self.generation_kwargs())
                out.extend(t.strip() for t in
                           self.tokenizer.batch_decode(ids, skip_special_tokens=True))
        finally:
            model.train(was_training)
        return eval_order.restore_order(out, batches)

    @torch.no_grad()
    def evaluate(self, model: nn.Module, split: str, data: Dataset, *, batch_size: int,
                 collate: Callable, device: torch.device,
                 autocast: Callable[[], Any]) -> dict[str, float]:
        predictions = self.generate(model, data, batch_size=batch_size, device=device,
                                    autocast=autocast, split=split)
        references = list(data["reference"])
        self.predictions[split] = [
            {"id": i, "prediction": p, "reference": r}
            for i, p, r in zip(data["id"], predictions, references)]
        from .rouge import rouge

        return rouge(predictions, references)

    def metric_names(self) -> tuple[str, ...]:
        from .rouge import ROUGE_TYPES

        return ROUGE_TYPES

    def save_predictions(self, run_dir: Path) -> list[Path]:
        """``predictions.jsonl``: one JSON object per evaluated example."""
        return rawdata.write_jsonl(Path(run_dir) / PREDICTIONS_JSONL, self.predictions)

    # ---------------------------------------------------------------- predict

    def predict_columns(self, columns: Sequence[str], where: str) -> list[str]:
        return require(columns, (self.spec.source_column,), where)

    @torch.no_grad()
    def predict_rows(self, model: nn.Module, tokenizer: Any, ds: datasets.Dataset,
                     device: torch.device) -> list[dict[str, Any]]:
        """``summary`` per row, generated with the task's settings (beams, lengths)."""
        sources = self.source_texts(ds[self.spec.source_column])  # with source_prefix (T5)
        enc = tokenizer(sources, max_length=self.cfg.task.max_length, truncation=True,
                        padding=True, return_tensors="pt")
        inputs = {k: enc[k].to(device) for k in ("input_ids", "attention_mask")}
        ids = model.generate(**inputs, **self.generation_kwargs())
        return [{"summary": s.strip()}
                for s in tokenizer.batch_decode(ids, skip_special_tokens=True)]


def summarization_task(cfg: RunConfig) -> SummarizationTask:
    return SummarizationTask(SUMMARIZATION_SPECS[cfg.task.name], cfg)
