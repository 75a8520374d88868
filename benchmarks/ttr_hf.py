"""One time-to-result run through Hugging Face ``Trainer`` + PEFT's AdaLoRA, timed by phase
(a child of time_to_result.py; PEFT and accelerate come from the ``bench`` extra).

    python benchmarks/ttr_hf.py CONFIG OUT_DIR [key=value ...]

The same run as ``adalora train CONFIG``: the same pretrained model, the same raw splits
(read through our task, so the demo's fixed hash split and any sample limits are the
same rows), the same max length, batch sizes, learning rate, warm-up, weight decay,
clipping, epochs or max_steps, seed, and the same AdaLoRA schedule (r0, b(T) = target_r x
n, t_init, t_final, delta_t, beta1/2, alpha, dropout, orthogonal weight gamma, T) on the
same adapted matrices. The recipe is the one PEFT documents: tokenize with ``datasets.map``,
pad per batch, ``Trainer.train()``, and ``update_and_allocate(global_step)`` after every
optimizer step from a Trainer callback (``on_optimizer_step`` runs before the gradients are
zeroed, which the importance scores need). Evaluation is ``Trainer.predict`` on the
validation split. Known differences, both Trainer defaults: no weight decay on biases and
LayerNorm weights, and warm-up starting from lr 0 rather than lr/warmup.

Precision: fp32, Trainer's default on a CPU; ``TTR_HF_BF16=1`` in the environment sets
``bf16=True`` (Trainer's CPU bf16 autocast): time_to_result.py sets it for the like-for-like run
where ours computes in bf16, and for ``--trainer bf16``.

Prints one JSON line like ttr_ours.py: wall, load, train, evaluate, other, accuracy,
precision.
"""

import time

START = time.perf_counter()  # before any heavy import: imports count as load time

import dataclasses  # noqa: E402
import json  # noqa: E402
import math  # noqa: E402
import os  # noqa: E402
import sys  # noqa: E402

import datasets  # noqa: E402
import numpy as np  # noqa: E402
import torch  # noqa: E402
from peft import AdaLoraConfig, get_peft_model  # noqa: E402
from transformers import (  # noqa: E402
    AutoModelForSequenceClassification,
    AutoTokenizer,
    DataCollatorWithPadding,
    Trainer,
    TrainerCallback,
    TrainingArguments,
)
from transformers.utils import logging as hf_logging  # noqa: E402

from adalora_cli import resources  # noqa: E402
from adalora_cli.config import ConfigError, RunConfig, load_config  # noqa: E402
from adalora_cli.methods.inject import resolve_targets  # noqa: E402
from adalora_cli.tasks import get_task  # noqa: E402


class AllocateRanks(TrainerCallback):
    """PEFT's AdaLoRA step: score, prune and mask after each optimizer step."""

    def __init__(self, model):
        self.model = model

    def on_optimizer_step(self, args, state, control, **kwargs):
        # global_step counts finished steps before this one: PEFT's loop passes 0 first
        self.model.base_model.update_and_allocate(state.global_step)


def resolved(cfg: RunConfig) -> RunConfig:
    task = dataclasses.replace(cfg.task, data_files=(
        {k: resources.resolve(v) for k, v in cfg.task.data_files.items()}
        if cfg.task.data_files else None),
        data_dir=resources.resolve(cfg.task.data_dir) if cfg.task.data_dir else None)
    model = dataclasses.replace(cfg.model, name_or_path=resources.resolve(cfg.model.name_or_path))
    return dataclasses.replace(cfg, task=task, model=model)


def labeled(task, ds, split: str, tokenizer, limit: int | None):
    """Labeled rows (the first ``limit``), tokenized the usual way with ``datasets.map``."""
    labels = task.label_ids(list(ds["label"]), split)
    keep = [i for i, y in enumerate(labels) if y >= 0][:limit]
    ds = ds.select(keep)
    columns, max_length = task.spec.text_columns, task.cfg.task.max_length

    def tokenize(batch):
        return tokenizer(*[batch[c] for c in columns], truncation=True, max_length=max_length)

    ds = ds.map(tokenize, batched=True, remove_columns=ds.column_names)
    return ds.add_column("labels", [labels[i] for i in keep])


