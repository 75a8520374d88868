"""Run configuration: YAML + ``key=value`` overrides -> frozen, validated dataclasses.

Every default lives here, once. After :func:`load_config` nothing reads raw dicts:
the rest of the package sees only these typed objects. Unknown keys are rejected by
their full dotted path, so a typo never silently falls back to a default.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
import types
import typing
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar, Literal

import yaml

from .errors import shown


class ConfigError(ValueError):
    """A config problem, phrased as one line that names the problem and the fix."""


# --------------------------------------------------------------------------- checks
# Each section checks itself in __post_init__ (as PEFT's and litgpt's configs do), so a bad
# value is refused however the section is made: loaded, overridden or dataclasses.replace'd.
# Checks that need data (the schedule against T) happen when the method is built.


def _check(cond: bool, message: str) -> None:
    if not cond:
        raise ConfigError(message)


def _check_finite(obj: Any, prefix: str) -> None:
    """inf or nan in any number field is a typo, never a setting."""
    for f in dataclasses.fields(obj):
        value = getattr(obj, f.name)
        if isinstance(value, float) and not math.isfinite(value):
            raise ConfigError(f"{prefix}.{f.name} must be a finite number, got {value}")


def _check_dropout(value: float, key: str) -> None:
    _check(0.0 <= value < 1.0, f"{key} must lie in [0, 1), got {value}")


@dataclass(frozen=True)
class TaskConfig:
    """What to learn and where the data comes from."""

    name: str = "rte"
    """Task key: a GLUE task (cola sst2 mrpc qqp stsb mnli qnli rte), squad_v1, squad_v2,
    xsum, cnn_dailymail, classification (your own labelled texts on an encoder, labels read
    from the data; numeric labels make it a regression), causal_lm (your own
    JSONL/CSV/Parquet on a decoder-only model), or an offline demo (rotten_tomatoes,
    bbc_topic, bbc_news, and bbc_topic_chat for a decoder-only chat model), or
    gsm8k_metamath (PEFT's method comparison: a decoder trained on MetaMathQA, scored on
    GSM8K)."""
    dataset: str | None = None
    """Hub dataset id; None means the task's default (nyu-mll/glue for GLUE)."""
    revision: str | None = None
    """Hub dataset revision: a branch, tag, commit id, or refs/convert/parquet (the hub's
    parquet conversion). None means main, or the conversion when main holds a loading
    script that the datasets library no longer runs (EdinburghNLP/xsum). Refused beside
    data_dir or data_files: local files have no revisions."""
    data_dir: str | None = None
    """Local folder holding ``<split>.{tsv,csv,json,jsonl,parquet}`` files in the hub's columns."""
    data_files: dict[str, str] | None = None
    """Explicit ``{split: file}`` mapping; overrides data_dir and the hub."""
    max_length: int = 128
    """Tokens per example after truncation (pairs are truncated longest-first)."""
    max_train_samples: int | None = None
    """Use only the first N training examples (quick experiments)."""
    max_eval_samples: int | None = None
    """Use only the first N examples of each evaluation split."""
    holdout: int | None = None
    """Rows carved out of the training split (chosen by a hash of each row, so the same
    rows whatever their order), removed from training and scored as the evaluation split
    ``heldout``: what ``adalora tune`` chooses a learning rate on, so that the validation
    score a report prints is not the one the choice was made on. gsm8k_metamath takes them
    from GSM8K's train split instead and trains on all its MetaMathQA rows. None: no
    carve-out."""
    doc_stride: int = 128
    """SQuAD: tokens shared by consecutive windows of a context longer than max_length
    (the question is repeated in every window; only the context is truncated)."""
    n_best: int = 20
    """SQuAD: start and end candidates per window searched for the answer span."""
    max_answer_length: int = 30
    """SQuAD: longest answer, in tokens, that decoding may predict."""
    null_score_threshold: float = 0.0
    """SQuAD v2: answer "" when the null (CLS) score beats the best span by more than this."""
    max_target_length: int = 128
    """Summarization: summary tokens kept as training labels (longer summaries are truncated);
    the source is truncated to max_length."""
    num_beams: int = 4
    """Summarization: beam width of the generation that is scored (1 = greedy)."""
    generation_max_length: int | None = None
    """Summarization: most tokens generated per summary; None means max_target_length."""
    generation_min_length: int = 0
    """Summarization: fewest tokens generated before the end of the summary is allowed."""
    length_penalty: float = 1.0
    """Summarization: a beam's log-probability is divided by length ** length_penalty, so
    values above 1 favour longer summaries."""
    no_repeat_ngram_size: int = 0
    """Summarization: never generate the same n-gram of this size twice; 0 disables."""
    source_prefix: str = ""
    """Summarization: text put before every source, e.g. "summarize: " for T5 checkpoints,
    which were pretrained with task prefixes; empty for BART."""
    text_column: str = "text"
    """causal_lm: column of plain-text rows (the loss covers every token). classification:
    the column of the text to classify (the first text of a pair)."""
    text_pair_column: str | None = None
    """classification: a second text column; each row is then encoded as a pair (two
    segments, truncated longest-first), as GLUE's sentence pairs are. None: one text."""
    label_column: str | None = None
    """classification: the column of labels: class names or integer ids (a classifier), or
    numbers with a decimal point (a regressor with one output). None means ``label`` (unset,
    so checkpoints written before this key existed still resume)."""
    labels: list[str] | None = None
    """classification: the class names in id order. None reads them from the training split,
    sorted (integer ids numerically); a run records them in its config.yaml, so its model,
    predictions and exports use these names without reading the data again."""
    regression: bool | None = None
    """classification: true trains a regressor on numeric labels, false a classifier (even
    on labels like 0.5); None decides by the training labels: numbers with a decimal point
    mean regression. A run records the choice."""
    prompt_column: str = "prompt"
    """causal_lm: column of prompts, used verbatim (include any separator you want between
    prompt and response); pairs with response_column."""
    response_column: str = "response"
    """causal_lm: column of the responses the model learns to write after the prompt."""
    messages_column: str = "messages"
    """causal_lm: column of chat conversations ([{role, content}, ...], ending with the
    assistant's reply), rendered with the tokenizer's chat template."""
    format: Literal["auto", "prompt_response", "messages", "text", "alpaca",
                    "sharegpt"] = "auto"
    """causal_lm: how rows are read. auto tells by the columns: messages_column, then
    sharegpt's ``conversations``, then alpaca's ``instruction`` + ``output``, then
    prompt_column + response_column, then text_column; a named format reads that shape
    and refuses a file without its columns."""
    system_prompt: str | None = None
    """causal_lm: a system message put first in every chat (messages, alpaca and sharegpt
    rows) that has none of its own; prompt/response and text rows have no place for one.
    None means the task's own: none for causal_lm, the LLM demo's "You sort BBC News
    articles by topic." for bbc_topic_chat's chats; "" means none."""
    train_on_prompt: bool = False
    """causal_lm: also compute the loss on prompt tokens (default: response tokens only)."""
    packing: bool = False
    """causal_lm: concatenate short training examples into rows of up to max_length tokens
    (fewer padded tokens; examples in one row attend to each other, as in pretraining)."""
    max_new_tokens: int = 0
    """causal_lm: evaluation also generates a response (greedy, up to this many tokens) for
    every prompt and scores exact match and ROUGE-L; 0 scores loss and perplexity only.
    ``adalora predict`` generates up to this many tokens (64 when 0)."""

    def __post_init__(self) -> None:
        _check_finite(self, "task")
        _check(self.max_length >= 8, f"task.max_length must be >= 8, got {self.max_length}")
        _check(self.holdout is None or self.holdout >= 1,
               f"task.holdout must be >= 1 row when set, got {self.holdout}")
        # local files have no revisions: accepted, the key would be silently ignored
        local = "task.data_files" if self.data_files else "task.data_dir" if self.data_dir else ""
        if self.revision is not None and local:
            raise ConfigError(f"task.revision {shown(self.revision)} pins a revision of a hub "
                              f"dataset, but {local} reads local files, which have none; "
                              f"drop one of them ({local}=null reads the hub at that "
                              "revision, task.revision=null the local files)")
        # each family's own keys, checked whatever the task (the defaults all pass); checks
        # that tie two keys of one family (SQuAD's doc_stride < max_length) are its own
        _check(self.n_best >= 1 and self.max_answer_length >= 1,
               f"task.n_best ({self.n_best}) and task.max_answer_length "
               f"({self.max_answer_length}) must be >= 1; defaults are 20 and 30")
        for key, least in (("max_target_length", 1), ("num_beams", 1),
                           ("generation_min_length", 0), ("no_repeat_ngram_size", 0)):
            value = getattr(self, key)
            _check(value >= least, f"task.{key} must be >= {least}, got {value}")
        _check(self.max_new_tokens >= 0, "task.max_new_tokens must be >= 0 (0: no "
               f"generation), got {self.max_new_tokens}")
        self._check_labels()

    def _check_labels(self) -> None:
        if self.labels is None:
            return
        _check(not self.regression, "task.labels names classes, but task.regression=true "
               "trains a regressor; drop one of them")
        names = [name.strip() for name in self.labels]
        _check(len(names) >= 2, f"task.labels needs at least two class names, got "
               f"{len(names)}; a classifier of one class learns nothing")
        _check(all(names), "task.labels holds an empty name; give every class a name")
        twice = sorted({n for n in names if names.count(n) > 1})
        if twice:
            raise ConfigError(f"task.labels names {twice[0][:80]!r} twice; name each class "
                              "once")


