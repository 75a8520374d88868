"""SQuAD examples -> model features: question + context windows with character offsets.

A context longer than ``max_length`` tokens is cut into several windows (features): every
window holds the whole question, then a slice of the context, and consecutive slices share
``doc_stride`` tokens (the Hugging Face meaning of "stride": overlap, not step), so an
answer near a cut is whole in at least one window. Only the context is ever truncated
(``truncation="only_second"``). The fast tokenizer's offset mapping ties every context
token to its characters; tokens outside the context get offsets ``(-1, -1)`` so that
post-processing can never answer with the question or a special token.

Training labels are the token indices of the answer's first and last characters when the
whole answer lies inside the window, and the CLS index otherwise (answer cut off, in
another window, or an unanswerable v2 question) -- the model learns "no answer here" as
the CLS span. Features are kept as small numpy arrays rather than Python lists: SQuAD v2
has ~130k training windows, and per-token Python ints would cost gigabytes.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from torch.utils.data import Dataset

from ..config import ConfigError

CHUNK = 1000
"""Examples per tokenizer call: big enough for the Rust tokenizer's batching, small enough
to keep the transient Python encodings bounded."""


@dataclass(frozen=True)
class QAExample:
    id: str
    question: str
    context: str
    answers: tuple[str, ...]
    """Gold answer texts; empty for an unanswerable (v2) question."""
    answer_starts: tuple[int, ...]
    """Character index of each answer in ``context``."""
    title: str = ""


def tokenize_windows(tokenizer: Any, examples: Sequence[QAExample], *, max_length: int,
                     doc_stride: int) -> Any:
    """One fast-tokenizer call: every window of every example, with offsets."""
    # Leading white space in a question only wastes tokens (some SQuAD v2 questions have
    # dozens of spaces in front), so it goes; the context is never altered, as the answer
    # offsets point into it.
    questions = [ex.question.lstrip() for ex in examples]
    check_room(tokenizer, examples, questions, max_length=max_length, doc_stride=doc_stride)
    return tokenizer(questions, [ex.context for ex in examples], truncation="only_second",
                     max_length=max_length, stride=doc_stride, return_overflowing_tokens=True,
                     return_offsets_mapping=True, padding=False)


def check_room(tokenizer: Any, examples: Sequence[QAExample], questions: list[str], *,
               max_length: int, doc_stride: int) -> None:
    """Every window must hold more context tokens than the overlap, or there is no way to
    advance. Checked up front: the Rust tokenizer otherwise aborts with a panic, which is
    not even an ``Exception``."""
    if not questions:
        return
    lengths = [len(ids) for ids in tokenizer(questions, add_special_tokens=False)["input_ids"]]
    worst = int(np.argmax(lengths))
    room = max_length - lengths[worst] - tokenizer.num_special_tokens_to_add(pair=True)
    if room <= doc_stride:
        raise ConfigError(
            f"question {examples[worst].id!r} takes {lengths[worst]} tokens, leaving {room} "
            f"for the context at task.max_length={max_length}, not more than "
            f"task.doc_stride={doc_stride}; raise task.max_length or lower task.doc_stride")


def context_offsets(encoding: Any, i: int) -> np.ndarray:
    """``(n_tokens, 2)`` character spans of window ``i``; ``(-1, -1)`` outside the context."""
    spans = np.asarray(encoding["offset_mapping"][i], dtype=np.int64).reshape(-1, 2)
    is_context = np.array([s == 1 for s in encoding.sequence_ids(i)])
    spans[~is_context] = -1
    return spans


def answer_token_span(offsets: np.ndarray, start_char: int,
                      end_char: int) -> tuple[int, int] | None:
    """Token indices (first, last) covering characters ``[start_char, end_char)``, or None
    when the answer is not wholly inside this window's context."""
    context = np.flatnonzero(offsets[:, 0] >= 0)
    if end_char <= start_char or len(context) == 0:
        return None
    if offsets[context[0], 0] > start_char or offsets[context[-1], 1] < end_char:
        return None
    # First token ending after the answer's first character; last token starting before
    # its end. Both exist because the window spans the answer.
    first = context[offsets[context, 1] > start_char][0]
    last = context[offsets[context, 0] < end_char][-1]
    return int(first), int(last)