def peft_config(cfg: RunConfig, targets: list[str], total: int) -> AdaLoraConfig:
    a = cfg.adalora
    if a.budget % len(targets):
        raise ConfigError(f"PEFT's AdaLoRA budget is target_r x {len(targets)} matrices; "
                          f"adalora.budget={a.budget} is not a multiple, pick one that is")
    return AdaLoraConfig(task_type="SEQ_CLS", init_r=a.init_rank,
                         target_r=a.budget // len(targets), tinit=a.t_init, tfinal=a.t_final,
                         deltaT=a.delta_t, beta1=a.beta1, beta2=a.beta2, orth_reg_weight=a.gamma,
                         lora_alpha=a.alpha, lora_dropout=a.dropout, total_step=total,
                         target_modules=targets)


def main() -> None:
    config, out_dir, *overrides = sys.argv[1:]
    hf_logging.set_verbosity_error()
    hf_logging.disable_progress_bar()
    datasets.disable_progress_bars()
    cfg = resolved(load_config(config, overrides))
    t = cfg.train
    bf16 = os.environ.get("TTR_HF_BF16") == "1"
    task = get_task(cfg)
    tokenizer = AutoTokenizer.from_pretrained(cfg.model.name_or_path)
    torch.manual_seed(t.seed)  # the head's initialization, as our runner seeds it
    model = AutoModelForSequenceClassification.from_pretrained(
        cfg.model.name_or_path, num_labels=task.num_labels)
    raw = task.load_raw()
    train = labeled(task, raw["train"], "train", tokenizer, cfg.task.max_train_samples)
    valid = labeled(task, raw["validation"], "validation", tokenizer, cfg.task.max_eval_samples)
    per_epoch = math.ceil(len(train) / (t.batch_size * t.grad_accum))
    total = t.max_steps or max(1, math.ceil(per_epoch * t.epochs))
    targets = resolve_targets(model, cfg.method.target_modules)
    model = get_peft_model(model, peft_config(cfg, targets, total))
    args = TrainingArguments(
        output_dir=out_dir, per_device_train_batch_size=t.batch_size,
        per_device_eval_batch_size=t.eval_batch_size, gradient_accumulation_steps=t.grad_accum,
        learning_rate=t.learning_rate, weight_decay=t.weight_decay, warmup_steps=t.warmup_steps,
        lr_scheduler_type="linear", max_grad_norm=t.max_grad_norm, num_train_epochs=t.epochs,
        max_steps=t.max_steps or -1, seed=t.seed, data_seed=t.seed, use_cpu=True,
        save_strategy="no", eval_strategy="no", logging_strategy="no", report_to="none",
        disable_tqdm=True, dataloader_num_workers=0, bf16=bf16)
    trainer = Trainer(model=model, args=args, train_dataset=train,
                      data_collator=DataCollatorWithPadding(tokenizer),
                      callbacks=[AllocateRanks(model)])
    marks = {"train_start": time.perf_counter()}
    result = trainer.train()
    marks["eval_start"] = time.perf_counter()
    predictions = trainer.predict(valid)
    marks["eval_end"] = time.perf_counter()
    accuracy = float(np.mean(predictions.predictions.argmax(-1) == predictions.label_ids))
    ranks = model.base_model.peft_config["default"].rank_pattern or {}
    wall = time.perf_counter() - START
    print(json.dumps({
        "runner": "hf", "wall": wall, "load": marks["train_start"] - START,
        "train": marks["eval_start"] - marks["train_start"],
        "evaluate": marks["eval_end"] - marks["eval_start"],
        "other": wall - (marks["eval_end"] - START), "accuracy": accuracy,
        "steps": result.global_step, "train_examples": len(train), "eval_examples": len(valid),
        "final_budget": int(sum(sum(m) for m in ranks.values())) if ranks else None,
        "precision": "bf16" if bf16 else "fp32"}))


if __name__ == "__main__":
    main()