@dataclass(frozen=True)
class ModelConfig:
    name_or_path: str = "microsoft/deberta-v3-base"
    """Hub id or local folder of a pretrained checkpoint, or a ``.gguf`` file (llama.cpp's
    format, dequantized at load time; needs the gguf extra). ``package:<module>/<path>``
    names a file inside an installed package."""
    gguf_file: str | None = None
    """A GGUF file inside the folder or hub repo ``name_or_path`` (its file name, as
    transformers' ``gguf_file=``), or a path to one. Not needed when name_or_path is the
    ``.gguf`` file itself, or a folder holding one and no config.json."""
    base_dtype: Literal["fp32", "bf16", "fp16", "auto"] = "fp32"
    """Dtype the frozen base weights are loaded in, whatever dtype the checkpoint was stored
    in; the trained adapter and head are always fp32. bf16/fp16 halve the base's memory and
    need mixed precision (train.precision auto, bf16 or fp16 on CUDA, bf16 on a CPU, which
    refuses fp16); 'auto' is bf16 under bf16 autocast, else fp32."""
    quantize: Literal["none", "nf4"] = "none"
    """'nf4' stores the frozen base's linear weights in 4 bits (QLoRA's NormalFloat, as
    torchao's NF4 tensors; the qlora extra): every ``nn.Linear`` of the backbone whose weight
    splits into 64-value blocks, not embeddings, norms or heads. They are dequantized to
    ``base_dtype`` in each forward, where the adapters meet them. Methods that train the base
    (full, bitfit) and a GGUF base already quantized are refused."""


@dataclass(frozen=True)
class MethodConfig:
    name: str = "adalora"
    """Fine-tuning method: a name in ``adalora_cli.methods.registry.METHODS`` (adalora, lora,
    houlsby, pfeiffer, bitfit, full, today's baselines rslora, dora, pissa, loraplus, sora,
    increlora, the ranks-at-start methods eva and gora, or none: no training, the model
    evaluated as loaded). Checked there, since
    config sits below the methods (like task.name, which the task registry checks)."""
    target_modules: list[str] | None = None
    """Linear modules to adapt, matched as a suffix of the module path; None = the
    model type's defaults: every attention and FFN matrix of every layer, for each model
    type of ``adalora_cli/methods/targets.py`` (docs/own-model.md#which-models)."""


@dataclass(frozen=True)
class AdaLoRAConfig:
    budget: int | None = 144
    """b(T): total rank (number of unmasked singular values) kept at the end; null when
    ``target_rank`` states it instead."""
    target_rank: float | None = None
    """b(T) as a mean final rank per adapted matrix, b(T) / n (PEFT's ``target_r``): when
    set, b(T) = round(target_rank * n) for the n matrices this model adapts, so one config
    means the same on a 16- or a 32-layer model; ``budget`` is then not read (set one of
    the two; ``adalora.budget=...`` on the command line replaces a file's target_rank, and
    the other way round). The run directory's config.yaml records the b(T) it came to."""
    init_rank: int = 4
    """r0: initial rank of every adapted matrix; b0 = n * r0."""
    alpha: float = 32.0
    """Scaling numerator: Delta W is scaled by alpha / r0 (r0 fixed while pruning)."""
    dropout: float = 0.0
    """Dropout on the adapter input."""
    gamma: float = 0.1
    """Weight of the orthogonal regularizer (Eq. 4)."""
    orth_reg: Literal["code", "paper"] = "code"
    """Regularizer form (docs/maths.md#orthogonal-regularizer)."""
    t_init: int = 0
    """t_i: warm-up steps at b0 before pruning starts."""
    delta_t: int = 1
    """Masking interval in optimizer steps."""
    t_final: int = 0
    """t_f: final steps with the rank pattern frozen at b(T)."""
    beta1: float = 0.85
    """EMA coefficient of the smoothed sensitivity (Eq. 9)."""
    beta2: float = 0.85
    """EMA coefficient of the uncertainty (Eq. 10)."""
    score: Literal["smoothed", "sensitivity", "magnitude"] = "smoothed"
    """Importance score: Eq. 11 (default), plain sensitivity Eq. 8, or |lam| (Table 5)."""
    prune: bool = True
    """False keeps every triplet (the SVD-LoRA ablation of Table 6)."""

    def final_budget(self, n: int) -> int:
        """b(T) over ``n`` adapted matrices: ``budget``, or ``target_rank`` x n rounded
        half up (at least 1)."""
        if self.target_rank is None:
            return int(self.budget)  # not None: __post_init__ asks for one of the two
        return max(1, math.floor(self.target_rank * n + 0.5))

    def resolved(self, n: int) -> AdaLoRAConfig:
        """This section with b(T) written out as ``budget`` for ``n`` matrices."""
        if self.target_rank is None:
            return self
        return dataclasses.replace(self, budget=self.final_budget(n), target_rank=None)

    EXCLUSIVE: ClassVar = (("budget", "target_rank"),)
    """Keys of which a config may set only one (checked as a config is read; an override
    of one replaces the other as the file sets it)."""

    def __post_init__(self) -> None:
        _check_finite(self, "adalora")
        _check(self.init_rank >= 1, f"adalora.init_rank must be >= 1, got {self.init_rank}")
        _check(self.budget is not None or self.target_rank is not None,
               "adalora.budget is null but adalora.target_rank is not set; give one of them")
        _check(self.budget is None or self.budget >= 0,
               f"adalora.budget must be >= 0, got {self.budget}")
        _check(self.target_rank is None or self.target_rank > 0,
               f"adalora.target_rank must be > 0 when set, got {self.target_rank}")
        _check(self.delta_t >= 1, f"adalora.delta_t must be >= 1, got {self.delta_t}")
        _check(self.t_init >= 0 and self.t_final >= 0, "adalora.t_init and adalora.t_final "
               f"must be >= 0, got {self.t_init} and {self.t_final}")
        for name, beta in (("beta1", self.beta1), ("beta2", self.beta2)):
            _check(0.0 < beta < 1.0, f"adalora.{name} must lie in (0, 1), got {beta}")
        _check(self.gamma >= 0, f"adalora.gamma must be >= 0, got {self.gamma}")
        _check_dropout(self.dropout, "adalora.dropout")


