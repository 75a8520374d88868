"""From start/end logits of every window to one answer string per question.

The standard extractive-QA decoding (as in the BERT SQuAD reference and the Hugging Face
question-answering examples the authors ran):

1. In each window, take the ``n_best`` highest start logits and the ``n_best`` highest end
   logits and consider every (start, end) pair among them. A pair is a valid span when both
   tokens lie in the context, ``end >= start``, the span has at most ``max_answer_length``
   tokens, and it covers at least one character. Its score is ``start_logit + end_logit``.
2. Across all windows of the question, the best-scoring valid span wins; its text is the
   context between the first token's start and the last token's end character.
3. SQuAD v2 only: each window also has a null score, the logits of the CLS span
   (``start_logit[cls] + end_logit[cls]``); the question's null score is the smallest over
   its windows (the window most confident that an answer exists). The prediction is ""
   (no answer) when ``null_score - best_span_score > threshold``, or when no window has a
   valid span.

Only the best span per window is kept (not the whole n-best list): decoding needs nothing
else, and the search over the ``n_best x n_best`` grid is vectorized, so a full SQuAD
validation split decodes in seconds.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class Span:
    score: float
    """start_logit + end_logit."""
    start_char: int
    end_char: int
    """Exclusive end: the answer is ``context[start_char:end_char]``."""


def best_span(start_logits: np.ndarray, end_logits: np.ndarray, offsets: np.ndarray, *,
              n_best: int, max_answer_length: int) -> Span | None:
    """The best valid span of one window, or None when no pair of candidates is valid.

    ``offsets`` is the window's ``(n_tokens, 2)`` context spans, ``-1`` outside the context;
    logits may be longer (batch padding) and are cut to the window's length."""
    n = len(offsets)
    start_logits = np.asarray(start_logits[:n], dtype=np.float64)
    end_logits = np.asarray(end_logits[:n], dtype=np.float64)
    # Stable sorts break ties towards the earlier token, so decoding is deterministic.
    starts = np.argsort(-start_logits, kind="stable")[:n_best]
    ends = np.argsort(-end_logits, kind="stable")[:n_best]
    s, e = np.meshgrid(starts, ends, indexing="ij")  # (k, k) candidate pairs
    valid = ((offsets[s, 0] >= 0) & (offsets[e, 0] >= 0) & (e >= s)
             & (e - s + 1 <= max_answer_length) & (offsets[e, 1] > offsets[s, 0]))
    if not valid.any():
        return None
    scores = np.where(valid, start_logits[s] + end_logits[e], -np.inf)
    k = np.unravel_index(np.argmax(scores), scores.shape)
    return Span(float(scores[k]), int(offsets[s[k], 0]), int(offsets[e[k], 1]))


def null_score(start_logits: np.ndarray, end_logits: np.ndarray, cls_index: int) -> float:
    """Score of the "no answer" span of one window: both ends on the CLS token."""
    return float(start_logits[cls_index]) + float(end_logits[cls_index])


def decode_example(context: str, windows: Sequence[tuple[np.ndarray, np.ndarray, np.ndarray,
                                                         int]], *,
                   n_best: int, max_answer_length: int, version_2: bool,
                   null_threshold: float) -> str:
    """The answer to one question from its windows ``(start, end, offsets, cls_index)``."""
    best: Span | None = None
    null = np.inf
    for start_logits, end_logits, offsets, cls in windows:
        span = best_span(start_logits, end_logits, offsets, n_best=n_best,
                         max_answer_length=max_answer_length)
        if span is not None and (best is None or span.score > best.score):
            best = span
        null = min(null, null_score(start_logits, end_logits, cls))
    if best is None:
        return ""
    if version_2 and null - best.score > null_threshold:
        return ""
    # Offsets of SentencePiece tokens (DeBERTa-v3) include the preceding space; the
    # official normalization ignores it, but predictions.json reads better without it.
    return context[best.start_char:best.end_char].strip()


def decode(contexts: Sequence[str], example_index: np.ndarray,
           start_logits: Sequence[np.ndarray], end_logits: Sequence[np.ndarray],
           offsets: Sequence[np.ndarray], cls_index: np.ndarray, *, n_best: int,
           max_answer_length: int, version_2: bool, null_threshold: float) -> list[str]:
    """One answer per example (in example order) from the logits of every window."""
    windows: list[list[tuple]] = [[] for _ in contexts]
    for f, ex in enumerate(example_index):
        windows[ex].append((start_logits[f], end_logits[f], offsets[f], int(cls_index[f])))
    return [decode_example(context, ws, n_best=n_best, max_answer_length=max_answer_length,
                           version_2=version_2, null_threshold=null_threshold)
            for context, ws in zip(contexts, windows)]