def cls_position(input_ids: Sequence[int], cls_token_id: int | None) -> int:
    """Where the "no answer" span points: the CLS token (position 0 for BERT and DeBERTa)."""
    if cls_token_id is not None and cls_token_id in input_ids:
        return list(input_ids).index(cls_token_id)
    return 0


@dataclass
class QAFeatures(Dataset):
    """Windows of a split. Items hold model inputs only (plus labels for training), so the
    training loop's padding collator batches them; the rest serves post-processing."""

    inputs: dict[str, list[np.ndarray]]
    """Model input columns (input_ids, attention_mask, token_type_ids, ...), one array each."""
    example_index: np.ndarray
    """``(n_features,)`` index into ``examples`` of the example each window came from."""
    examples: list[QAExample]
    offsets: list[np.ndarray] = field(default_factory=list)
    """Per window, ``(n_tokens, 2)`` context character spans (evaluation splits only)."""
    cls_index: np.ndarray | None = None
    """``(n_features,)`` CLS position per window (the null answer's span)."""
    start_positions: np.ndarray | None = None
    """Training labels: answer start token per window (CLS index when absent)."""
    end_positions: np.ndarray | None = None

    def __len__(self) -> int:
        return len(self.example_index)

    def __getitem__(self, i: int) -> dict[str, Any]:
        item: dict[str, Any] = {k: v[i].tolist() for k, v in self.inputs.items()}
        if self.start_positions is not None:
            item["start_positions"] = int(self.start_positions[i])
            item["end_positions"] = int(self.end_positions[i])
        return item


def build_features(tokenizer: Any, examples: list[QAExample], *, max_length: int,
                   doc_stride: int, training: bool) -> QAFeatures:
    """All windows of ``examples``; training features carry start/end labels, evaluation
    features keep their offsets for mapping predictions back to the context."""
    names = [n for n in tokenizer.model_input_names]
    inputs: dict[str, list[np.ndarray]] = {}
    example_index, cls_index, offsets, starts, ends = [], [], [], [], []
    for lo in range(0, len(examples), CHUNK):
        chunk = examples[lo:lo + CHUNK]
        enc = tokenize_windows(tokenizer, chunk, max_length=max_length, doc_stride=doc_stride)
        present = [n for n in names if n in enc]
        for i, sample in enumerate(enc["overflow_to_sample_mapping"]):
            for name in present:
                inputs.setdefault(name, []).append(_compact(enc[name][i]))
            spans = context_offsets(enc, i)
            cls = cls_position(enc["input_ids"][i], tokenizer.cls_token_id)
            example_index.append(lo + sample)
            cls_index.append(cls)
            if training:
                span = _label(spans, chunk[sample])
                starts.append(span[0] if span else cls)
                ends.append(span[1] if span else cls)
            else:
                offsets.append(spans.astype(np.int32))
    return QAFeatures(
        inputs=inputs, example_index=np.asarray(example_index, dtype=np.int64),
        examples=examples, offsets=offsets, cls_index=np.asarray(cls_index, dtype=np.int64),
        start_positions=np.asarray(starts, dtype=np.int64) if training else None,
        end_positions=np.asarray(ends, dtype=np.int64) if training else None)


def _compact(values: list[int]) -> np.ndarray:
    """Token ids as int32, 0/1 masks as int8: a quarter of the memory for the masks."""
    array = np.asarray(values, dtype=np.int32)
    return array.astype(np.int8) if array.size and 0 <= array.min() and array.max() < 128 \
        else array


def _label(spans: np.ndarray, example: QAExample) -> tuple[int, int] | None:
    """The first gold answer's token span in this window (training data has one answer)."""
    if not example.answers:
        return None
    start = example.answer_starts[0]
    return answer_token_span(spans, start, start + len(example.answers[0]))