@dataclass(frozen=True)
class LoRAConfig:
    r: int = 8
    """Rank of B A."""
    alpha: float = 16.0
    """Scaling numerator: Delta W = (alpha / r) B A."""
    dropout: float = 0.0
    """Dropout on the adapter input."""
    gamma: float = 0.0
    """> 0 adds the orthogonal regularizer on A and B (LoRA_regu, Table 6)."""
    prune: bool = False
    """True prunes LoRA doublets with AdaLoRA's scores and schedule (prune-LoRA, Table 5);
    the budget, schedule and score come from the adalora section."""
    rank_pattern: str | None = None
    """A finished AdaLoRA run's directory: each matrix trains at that run's final rank
    (its rank_pattern.json; rank 0 gets no adapter) and ``r`` is not read
    (docs/maths.md#lora-on-adaloras-ranks). None: every matrix at rank ``r``."""
    rank_pattern_sha256: str | None = None
    """sha256 of that run's rank_pattern.json, recorded when the run is built, so a resumed
    run refuses a source whose ranks have changed since."""

    def __post_init__(self) -> None:
        _check_finite(self, "lora")
        _check(self.r >= 1, f"lora.r must be >= 1, got {self.r}")
        _check(self.gamma >= 0, f"lora.gamma must be >= 0, got {self.gamma}")
        _check_dropout(self.dropout, "lora.dropout")
        _check(not (self.prune and self.rank_pattern is not None),
               "lora.rank_pattern takes its ranks from a finished AdaLoRA run, and lora.prune "
               "would prune them again; set one of them")
        _check(self.rank_pattern is not None or self.rank_pattern_sha256 is None,
               "lora.rank_pattern_sha256 is recorded with lora.rank_pattern; set "
               "lora.rank_pattern too, or drop lora.rank_pattern_sha256")


def _check_low_rank(section: str, rank_key: str, rank: int, alpha: float | None,
                    dropout: float) -> None:
    """What every low-rank section asks of its rank, alpha and dropout (on construction)."""
    _check(rank >= 1, f"{section}.{rank_key} must be >= 1, got {rank}")
    _check(alpha is None or alpha > 0, f"{section}.alpha must be > 0, got {alpha}")
    _check(0.0 <= dropout < 1.0, f"{section}.dropout must lie in [0, 1), got {dropout}")


@dataclass(frozen=True)
class RsLoRAConfig:
    """rsLoRA (Kalajdzievski, 2023): LoRA with Delta W scaled by alpha / sqrt(r)
    (docs/maths.md#rslora)."""

    r: int = 8
    """Rank of B A."""
    alpha: float = 16.0
    """Scaling numerator: Delta W = (alpha / sqrt(r)) B A (LoRA's alpha, as the paper
    compares them)."""
    dropout: float = 0.0
    """Dropout on the adapter input."""

    def __post_init__(self) -> None:
        _check_finite(self, "rslora")
        _check_low_rank("rslora", "r", self.r, self.alpha, self.dropout)


@dataclass(frozen=True)
class DoRAConfig:
    """DoRA (Liu et al., 2024): a trained magnitude per output feature times the direction
    of W0 + s B A (docs/maths.md#dora)."""

    r: int = 8
    """Rank of B A."""
    alpha: float = 16.0
    """Scaling numerator: s = alpha / r (alpha / sqrt(r) with rslora)."""
    dropout: float = 0.0
    """Dropout on the adapter input (the magnitude path sees the same dropped input)."""
    rslora: bool = False
    """Scale B A by alpha / sqrt(r) (rsLoRA) instead of alpha / r: the one composition
    allowed, as PEFT's use_dora with use_rslora."""

    def __post_init__(self) -> None:
        _check_finite(self, "dora")
        _check_low_rank("dora", "r", self.r, self.alpha, self.dropout)


@dataclass(frozen=True)
class PiSSAConfig:
    """PiSSA (Meng et al., 2024): A and B start as W0's principal singular triplets and the
    frozen base keeps the residual (docs/maths.md#pissa)."""

    r: int = 8
    """Rank of B A: the number of principal singular triplets moved into the adapter."""
    alpha: float | None = None
    """Scaling numerator, s = alpha / r; None means alpha = r (s = 1), the paper's setting."""
    dropout: float = 0.0
    """Dropout on the adapter input."""

    def __post_init__(self) -> None:
        _check_finite(self, "pissa")
        _check_low_rank("pissa", "r", self.r, self.alpha, self.dropout)


@dataclass(frozen=True)
class EVAConfig:
    """EVA (Paischer et al., 2025; arXiv 2410.07170): before training, an incremental SVD of
    each adapted layer's inputs over the first training batches; A starts as their top
    right-singular vectors, B at zero, and the ranks are redistributed across layers by
    explained variance (docs/maths.md#eva). PEFT's EvaConfig defaults."""

    r: int = 8
    """The mean rank before redistribution: the total rank is n * r over the n adapted
    matrices (``budget`` instead, when set)."""
    alpha: float = 16.0
    """Scaling numerator: s = alpha / r."""
    dropout: float = 0.0
    """Dropout on the adapter input."""
    rho: float = 2.0
    """A layer's rank is at most round(rho * r); 1 keeps every layer at r (no
    redistribution)."""
    tau: float = 0.99
    """A layer's SVD has converged when each of its kept right-singular vectors has cosine
    similarity >= tau with the previous batch's."""
    n_batches: int | None = None
    """The most training batches the pass reads (it stops once every layer converged);
    None: up to one epoch."""
    budget: int | None = None
    """The total rank over all adapted matrices (a sweep's b(T)); None: n * r."""
    use_label_mask: bool = True
    """Leave out of the SVD the tokens a causal LM's labels ignore (-100), as the prompt."""
    whiten: bool = False
    """Divide each right-singular vector by the square root of its singular value."""
    adjust_scaling_factors: bool = True
    """Keep s = alpha / r on every layer whatever rank it got (PEFT scales each layer's
    alpha by its rank / r); False: s = alpha / (its rank)."""

    def __post_init__(self) -> None:
        _check_finite(self, "eva")
        _check_low_rank("eva", "r", self.r, self.alpha, self.dropout)
        _check(self.rho >= 1, f"eva.rho must be >= 1 (a layer's rank may reach rho * eva.r; "
                              f"1 keeps every layer at eva.r), got {self.rho}")
        _check(0 < self.tau <= 1, f"eva.tau must lie in (0, 1], got {self.tau}")
        _check(self.n_batches is None or self.n_batches >= 1,
               f"eva.n_batches must be >= 1 (or unset: up to one epoch), got {self.n_batches}")
        _check(self.budget is None or self.budget >= 1,
               f"eva.budget must be >= 1 (or unset: n * eva.r), got {self.budget}")


