"""``causal_lm``: fine-tune a decoder-only model (Llama, Qwen, Mistral, GPT-2, ...) on your own
rows: local JSONL/CSV/Parquet (``task.data_dir`` or ``task.data_files``) or a hub dataset
(``task.dataset``) with ``train`` and ``validation`` splits.

Rows are ``text``, ``prompt`` + ``response``, chat ``messages``, sharegpt ``conversations`` or
alpaca ``instruction`` + ``output`` (:mod:`.causal_lm_data`; told by the columns or named by
``task.format``); the loss covers response tokens only by default. Evaluation is the
validation loss (mean cross-entropy per target token, the same tokens the training loss
counts) and its perplexity ``exp(loss)``; with ``task.max_new_tokens > 0`` every prompted
row also gets a greedy continuation, scored against the reference response by exact match
(x 100, after stripping surrounding whitespace) and ROUGE-L F x 100, and written to
``predictions.jsonl`` (id, prompt, prediction, reference) by
:meth:`CausalLMTask.save_predictions`.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import datasets
import torch
from torch import nn
from torch.utils.data import Dataset

from ..config import ConfigError, RunConfig
from ..errors import first_line
from ..rundir.layout import PREDICTIONS_JSONL
from . import data as rawdata
from . import eval_order, progress
from .base import Task, TaskData, no_autocast
from .causal_lm_data import (
    CHATS,
    LABEL_PAD,
    SHAPE_WORDS,
    chat_of,
    encode_row,
    needed,
    pack,
    pad_left,
    pad_right,
    row_shape,
    usable_rows,
)
from .pretrained import from_pretrained, load_config, load_tokenizer

SPLITS = ("train", "validation")
PREDICT_TOKENS = 64
"""``adalora predict``'s generation length when the run's task.max_new_tokens is 0."""


class CausalLMTask(Task):
    """Language modelling on your own prompts and responses (or texts, or chats)."""

    name = "causal_lm"
    model_class = "AutoModelForCausalLM"
    primary_metric = "loss"
    eval_split_names = ("validation",)

    def __init__(self, cfg: RunConfig):
        self.cfg = cfg
        self.tokenizer: Any = None  # set by load_data; generation decodes with it
        self.predictions: dict[str, list[dict[str, str]]] = {}

    # ---------------------------------------------------------------- model

    def check_model_config(self, config: Any) -> None:
        if getattr(config, "is_encoder_decoder", False):
            raise ConfigError(f"model {self.cfg.model.name_or_path} ({config.model_type}) is an "
                              "encoder-decoder; causal_lm needs a decoder-only model (use "
                              "task.name=xsum with your data for sequence-to-sequence training)")
        if _is_encoder(config):
            raise ConfigError(f"model {self.cfg.model.name_or_path} ({config.model_type}) is an "
                              "encoder (a masked language model), which cannot learn to "
                              "continue a text; causal_lm needs a decoder-only model (Llama, "
                              "Qwen, Mistral, GPT-2, ...)")

    def build_model(self, dtype: torch.dtype = torch.float32) -> tuple[nn.Module, Any]:
        import transformers

        path = self.cfg.model.name_or_path
        config = load_config(path)  # OSError: reported by the caller
        self.check_model_config(config)
        try:
            # the config already read: a GGUF file's metadata takes seconds to parse
            model = from_pretrained(getattr(transformers, self.model_class), path, dtype,
                                    config=config)
        except ValueError as err:  # transformers: no causal-LM class for this config
            raise ConfigError(f"model {path} ({config.model_type}) has no causal language "
                              f"model head ({first_line(err)[:120]}); use a "
                              "decoder-only checkpoint") from None
        return model, load_tokenizer(path)

    # ---------------------------------------------------------------- data

    def where(self, split: str) -> str:
        return rawdata.describe_source(self.cfg.task, split, dataset=self.cfg.task.dataset)

    def raw_splits(self) -> dict[str, datasets.Dataset]:
        """The train and validation rows before encoding (a task built on this family
        with data of its own overrides this and :meth:`where`)."""
        task = self.cfg.task
        return rawdata.load_splits(task, SPLITS, dataset=task.dataset)

    def encode(self, ds: datasets.Dataset, split: str, tokenizer: Any
               ) -> tuple[list[dict[str, Any]], int, str | None]:
        """The encoded rows of a split that have something to learn, how many rows were
        left out, and the one line that says which and why."""
        where = self.where(split)
        if len(ds) == 0:
            raise ConfigError(f"{where} has no rows; give the split some data")
        shape = row_shape(list(ds.column_names), self.cfg.task, where)
        ids = ([str(x) for x in ds["id"]] if "id" in ds.column_names
               else [f"{split}-{i}" for i in range(len(ds))])
        raw = list(ds)
        kept, left_out = usable_rows(raw, shape, self.cfg.task, where)
        rows = []
        for i in kept:
            encoded = encode_row(tokenizer, shape, raw[i], self.cfg.task, f"{where} row {i + 1}")
            rows.append({**encoded, "id": ids[i]})
        return rows, len(raw) - len(kept), left_out

    def load_data(self, tokenizer: Any) -> TaskData:
        if tokenizer.eos_token_id is None:  # every response ends with it: it is learned
            raise ConfigError(f"the tokenizer of {self.cfg.model.name_or_path} has no "
                              "end-of-sequence token, which causal_lm ends every response "
                              "with so the model learns to stop; use a decoder model's "
                              "tokenizer (or set eos_token in its tokenizer_config.json)")
        if tokenizer.pad_token_id is None:  # most decoder tokenizers have none: pad with EOS
            tokenizer.pad_token = tokenizer.eos_token
        self.tokenizer = tokenizer
        task = self.cfg.task
        raw = self.raw_splits()
        info: dict[str, Any] = {"task": self.name}
        splits: dict[str, Any] = {}
        notes: list[str] = []
        for split, ds in raw.items():
            limit = task.max_train_samples if split == "train" else task.max_eval_samples
            rows, n_left_out, left_out = self.encode(rawdata.take(ds, limit), split, tokenizer)
            info[f"{split}_examples"] = len(rows)  # what is trained and scored, not the file
            if left_out:
                info[f"{split}_left_out"] = n_left_out
                notes.append(left_out)
            info[f"{split}_source"] = self.where(split)
            splits[split] = rows
        train = splits.pop("train")
        train = [{"input_ids": r["input_ids"], "labels": r["labels"]} for r in train]
        if task.packing:
            train = pack(train, task.max_length)
            info["train_packed_rows"] = len(train)
        pad_id = tokenizer.pad_token_id
        return TaskData(train=datasets.Dataset.from_list(train),
                        eval_splits={k: datasets.Dataset.from_list(v) for k, v in splits.items()},
                        collate=lambda items: pad_right(items, pad_id), info=info, notes=notes)

    # ---------------------------------------------------------------- scoring

    @torch.no_grad()
    def token_loss(self, model: nn.Module, data: Dataset, *, batch_size: int,
                   collate: Callable, device: torch.device,
                   autocast: Callable[[], Any]) -> tuple[float, int]:
        """(summed cross-entropy, number of target tokens) over a split."""
        total, count = 0.0, 0
        batches = eval_order.sorted_batches(eval_order.input_lengths(data), batch_size)
        for rows in progress.counted(batches, "scoring the loss"):
            batch = {k: v.to(device) for k, v in collate([data[i] for i in rows]).items()}
            with autocast():
                logits = model(input_ids=batch["input_ids"],
                               attention_mask=batch["attention_mask"]).logits
            # position t predicts token t + 1 (the model's own shift)
            logits, labels = logits[:, :-1].float(), batch["labels"][:, 1:]
            total += float(nn.functional.cross_entropy(
                logits.reshape(-1, logits.shape[-1]), labels.reshape(-1),
                ignore_index=LABEL_PAD, reduction="sum"))
            count += int((labels != LABEL_PAD).sum())
        return total, count

    @torch.no_grad()
    def generate(self, model: nn.Module, prompts: list[list[int]], *, batch_size: int,
                 device: torch.device, autocast: Callable[[], Any],
                 max_new_tokens: int) -> list[str]:
        """Greedy continuations of token-id prompts, in prompt order (only the new text)."""
        tok = self.tokenizer
        out: list[str] = []
        batches = eval_order.sorted_batches([len(p) for p in prompts], batch_size)
        for rows in progress.counted(batches, "generating"):
            batch = {k: v.to(device) for k, v in
                     pad_left([prompts[i] for i in rows], tok.pad_token_id).items()}
            with autocast():
                ids = model.generate(**batch, max_new_tokens=max_new_tokens, do_sample=False,
                                     pad_token_id=tok.pad_token_id,
                                     eos_token_id=tok.eos_token_id)
            new = ids[:, batch["input_ids"].shape[1]:]
            out.extend(t.strip() for t in tok.batch_decode(new, skip_special_tokens=True))
        return eval_order.restore_order(out, batches)

    def metric_names(self) -> tuple[str, ...]:
        """Loss and perplexity; exact match and ROUGE-L when evaluation generates."""
        generated = ("exact_match", "rougeL") if self.cfg.task.max_new_tokens > 0 else ()
        return ("loss", "perplexity", *generated)

    @torch.no_grad()
    def evaluate(self, model: nn.Module, split: str, data: Dataset, *, batch_size: int,
                 collate: Callable, device: torch.device,
                 autocast: Callable[[], Any]) -> dict[str, float]:
        was_training = model.training
        model.eval()
        try:
            total, count = self.token_loss(model, data, batch_size=batch_size, collate=collate,
                                           device=device, autocast=autocast)
            if count == 0:
                raise ConfigError(f"{self.where(split)} has no target tokens to score")
            loss = total / count
            metrics = {"loss": loss, "perplexity": math.exp(min(loss, 700.0))}
            n_new = self.cfg.task.max_new_tokens
            if n_new > 0 and "prompt_ids" in data.column_names:
                metrics.update(self._generation_scores(model, split, data, batch_size,
                                                       device, autocast, n_new))
        finally:
            model.train(was_training)
        return metrics

    def _generation_scores(self, model, split, data, batch_size, device, autocast,
                           n_new) -> dict[str, float]:
        from .rouge import rouge

        prompts = list(data["prompt_ids"])
        predictions = self.generate(model, prompts, batch_size=batch_size, device=device,
                                    autocast=autocast, max_new_tokens=n_new)
        references = [str(r) for r in data["reference"]]
        decode = self.tokenizer.decode
        self.predictions[split] = [
            {"id": i, "prompt": decode(p, skip_special_tokens=True), "prediction": y,
             "reference": r} for i, p, y, r in zip(data["id"], prompts, predictions, references)]
        exact = sum(y == r.strip() for y, r in zip(predictions, references)) / len(predictions)
        return {"exact_match": 100.0 * exact,
                "rougeL": rouge(predictions, references)["rougeL"]}

    def save_predictions(self, run_dir: Path) -> list[Path]:
        """``predictions.jsonl`` when evaluation generated (task.max_new_tokens > 0)."""
        if not self.predictions:
            return []
        return rawdata.write_jsonl(Path(run_dir) / PREDICTIONS_JSONL, self.predictions)

    # ---------------------------------------------------------------- predict

    def predict_columns(self, columns: Sequence[str], where: str) -> list[str]:
        task = self.cfg.task
        # in the order predict_rows takes them, which is how training tells a file's format
        wanted = (task.messages_column, "conversations", "instruction", task.prompt_column,
                  task.text_column)
        if not any(c in columns for c in wanted):
            raise ConfigError(f"{where} has no {task.prompt_column!r} (or "
                              f"{task.messages_column!r}, sharegpt's 'conversations', alpaca's "
                              f"'instruction', {task.text_column!r}) column; it has "
                              f"{', '.join(columns) or 'no columns'}")
        return [next(c for c in wanted if c in columns)]  # the one predict_rows reads

    def predict_rows(self, model: nn.Module, tokenizer: Any, ds: datasets.Dataset,
                     device: torch.device) -> list[dict[str, Any]]:
        """``adalora predict``: a ``response`` generated for every row's prompt (a chat's
        messages; a sharegpt conversation or an alpaca instruction, asked as evaluation asks
        it, without the closing reply; a prompt; or a text to continue)."""
        if tokenizer.pad_token_id is None:
            tokenizer.pad_token = tokenizer.eos_token
        self.tokenizer = tokenizer
        task, columns = self.cfg.task, list(ds.column_names)
        kind = next((k for k in CHATS if needed(k, task)[0] in columns), None)
        if kind is not None:
            if not getattr(tokenizer, "chat_template", None):
                raise ConfigError(f"the input holds {SHAPE_WORDS[kind]} but the tokenizer has "
                                  f"no chat template; give a {task.prompt_column!r} column "
                                  "instead")
            # rows come in batches, so a row number here would be the batch's: the bad value
            # is quoted instead
            chats = [chat_of(kind, row, task, "the input", reply=False) for row in ds]
            prompts = [tokenizer(tokenizer.apply_chat_template(
                m, tokenize=False, add_generation_prompt=True),
                add_special_tokens=False)["input_ids"] for m in chats]
        else:
            column = next(c for c in (task.prompt_column, task.text_column) if c in columns)
            prompts = [tokenizer("" if x is None else str(x))["input_ids"] for x in ds[column]]
        prompts = [p[-task.max_length:] for p in prompts]  # keep the end: it is continued
        out = self.generate(model, prompts, batch_size=len(prompts), device=device,
                            autocast=no_autocast,
                            max_new_tokens=task.max_new_tokens or PREDICT_TOKENS)
        return [{"response": text} for text in out]


def _is_encoder(config: Any) -> bool:
    """An encoder-only architecture (BERT, RoBERTa, ELECTRA, ...): transformers maps it to a
    causal-LM class too, which is only meant as the decoder half of an encoder-decoder
    (``is_decoder``); trained alone here it would see every token both ways."""
    from transformers.models.auto.modeling_auto import MODEL_FOR_MASKED_LM_MAPPING_NAMES

    return (config.model_type in MODEL_FOR_MASKED_LM_MAPPING_NAMES
            and not getattr(config, "is_decoder", False))


def causal_lm_task(cfg: RunConfig) -> CausalLMTask:
    return CausalLMTask(cfg)
