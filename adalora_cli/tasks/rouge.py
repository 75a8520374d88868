"""ROUGE for the summarization tasks (docs/maths.md#tasks-and-metrics): F-measures x 100,
with stemming.

Scores come from Google's ``rouge-score`` package (the implementation behind the Hugging
Face ``rouge`` metric the paper's numbers were computed with), which lower-cases, keeps
only ``[a-z0-9]`` tokens and Porter-stems tokens longer than three characters. ROUGE-Lsum
(summary-level LCS) needs one sentence per line; ``rouge-score`` can split sentences itself
only through NLTK's punkt model, a download this machine cannot make, so
:func:`split_sentences` is a small regex splitter instead. A corpus score is the plain mean
of the per-example F-measures: deterministic, where the ``evaluate`` metric reports the
middle of a bootstrap estimate of the same mean.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from rouge_score import rouge_scorer

ROUGE_TYPES = ("rouge1", "rouge2", "rougeL", "rougeLsum")
"""Metric names as written to metrics.jsonl and summary.json."""

# A sentence ends at . ! or ?, possibly followed by closing quotes or brackets, then space.
_END = re.compile(r"[.!?][\"'\u201d\u2019)\]]*\s+")
# Words whose trailing period is not a sentence end (lower-cased, without the period).
_ABBREVIATIONS = frozenset(
    "mr mrs ms dr prof st sr jr rev gen col lt sgt capt gov sen rep vs etc inc ltd co "
    "corp jan feb mar apr jun jul aug sep sept oct nov dec e.g i.e u.s u.k u.n a.m p.m".split())


def _ends_sentence(text: str, stop: int) -> bool:
    """Whether the punctuation at ``text[stop]`` closes a sentence (not 'Mr.', 'J.', '3.5')."""
    if text[stop] != ".":
        return True
    word = text[:stop].rsplit(None, 1)[-1] if text[:stop].strip() else ""
    word = word.lstrip("\"'(\u201c\u2018[").lower()
    if word in _ABBREVIATIONS:
        return False
    return not (len(word) == 1 and word.isalpha())  # an initial, as in "George W. Bush"


def split_sentences(text: str) -> list[str]:
    """Sentences of ``text``; line breaks always separate sentences (CNN highlights)."""
    sentences: list[str] = []
    for line in text.splitlines():
        start = 0
        for match in _END.finditer(line):
            if _ends_sentence(line, match.start()):
                sentences.append(line[start:match.end()].strip())
                start = match.end()
        sentences.append(line[start:].strip())
    return [s for s in sentences if s]


def rouge(predictions: Sequence[str], references: Sequence[str]) -> dict[str, float]:
    """Mean ROUGE-1/2/L/Lsum F-measures x 100 of aligned prediction/reference lists."""
    if len(predictions) != len(references):
        raise ValueError(f"{len(predictions)} predictions for {len(references)} references")
    if not predictions:
        raise ValueError("ROUGE of an empty list is undefined")
    scorer = rouge_scorer.RougeScorer(list(ROUGE_TYPES), use_stemmer=True)
    totals = dict.fromkeys(ROUGE_TYPES, 0.0)
    for prediction, reference in zip(predictions, references):
        # One sentence per line: rougeLsum reads the lines, the other types ignore them.
        scores = scorer.score("\n".join(split_sentences(reference)),
                              "\n".join(split_sentences(prediction)))
        for name in ROUGE_TYPES:
            totals[name] += scores[name].fmeasure
    return {name: 100.0 * total / len(predictions) for name, total in totals.items()}