@dataclass(frozen=True)
class LoRAPlusConfig:
    """LoRA+ (Hayou et al., 2024): LoRA whose B learns lr_ratio times faster than A
    (docs/maths.md#loraplus)."""

    r: int = 8
    """Rank of B A."""
    alpha: float = 16.0
    """Scaling numerator: Delta W = (alpha / r) B A."""
    dropout: float = 0.0
    """Dropout on the adapter input."""
    lr_ratio: float = 16.0
    """lambda = lr(B) / lr(A); A and the head's matrices train at train.learning_rate. The
    paper's default is 2^4."""

    def __post_init__(self) -> None:
        _check_finite(self, "loraplus")
        _check_low_rank("loraplus", "r", self.r, self.alpha, self.dropout)
        _check(self.lr_ratio >= 1, f"loraplus.lr_ratio must be >= 1 (B learns at least as "
                                   f"fast as A), got {self.lr_ratio}")


@dataclass(frozen=True)
class SoRAConfig:
    """SoRA (Ding et al., 2023): LoRA at rank r_max with a gate on every rank, sparsified by
    a proximal step after each optimizer step (docs/maths.md#sora)."""

    r_max: int = 8
    """Rank of B A before the gates zero any of it (the authors' GLUE scripts: 8)."""
    alpha: float = 16.0
    """Scaling numerator: Delta W = (alpha / r_max) B diag(g) A."""
    dropout: float = 0.0
    """Dropout on the adapter input."""
    xi: float = 3e-4
    """The proximal step's threshold (the authors' sparse_lambda_2; their GLUE script: 3e-4)."""
    l1: float = 10.0
    """Weight of the L1 term mean(|g|) added to the loss (the authors' sparse_lambda; their
    GLUE script: 10)."""
    xi_max: float | None = None
    """Sparsifying schedule: raise xi linearly to this value in xi_steps equal stages of
    training; None keeps xi fixed."""
    xi_steps: int = 7
    """Number of stages of the sparsifying schedule (the authors' lambda_num: 7)."""

    def __post_init__(self) -> None:
        _check_finite(self, "sora")
        _check_low_rank("sora", "r_max", self.r_max, self.alpha, self.dropout)
        _check(self.xi >= 0 and self.l1 >= 0,
               f"sora.xi and sora.l1 must be >= 0, got {self.xi} and {self.l1}")
        _check(self.xi_max is None or self.xi_max >= self.xi,
               f"sora.xi_max must be >= sora.xi ({self.xi}) when set, got {self.xi_max}")
        _check(self.xi_steps >= 1, f"sora.xi_steps must be >= 1, got {self.xi_steps}")


@dataclass(frozen=True)
class IncreLoRAConfig:
    """IncreLoRA (Zhang et al., 2023): AdaLoRA's SVD form grown from a small rank to the
    budget b(T), a few matrices at a time (docs/maths.md#increlora)."""

    budget: int = 144
    """b(T): total rank (number of singular values) over all matrices once growth ends."""
    init_rank: int = 1
    """Rank every matrix starts with (the authors' lora_r: 1)."""
    add_rank: int | None = None
    """Ranks a chosen matrix gains at a growth event; None: b(T) / (2 n) rounded half up, at
    least 1 (the authors' table: mean final rank 2 -> 1, 4 -> 2, 8 -> 4)."""
    top_h: int | None = None
    """Matrices chosen at each growth event; None: the fewest that reach b(T) by the last
    event at or before T - t_final."""
    alpha: float = 32.0
    """Scaling numerator: Delta W = (alpha / rank) P diag(lam) Q with the matrix's current
    rank, as the authors' code scales it."""
    dropout: float = 0.0
    """Dropout on the adapter input."""
    gamma: float = 0.1
    """Weight of the orthogonal regularizer (Eq. 4, code form) on every existing triplet."""
    t_init: int | None = None
    """Steps before the first growth event; None: adalora.t_init."""
    delta_t: int | None = None
    """Steps between growth events; None: adalora.delta_t."""
    t_final: int | None = None
    """Last steps with no growth event; None: adalora.t_final."""
    beta1: float = 0.85
    """EMA coefficient of a matrix's sensitivity."""
    beta2: float = 0.85
    """EMA coefficient of its uncertainty."""
    reserve: bool = True
    """Advance learning: every matrix holds add_rank reserve triplets (lam fixed at 1e-5,
    P and Q trained) that become its next ranks; false adds fresh triplets instead."""

    def __post_init__(self) -> None:
        _check_finite(self, "increlora")
        _check_low_rank("increlora", "init_rank", self.init_rank, self.alpha, self.dropout)
        _check(self.budget >= 1, f"increlora.budget must be >= 1, got {self.budget}")
        for key in ("add_rank", "top_h", "delta_t"):
            value = getattr(self, key)
            _check(value is None or value >= 1,
                   f"increlora.{key} must be >= 1 when set, got {value}")
        for key in ("t_init", "t_final"):
            value = getattr(self, key)
            _check(value is None or value >= 0,
                   f"increlora.{key} must be >= 0 when set, got {value}")
        _check(self.gamma >= 0, f"increlora.gamma must be >= 0, got {self.gamma}")
        for key in ("beta1", "beta2"):
            beta = getattr(self, key)
            _check(0.0 < beta < 1.0, f"increlora.{key} must lie in (0, 1), got {beta}")


@dataclass(frozen=True)
class GoRAConfig:
    """GoRA (He et al., 2025): ranks in proportion to mean(|W * G|) under LoRA's budget at
    the mean rank r, A random and B from the gradients of the frozen weights, gathered over
    the first n_batches training batches before training (docs/maths.md#gora)."""

    r: int = 8
    """Mean rank (the paper's reference rank): the budget is LoRA's parameters at rank r in
    every matrix, b(T) = r n ranks where all matrices have one shape."""
    alpha: float = 16.0
    """Scaling numerator: Delta W = (alpha / r) B A with the mean rank r in every matrix."""
    dropout: float = 0.0
    """Dropout on the adapter input."""
    r_min: int | None = None
    """Smallest rank a matrix gets; None: r / 2 rounded up (the paper's 4 at r = 8)."""
    r_max: int | None = None
    """Largest rank a matrix gets; None: 4 r (the paper's 32 at r = 8)."""
    n_batches: int | None = 64
    """Training batches whose mean gradient decides ranks and B (the paper's 64); None: one
    epoch. More than the training split holds is refused."""
    init_scale: float = 0.05
    """gamma: the adapter starts as a gradient step of this size,
    s B A = -gamma sqrt(d_in / r_i) G A^+ A; 0 starts B at zero, as LoRA."""

    @property
    def scaling(self) -> float:
        return self.alpha / self.r

    def bounds(self) -> tuple[int, int]:
        """``(r_min, r_max)`` with their defaults filled in."""
        r_min = self.r_min if self.r_min is not None else max(1, math.ceil(self.r / 2))
        return r_min, self.r_max if self.r_max is not None else 4 * self.r

    def __post_init__(self) -> None:
        _check_finite(self, "gora")
        _check_low_rank("gora", "r", self.r, self.alpha, self.dropout)
        _check(self.n_batches is None or self.n_batches >= 1,
               f"gora.n_batches must be >= 1 when set, got {self.n_batches}")
        _check(self.init_scale >= 0, f"gora.init_scale must be >= 0, got {self.init_scale}")
        r_min, r_max = self.bounds()
        _check(1 <= r_min <= self.r <= r_max,
               f"gora's rank bounds must satisfy 1 <= r_min <= r <= r_max, got r_min={r_min}, "
               f"r={self.r}, r_max={r_max}; set gora.r_min and gora.r_max around gora.r")


