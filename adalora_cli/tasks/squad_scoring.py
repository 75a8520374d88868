"""SQuAD scoring as the official v1.1 and v2.0 evaluation scripts define it
(docs/maths.md#tasks-and-metrics).

The official scripts (``evaluate-v1.1.py``, ``evaluate-v2.0.py``) are not importable, and
``evaluate.load("squad")`` needs the hub, so their definitions are restated here:

- answers are normalized by lower-casing, deleting every ASCII punctuation character
  (``string.punctuation``), replacing the whole words a/an/the by a space, and collapsing
  white space -- in that order, so "the-end" becomes "theend" and keeps its article;
- exact match is 1 when the normalized strings are equal; F1 is the harmonic mean of
  token precision and recall over the bag of normalized white-space tokens;
- each question takes the maximum over its gold answers, and the split reports the mean
  of both numbers times 100.

The versions differ on empty answers. v1.1 has no unanswerable questions: an empty
normalized prediction simply shares no token with the gold answer and scores F1 0. v2.0
first drops gold answers that normalize to "" and, when none remain (an unanswerable
question), scores against the single gold answer ""; its F1 is then 1 when both sides have
no tokens and 0 when only one side has none, so "" is the right answer to an unanswerable
question and any text is wrong. v2.0 also reports both numbers over the answerable
(``HasAns_*``) and unanswerable (``NoAns_*``) questions separately, where a question counts
as answerable when its raw answer list is non-empty; like the official script, a group with
no questions gets no keys. The official script's no-answer probability file is not used
(it defaults to probability 0, which leaves every prediction as it is).
"""

from __future__ import annotations

import re
import string
from collections import Counter
from collections.abc import Mapping, Sequence

_PUNCTUATION = frozenset(string.punctuation)
_ARTICLES = re.compile(r"\b(a|an|the)\b", re.UNICODE)


def normalize_answer(text: str) -> str:
    """Lower-case, drop punctuation, drop the articles a/an/the, collapse white space."""
    text = text.lower()
    text = "".join(ch for ch in text if ch not in _PUNCTUATION)
    text = _ARTICLES.sub(" ", text)
    return " ".join(text.split())


def answer_tokens(text: str) -> list[str]:
    """The white-space tokens of the normalized answer (empty for an empty answer)."""
    return normalize_answer(text).split()


def exact_match(prediction: str, gold: str) -> float:
    """1.0 when the normalized strings are equal, else 0.0 (both versions)."""
    return float(normalize_answer(prediction) == normalize_answer(gold))


def f1(prediction: str, gold: str, *, version_2: bool) -> float:
    """Token F1 between one prediction and one gold answer.

    An empty side scores 0 in v1.1 (no shared token); v2.0 scores 1 when both are empty."""
    pred, ref = answer_tokens(prediction), answer_tokens(gold)
    if version_2 and (not pred or not ref):
        return float(pred == ref)
    shared = sum((Counter(pred) & Counter(ref)).values())
    if shared == 0:
        return 0.0
    precision, recall = shared / len(pred), shared / len(ref)
    return 2 * precision * recall / (precision + recall)


def question_scores(prediction: str, golds: Sequence[str], *,
                    version_2: bool) -> tuple[float, float]:
    """(exact match, F1) of one question: the best over its gold answers."""
    if version_2:
        golds = [g for g in golds if normalize_answer(g)] or [""]
    elif not golds:
        raise ValueError("SQuAD v1.1 scoring needs at least one gold answer per question")
    return (max(exact_match(prediction, g) for g in golds),
            max(f1(prediction, g, version_2=version_2) for g in golds))


def score(predictions: Mapping[str, str], golds: Mapping[str, Sequence[str]], *,
          version_2: bool) -> dict[str, float]:
    """Split metrics, x100 like the official scripts: exact_match, f1 (+ HasAns/NoAns for v2).

    ``golds`` maps every question id to its raw gold answer texts (empty for unanswerable
    questions). A question without a prediction is scored as the empty answer."""
    if not golds:
        raise ValueError("no questions to score")
    per_question = {qid: question_scores(predictions.get(qid, ""), answers,
                                         version_2=version_2)
                    for qid, answers in golds.items()}
    metrics = {"exact_match": _mean_x100(per_question.values(), 0),
               "f1": _mean_x100(per_question.values(), 1)}
    if version_2:
        has_ans = [qid for qid, answers in golds.items() if len(answers) > 0]
        no_ans = [qid for qid, answers in golds.items() if len(answers) == 0]
        for prefix, ids in (("HasAns", has_ans), ("NoAns", no_ans)):
            if ids:  # the official script omits an empty group
                group = [per_question[q] for q in ids]
                metrics[f"{prefix}_exact"] = _mean_x100(group, 0)
                metrics[f"{prefix}_f1"] = _mean_x100(group, 1)
                metrics[f"{prefix}_total"] = float(len(ids))
    return metrics


def _mean_x100(pairs, which: int) -> float:
    pairs = list(pairs)
    return 100.0 * sum(pair[which] for pair in pairs) / len(pairs)