@dataclass(frozen=True)
class AdapterConfig:
    dim: int = 32
    """Bottleneck width d of the Houlsby / Pfeiffer adapters."""
    dropout: float = 0.0
    """Dropout inside the adapter, after the activation."""

    def __post_init__(self) -> None:
        _check_finite(self, "adapter")
        _check(self.dim >= 1, f"adapter.dim must be >= 1, got {self.dim}")
        _check_dropout(self.dropout, "adapter.dropout")


@dataclass(frozen=True)
class TrainConfig:
    learning_rate: float = 5e-4
    batch_size: int = 32
    """Examples per micro-batch."""
    grad_accum: int = 1
    """Micro-batches per optimizer step; every schedule counts optimizer steps."""
    epochs: float = 3.0
    max_steps: int | None = None
    """If set, T = max_steps and epochs is ignored."""
    warmup_steps: int = 0
    """Linear learning-rate warm-up, then linear decay to 0 at T."""
    weight_decay: float = 0.0
    max_grad_norm: float = 1.0
    """Gradient clipping; 0 disables it."""
    seed: int = 42
    precision: Literal["auto", "fp32", "fp16", "bf16"] = "auto"
    """Autocast on CUDA: 'auto' = bf16 where the GPU runs it natively (compute capability
    >= 8.0), else fp16 with loss scaling (V100, T4). On the CPU 'bf16' autocasts to bf16
    (adapters, head and optimizer state stay fp32; native with AVX-512 BF16 or AMX, emulated
    and slow elsewhere); 'auto' is bf16 where the CPU has it natively and fp32 on any other
    CPU; 'fp16' runs fp32 there."""
    device: str = "auto"
    """'auto' (CUDA when present), 'cpu', 'cuda', 'cuda:1', ..."""
    eval_batch_size: int = 64
    eval_every: int | None = None
    """Evaluate every N optimizer steps as well as at the end."""
    eval_at_start: bool = False
    """Also evaluate before the first optimizer step (step 0 in metrics.jsonl): the
    pretrained model with its fresh task head, since every method starts as the identity
    (Delta W = 0) - the number to beat. A resumed run does not evaluate it again; the
    scores are kept in summary.json as ``metrics_at_start``, and the trained run's numbers
    are the same with or without it."""
    log_every: int = 1
    """Write a training row to metrics.jsonl every N optimizer steps."""
    save_weights: bool = True
    """Write the trained weights (adapter + head, or the whole model for 'full')."""
    save_every: int = 0
    """Checkpoint every N optimizer steps (0: only once training ends, before the final
    evaluation). A stop signal (SIGTERM, SIGUSR1) always checkpoints."""
    keep_checkpoints: int = 1
    """Checkpoints kept in checkpoints/ while the run is unfinished (the newest ones); a
    finished run deletes them and keeps its final weights."""
    group_by_length: bool = False
    """Batch training examples of similar length together (less padding, faster); off by
    default because it changes which examples share a batch."""
    gradient_checkpointing: bool = False
    """Recompute each layer's activations in the backward pass instead of keeping them: far
    less activation memory for long sequences and big models, for one extra forward pass.
    The model must support it (every transformers model with default targets does)."""
    length_split: int = 1
    """Run each batch as this many micro-batches of similar length, each padded on its own
    (same examples per step, fewer padded tokens; a CPU speed-up, see engine/split.py);
    1 keeps the batch whole. Between 1 and batch_size."""
    sharding: Literal["none", "fsdp"] = "none"
    """How several processes hold the model: 'none' gives each process a whole copy and
    averages gradients (DDP); 'fsdp' shards the frozen base, the adapters and the optimizer
    state across the processes (torch FSDP2), for models that do not fit one device. One
    process always holds the whole model; 'fsdp' needs several (docs/training.md)."""
    select: Literal["last", "best"] | None = None
    """Which step's weights the run ends with: 'last' (None means the same) the final step's;
    'best' those of the evaluation (every eval_every steps, and the final one) that scored
    best on select_metric. The chosen step's weights, rank pattern and scores are the run's
    (summary.json: ``selected``)."""
    select_metric: str | None = None
    """With select=best: the metric to choose by, as the task reports it (``accuracy``), or
    ``split/metric`` for another evaluation split (``validation_mismatched/accuracy``). None:
    the task's main metric (its first report column), in its direction (lower is better for
    a loss, a perplexity or a mean squared error)."""
    early_stop_patience: int | None = None
    """With select=best: end training once this many evaluations in a row have not improved
    on the best; None or 0 trains to the end."""

    def __post_init__(self) -> None:
        _check_finite(self, "train")
        _check(self.learning_rate > 0,
               f"train.learning_rate must be > 0, got {self.learning_rate}")
        _check(self.batch_size >= 1, f"train.batch_size must be >= 1, got {self.batch_size}")
        _check(self.grad_accum >= 1, f"train.grad_accum must be >= 1, got {self.grad_accum}")
        _check(1 <= self.length_split <= self.batch_size,
               "train.length_split must lie between 1 and train.batch_size "
               f"({self.batch_size}), got {self.length_split}")
        _check(self.epochs > 0 or self.max_steps,
               "train.epochs must be > 0 (or set train.max_steps)")
        _check(self.max_steps is None or self.max_steps >= 1,
               f"train.max_steps must be >= 1 when set, got {self.max_steps}")
        _check(self.eval_every is None or self.eval_every >= 1,
               "train.eval_every must be >= 1 when set")
        _check(self.log_every >= 1, f"train.log_every must be >= 1, got {self.log_every}")
        _check(self.save_every >= 0, "train.save_every must be >= 0 (0: only at the end), "
               f"got {self.save_every}")
        # checked here, before a run directory exists: otherwise they surface only at the
        # first evaluation (eval_batch_size), when the optimizer is built (weight_decay), or
        # never, silently meaning something else (a negative warm-up or clipping norm)
        _check(self.eval_batch_size >= 1,
               f"train.eval_batch_size must be >= 1, got {self.eval_batch_size}")
        _check(self.weight_decay >= 0,
               f"train.weight_decay must be >= 0, got {self.weight_decay}")
        _check(self.warmup_steps >= 0,
               f"train.warmup_steps must be >= 0, got {self.warmup_steps}")
        _check(self.max_grad_norm >= 0, "train.max_grad_norm must be >= 0 (0 disables "
               f"clipping), got {self.max_grad_norm}")
        _check(self.keep_checkpoints >= 1,
               f"train.keep_checkpoints must be >= 1, got {self.keep_checkpoints}")
        self._check_select()

    def _check_select(self) -> None:
        """A selection needs evaluations to choose from; patience and a metric mean nothing
        without one, and would otherwise be silently ignored."""
        best = self.select == "best"
        _check(self.early_stop_patience is None or self.early_stop_patience >= 0,
               f"train.early_stop_patience must be >= 0 (0: off), got "
               f"{self.early_stop_patience}")
        _check(best or not self.early_stop_patience,
               "train.early_stop_patience stops on the selection metric; set "
               "train.select=best with it (and train.eval_every)")
        _check(best or self.select_metric is None,
               f"train.select_metric={self.select_metric} is read only by train.select=best; "
               "set train.select=best, or drop train.select_metric")
        _check(not best or self.eval_every is not None,
               "train.select=best chooses among the periodic evaluations; set "
               "train.eval_every (e.g. train.eval_every=100)")
        _check(not best or self.sharding == "none",
               "train.select=best does not run with train.sharding=fsdp yet; use "
               "train.select=last there")
        metric = self.select_metric
        _check(metric is None or (metric.strip() and metric.count("/") <= 1
                                  and all(metric.split("/"))),
               f"train.select_metric {metric!r} is not a metric name; write e.g. accuracy, "
               "or split/metric as validation_matched/accuracy")


@dataclass(frozen=True)
class SweepMeta:
    """Where a run sits in a sweep; filled in by ``adalora sweep``, empty for a lone run."""

    name: str | None = None
    """Name of the sweep that launched the run (its manifest's name or the config's stem)."""
    budget_level: int | None = None
    """The AdaLoRA final budget b(T) this run's size was matched to (docs/maths.md#budget-levels);
    None for methods without a size (BitFit, full) and for runs outside a sweep."""


TRACKER_SINKS: dict[str, str] = {
    "tensorboard": "tensorboard_sink",
    "wandb": "wandb_sink",
    "mlflow": "mlflow_sink",
}
"""The trackers ``log.to`` accepts, each with the module of ``adalora_cli/tracking`` that
writes to it; the pip extra of the same name installs what it needs. The one list of tracker
names: config validation and the fan-out read it, and tests/tracking/test_tracker_names.py
fails on a sink module without an entry, an entry without its module or extra, or a sink
that calls itself by another name."""
TRACKER_NAMES = tuple(TRACKER_SINKS)


@dataclass(frozen=True)
class LogConfig:
    """Where a run is watched live besides its run directory (which is always written)."""

    to: list[Literal[TRACKER_NAMES]] = field(default_factory=list)
    """Trackers to log to, any of tensorboard, wandb, mlflow; each needs its extra
    (make install installs them). Empty: the run directory only."""
    project: str | None = None
    """W&B project and MLflow experiment name; None means the sweep's name, else 'adalora'."""
    run_name: str | None = None
    """Name of the run in the tracker; None means the run directory's name. A plain name,
    not a path: TensorBoard makes it a folder under tensorboard_dir."""
    tensorboard_dir: str | None = None
    """TensorBoard log folder; None means <run dir>/tensorboard, so
    ``tensorboard --logdir runs/`` shows every run."""
    wandb_mode: Literal["online", "offline"] | None = None
    """W&B mode; None leaves it to W&B (WANDB_MODE, or online when logged in). Offline runs
    are written under <run dir>/wandb/ for a later ``wandb sync``."""
    wandb_entity: str | None = None
    """W&B team or user; None means W&B's default (WANDB_ENTITY or your own)."""
    mlflow_uri: str | None = None
    """MLflow tracking URI (sqlite:///mlflow.db, http://host:5000); None leaves it to MLflow
    (MLFLOW_TRACKING_URI, else sqlite:///mlflow.db in the working directory)."""
    heatmap_every_s: float = 60.0
    """AdaLoRA: draw the rank heatmap for the trackers at the first mask event, then at a
    mask event only when this many seconds have passed since the last one, and always at
    the end; 0 draws one at every mask event."""
    tracker_timeout_s: float = 60.0
    """The longest the run waits for one tracker call (opening, logging, closing); a tracker
    that takes longer is dropped with one warning and the run goes on. Once a stop signal is
    pending, a call gets at most 5 s, so a hung tracker cannot hold a checkpoint back."""

    def __post_init__(self) -> None:
        _check_finite(self, "log")
        # TensorBoard makes the name a folder under log.tensorboard_dir: a separator or a
        # name of dots only would put it elsewhere (../x beside that folder)
        name = self.run_name
        _check(name is None or ("/" not in name and "\\" not in name and name.strip(".")),
               f"log.run_name {shown(name)} is a path, not a name (TensorBoard writes into "
               "a folder of that name under log.tensorboard_dir); give a plain name without "
               "/ or \\, e.g. log.run_name=rte-lora-lr2e-3")
        # trackers: each named once, heatmap uploads at most this often
        _check(len(set(self.to)) == len(self.to),
               f"log.to names a tracker twice ({self.to}); list each once")
        _check(self.heatmap_every_s >= 0,
               f"log.heatmap_every_s must be >= 0, got {self.heatmap_every_s}")
        _check(self.tracker_timeout_s > 0,
               f"log.tracker_timeout_s must be > 0, got {self.tracker_timeout_s}")


@dataclass(frozen=True)
class EvalConfig:
    """What scores the trained model after the run, besides its own evaluation."""

    harness: list[str] = field(default_factory=list)
    """lm-evaluation-harness tasks (``lm-eval``, the ``harness`` extra) to score a decoder
    run's adapted model on once training has finished, in-process; with
    ``train.eval_at_start`` the base model too. lm-eval's task names (gsm8k, arc_easy, ...)
    and the ones adalora ships (bbc_topic_chat). Results: ``harness.json`` in the run
    directory. Empty: none. ``adalora eval RUN --harness TASKS`` scores a finished run."""
    harness_limit: int | None = None
    """Score only the first this many rows of each harness task; None: every row."""
    harness_chat_template: bool | None = None
    """Render harness prompts with the tokenizer's chat template; None: whenever the
    tokenizer has one (an instruct model), as the run's own chats are rendered."""

    def __post_init__(self) -> None:
        _check(all(isinstance(t, str) and t.strip() and "," not in t for t in self.harness),
               f"eval.harness must list task names, got {self.harness}; write e.g. "
               "eval.harness=[bbc_topic_chat,gsm8k]")
        _check(len(set(self.harness)) == len(self.harness),
               f"eval.harness names a task twice ({self.harness}); list each once")
        _check(self.harness_limit is None or self.harness_limit >= 1,
               f"eval.harness_limit must be >= 1 (or null: every row), got "
               f"{self.harness_limit}")


@dataclass(frozen=True)
class TuneConfig:
    """Set by ``adalora tune`` on each trial run (docs/tuning.md); unset for any other run.
    A trial reports its tuning metric at every periodic evaluation to its study, which may
    stop it there (the run then ends ``pruned``)."""

    study: str | None = None
    """The study's record (``tune/<cell>.json`` in the tune's sweep directory): where its
    journal file is, the study's name and its pruner."""
    trial: int | None = None
    """This run's trial number in the study."""
    metric: str | None = None
    """What the study scores, as ``split/metric`` (``heldout/accuracy``)."""

    def __post_init__(self) -> None:
        given = [k for k in ("study", "trial", "metric") if getattr(self, k) is not None]
        _check(len(given) in (0, 3), "tune.study, tune.trial and tune.metric are set together "
               f"(by adalora tune), got only {', '.join('tune.' + k for k in given)}; unset "
               "them to train an ordinary run")
        _check(self.trial is None or self.trial >= 0,
               f"tune.trial must be >= 0, got {self.trial}")
        _check(self.metric is None or "/" in self.metric,
               f"tune.metric {shown(self.metric)} must be split/metric, e.g. "
               "heldout/accuracy")


@dataclass(frozen=True)
class RunConfig:
    task: TaskConfig = field(default_factory=TaskConfig)
    model: ModelConfig = field(default_factory=ModelConfig)
    method: MethodConfig = field(default_factory=MethodConfig)
    adalora: AdaLoRAConfig = field(default_factory=AdaLoRAConfig)
    lora: LoRAConfig = field(default_factory=LoRAConfig)
    adapter: AdapterConfig = field(default_factory=AdapterConfig)
    rslora: RsLoRAConfig = field(default_factory=RsLoRAConfig)
    dora: DoRAConfig = field(default_factory=DoRAConfig)
    pissa: PiSSAConfig = field(default_factory=PiSSAConfig)
    loraplus: LoRAPlusConfig = field(default_factory=LoRAPlusConfig)
    eva: EVAConfig = field(default_factory=EVAConfig)
    sora: SoRAConfig = field(default_factory=SoRAConfig)
    increlora: IncreLoRAConfig = field(default_factory=IncreLoRAConfig)
    gora: GoRAConfig = field(default_factory=GoRAConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    sweep: SweepMeta = field(default_factory=SweepMeta)
    log: LogConfig = field(default_factory=LogConfig)  # trackers mirror the run directory
    tune: TuneConfig = field(default_factory=TuneConfig)  # a trial of adalora tune
    eval: EvalConfig = field(default_factory=EvalConfig)  # scores after training

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    def with_final_budget(self, n: int) -> RunConfig:
        """This config with b(T) written out for ``n`` adapted matrices (``adalora.budget``
        in place of ``adalora.target_rank``): what a run directory records."""
        return dataclasses.replace(self, adalora=self.adalora.resolved(n))

    def with_values(self, values: dict[str, Any]) -> RunConfig:
        """This config with ``{"section.key": value}`` set: what a method settles when it
        is built (the digest of the ranks LoRA trains on), for the run directory to record."""
        out = self
        for key, value in values.items():
            section, name = key.split(".")
            out = dataclasses.replace(out, **{section: dataclasses.replace(
                getattr(out, section), **{name: value})})
        return out

    def settled_as(self, run: RunConfig) -> RunConfig:
        """This config with what a run settles from its data, where this config leaves it
        open (``task.labels`` and ``task.regression``, read from the training labels), taken
        from ``run``'s record: how a plan compares with a finished run's config.yaml."""
        task = self.task
        if task.labels is None and task.regression is None:
            task = dataclasses.replace(task, labels=run.task.labels,
                                       regression=run.task.regression)
        return dataclasses.replace(self, task=task)


# --------------------------------------------------------------------------- loading


MAX_YAML_VALUES = 100_000
"""The most values (mappings, lists and scalars) a YAML document may hold once its aliases
are expanded. A config or a sweep manifest holds hundreds; an alias bomb (a list naming the
list before it ten times, nine deep) holds a billion, and every reader after the parser
(checking each value, quoting one in an error) walks all of them."""


class _TooBig(yaml.YAMLError):
    """A document whose aliases expand past MAX_YAML_VALUES, or that holds itself."""


class _Loader(yaml.SafeLoader):
    """``yaml.safe_load``'s loader, counting what each document expands to before any value
    is built: counting shares the aliases' work, so a bomb is refused in microseconds."""

    def compose_document(self):
        node = super().compose_document()
        _expanded_size(node, {}, set())
        return node


def _expanded_size(node: yaml.Node, sizes: dict[int, int], open_: set[int]) -> int:
    key = id(node)
    if key in sizes:
        return sizes[key]
    if key in open_:
        raise _TooBig("it holds itself through an alias (&name inside itself as *name)")
    open_.add(key)
    if isinstance(node, yaml.SequenceNode):
        children = node.value
    elif isinstance(node, yaml.MappingNode):
        children = [child for pair in node.value for child in pair]
    else:
        children = []
    total = 1
    for child in children:
        total += _expanded_size(child, sizes, open_)
        if total > MAX_YAML_VALUES:
            raise _TooBig(f"its aliases (*name) expand it to more than {MAX_YAML_VALUES:,} "
                          "values")
    open_.discard(key)
    sizes[key] = total
    return total


def safe_yaml(text: str, where: str) -> Any:
    """``yaml.safe_load(text)``, refusing in one line naming ``where`` a document that
    expands past MAX_YAML_VALUES or holds itself; other YAML errors pass unchanged."""
    try:
        return yaml.load(text, Loader=_Loader)  # a SafeLoader: builds plain values only
    except _TooBig as err:
        raise ConfigError(f"{where} cannot be read: {err}; a config is far smaller, so "
                          "write its values out instead of repeating aliases") from None


def _parse_value(text: str, key: str) -> Any:
    try:
        return safe_yaml(text, f"override {key}") if text != "" else ""
    except yaml.YAMLError:
        return text


def apply_overrides(data: dict[str, Any], overrides: list[str]) -> dict[str, Any]:
    """Apply ``a.b=value`` strings (values parsed as YAML) to a nested dict, in place."""
    for item in overrides:
        key, sep, raw = item.partition("=")
        key = key.strip()
        if not sep or not key:
            raise ConfigError(f"override {shown(item)} is not key=value; write e.g. "
                              "train.seed=3")
        node = data
        parts = key.split(".")
        for part in parts[:-1]:
            child = node.get(part)
            if child is None:
                child = node[part] = {}
            if not isinstance(child, dict):
                raise ConfigError(f"override {shown(item)}: {shown(part)} is a value, not a "
                                  "section")
            node = child
        node[parts[-1]] = _parse_value(raw, key)
    return data


def _coerce(value: Any, hint: Any, path: str) -> Any:
    """Check one YAML value against a field's type hint; ints may stand for floats."""
    origin = typing.get_origin(hint)
    if origin in (typing.Union, types.UnionType):
        options = typing.get_args(hint)
        if value is None and type(None) in options:
            return None
        errors = []
        for option in options:
            if option is type(None):
                continue
            try:
                return _coerce(value, option, path)
            except ConfigError as err:
                errors.append(str(err))
        raise ConfigError(errors[0] if errors else f"{path}: bad value {shown(value)}")
    if origin is Literal:
        choices = typing.get_args(hint)
        if value not in choices:
            options = ", ".join(map(str, choices))
            raise ConfigError(f"{path} must be one of {options}; got {shown(value)}")
        return value
    if origin is list:
        if not isinstance(value, list):
            value = [v.strip() for v in value.split(",")] if isinstance(value, str) else value
        if not isinstance(value, list):
            raise ConfigError(f"{path} must be a list, got {shown(value)}")
        (item_hint,) = typing.get_args(hint)
        return [_coerce(v, item_hint, f"{path}[{i}]") for i, v in enumerate(value)]
    if origin is dict:
        if not isinstance(value, dict):
            raise ConfigError(f"{path} must be a mapping, got {shown(value)}")
        return {str(k): _coerce(v, str, f"{path}.{k}") for k, v in value.items()}
    if hint is bool:
        if isinstance(value, bool):
            return value
        raise ConfigError(f"{path} must be true or false, got {shown(value)}")
    if hint is float:
        number = None
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            number = float(value)
        elif isinstance(value, str):  # PyYAML (YAML 1.1) reads 1e-4 as a string
            try:
                number = float(value)
            except ValueError:
                pass
        if number is None:
            raise ConfigError(f"{path} must be a number, got {shown(value)}")
        # every float key of every section, as it is read: .inf or .nan is a typo, never a
        # setting (an infinite loraplus.lr_ratio trained NaNs from step 1)
        if not math.isfinite(number):
            raise ConfigError(f"{path} must be a finite number, got {number}")
        return number
    if hint is int:
        if isinstance(value, int) and not isinstance(value, bool):
            return value
        if isinstance(value, float) and value.is_integer():
            return int(value)
        raise ConfigError(f"{path} must be an integer, got {shown(value)}")
    if hint is str:
        if isinstance(value, (str, int, float)) and not isinstance(value, bool):
            return str(value)
        raise ConfigError(f"{path} must be a string, got {shown(value)}")
    raise ConfigError(f"{path}: unsupported type {hint}")  # pragma: no cover


def _build(cls: type, data: Any, prefix: str) -> Any:
    if not isinstance(data, dict):
        raise ConfigError(f"{prefix or 'the config'} must be a mapping of keys, got "
                          f"{shown(data)}")
    hints = typing.get_type_hints(cls)
    names = {f.name for f in dataclasses.fields(cls)}
    unknown = sorted(set(data) - names)
    if unknown:
        where = f"{prefix}." if prefix else ""
        raise ConfigError(
            f"unknown config key {where}{unknown[0]}; valid keys here: {', '.join(sorted(names))}"
        )
    for first, second in getattr(cls, "EXCLUSIVE", ()):
        if data.get(first) is not None and data.get(second) is not None:
            raise ConfigError(f"{prefix}.{first} and {prefix}.{second} are both set; keep one "
                              f"({prefix}.{first}=null or {prefix}.{second}=null)")
    kwargs = {}
    for name, value in data.items():
        path = f"{prefix}.{name}" if prefix else name
        hint = hints[name]
        if dataclasses.is_dataclass(hint):
            kwargs[name] = _build(hint, value or {}, path)
        else:
            kwargs[name] = _coerce(value, hint, path)
    return cls(**kwargs)


def from_dict(data: dict[str, Any]) -> RunConfig:
    """A checked config from nested sections (each section checks itself as it is made)."""
    return _build(RunConfig, data, "")


def read_yaml(path: str | Path) -> dict[str, Any]:
    path = Path(path)
    if path.is_dir():
        raise ConfigError(f"{path} is a directory, not a config file; pass a YAML file such "
                          "as configs/glue/rte.yaml")
    if not path.is_file():
        raise ConfigError(
            f"config file {path} does not exist; pass a path such as configs/glue/rte.yaml")
    try:
        data = safe_yaml(path.read_text(), str(path))
    except yaml.YAMLError as err:
        mark = getattr(err, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        problem = getattr(err, "problem", None) or "invalid YAML"
        raise ConfigError(f"{path} is not valid YAML{where}: {problem}; fix the file") from None
    if data is None:
        raise ConfigError(f"{path} is empty; write the task:, model:, method: and train: "
                          "sections (see configs/glue/rte.yaml)")
    if not isinstance(data, dict):
        raise ConfigError(f"{path} must hold a mapping of sections (task:, model:, ...), "
                          f"not {type(data).__name__}")
    return data


def load_config(path: str | Path, overrides: list[str] | None = None) -> RunConfig:
    """Read a YAML config, apply ``key=value`` overrides, and validate. An override of one
    key of an exclusive pair (``adalora.budget`` / ``adalora.target_rank``) replaces the
    other as the file sets it: the command line wins."""
    data = read_yaml(path)
    _give_way(data, [item.partition("=")[0].strip() for item in overrides or []])
    return from_dict(apply_overrides(data, list(overrides or [])))


def _give_way(data: dict[str, Any], keys: list[str]) -> None:
    """Drop from the file's sections the partner of an exclusive key an override sets."""
    hints = typing.get_type_hints(RunConfig)
    for section, hint in hints.items():
        node = data.get(section)
        if not isinstance(node, dict):
            continue
        for pair in getattr(hint, "EXCLUSIVE", ()):
            for mine, other in (pair, pair[::-1]):
                if f"{section}.{mine}" in keys and f"{section}.{other}" not in keys:
                    node.pop(other, None)


RESUMABLE_KEYS = ("train.save_every", "train.keep_checkpoints", "train.device",
                  "train.eval_batch_size", "train.sharding", "log.", "eval.")
"""Overrides a resumed run accepts: where and how it runs, not what it computes, and what
scores it after training (``eval.``). (A
checkpoint itself is written either whole or sharded: resuming one under the other
sharding is refused by engine/checkpoint.py, with what to do.)"""


def resume_config(path: str | Path, overrides: list[str]) -> RunConfig:
    """A run directory's config with the overrides ``--resume`` allows; others are refused
    by name, since they would change what the run means half-way."""
    for item in overrides:
        key = item.partition("=")[0].strip()
        if not key.startswith(RESUMABLE_KEYS) or key.endswith("."):
            raise ConfigError(
                f"{key} cannot change when resuming (it would change what the run computes); "
                "start a new run instead, or override only "
                + ", ".join(k.rstrip(".") + ("*" if k.endswith(".") else "")
                            for k in RESUMABLE_KEYS))
    return load_config(path, overrides)


def dump_config(cfg: RunConfig) -> str:
    return yaml.safe_dump(cfg.to_dict(), sort_keys=False)


# --------------------------------------------------------------------------- flat views


def flatten(data: Mapping[str, Any], sep: str = ".", leaves: tuple[str, ...] = (),
            prefix: str = "") -> dict[str, Any]:
    """Nested mappings (a config's ``to_dict()``, a raw YAML, a summary) as ``{dotted key:
    leaf}``; a key named in ``leaves`` keeps its mapping whole as one value."""
    out: dict[str, Any] = {}
    for key, value in data.items():
        path = f"{prefix}{sep}{key}" if prefix else str(key)
        if isinstance(value, Mapping) and key not in leaves:
            out.update(flatten(value, sep, leaves, path))
        else:
            out[path] = value
    return out


def digest(values: Any) -> str:
    """sha256 of ``values`` as canonical JSON (sorted keys, anything else as its text): how
    a checkpoint and a summary fingerprint a flattened config."""
    return hashlib.sha256(json.dumps(values, sort_keys=True, default=str).encode()).hexdigest()
