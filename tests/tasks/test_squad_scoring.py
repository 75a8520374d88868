"""SQuAD scoring against hand-worked cases of the official v1.1 / v2.0 definitions.

Every expected number below is worked out by hand in the comment beside it."""

import pytest

from adalora_cli.tasks.squad_scoring import (
    exact_match,
    f1,
    normalize_answer,
    question_scores,
    score,
)


@pytest.mark.parametrize("text, expected", [
    ("The  Cat", "cat"),                      # lower-case, article dropped, spaces collapsed
    ("An apple, a day!", "apple day"),        # punctuation gone, a/an dropped
    ("anthem theory", "anthem theory"),       # articles only as whole words
    ("the-end", "theend"),                    # punctuation goes first: no word boundary left
    ("A.B.C.", "abc"),                        # "a" glued to "bc" once the dots are gone
    ("(the) end's", "ends"),
    ("1,000\tmen\n", "1000 men"),             # tabs and newlines are white space
    ("Théâtre «Mariinsky»", "théâtre «mariinsky»"),  # only ASCII punctuation is removed
    ("THE", ""),
    ("a an the", ""),
    ("   ", ""),
])
def test_normalization(text, expected):
    assert normalize_answer(text) == expected


def test_exact_match_after_normalization():
    assert exact_match("The Eiffel Tower!", "eiffel tower") == 1.0
    assert exact_match("Eiffel Towers", "eiffel tower") == 0.0


@pytest.mark.parametrize("version_2", [False, True])
@pytest.mark.parametrize("pred, gold, expected", [
    # gold tokens {big, red, dog}, pred {red, dog, barked}: 2 shared -> P = R = 2/3
    ("red dog barked", "the big red dog", 2 / 3),
    # pred 1 token, gold 3 with "dog" twice: shared min(1, 2) = 1 -> P 1, R 1/3 -> F1 1/2
    ("dog", "dog dog cat", 0.5),
    # pred "dog dog" vs gold "dog cat": shared min(2, 1) = 1 -> P 1/2, R 1/2 -> 1/2
    ("dog dog", "dog cat", 0.5),
    # P 1/2, R 1 -> 2 * 1/2 / (3/2) = 2/3
    ("Denver Broncos", "Broncos", 2 / 3),
    ("The Broncos.", "broncos", 1.0),
    ("Panthers", "Broncos", 0.0),
])
def test_partial_overlap_f1(pred, gold, expected, version_2):
    assert f1(pred, gold, version_2=version_2) == pytest.approx(expected)


def test_best_over_several_gold_answers():
    # vs "paris": P 1/2, R 1 -> 2/3; vs "in paris france": P 1, R 2/3 -> 4/5. EM 0 for both.
    golds = ["Paris", "in Paris, France"]
    for v2 in (False, True):
        em, f = question_scores("in paris", golds, version_2=v2)
        assert em == 0.0 and f == pytest.approx(0.8)
    assert question_scores("the Paris", golds, version_2=True) == (1.0, 1.0)


def test_empty_answers_v2():
    # Unanswerable (no gold): "" is exactly right, any text exactly wrong.
    assert question_scores("", [], version_2=True) == (1.0, 1.0)
    assert question_scores("paris", [], version_2=True) == (0.0, 0.0)
    # Answerable: predicting no answer scores 0 on both.
    assert question_scores("", ["paris"], version_2=True) == (0.0, 0.0)
    # A prediction that normalizes to nothing counts as no answer.
    assert question_scores("The.", [], version_2=True) == (1.0, 1.0)
    # Gold answers normalizing to "" are dropped; with none left the gold is "".
    assert question_scores("", ["the", "Paris"], version_2=True) == (0.0, 0.0)
    assert question_scores("", ["the"], version_2=True) == (1.0, 1.0)


def test_empty_answers_v1():
    # v1.1 has no special case: an empty prediction shares no token, so F1 is 0 -- even
    # against a gold answer that itself normalizes to "" (while EM compares "" == "").
    assert question_scores("", ["paris"], version_2=False) == (0.0, 0.0)
    assert question_scores("", ["the"], version_2=False) == (1.0, 0.0)
    with pytest.raises(ValueError):
        question_scores("x", [], version_2=False)


GOLDS = {"q1": ["Paris"], "q2": ["the big red dog"], "q3": [], "q4": []}
PREDS = {"q1": "paris", "q2": "red dog barked", "q3": "", "q4": "london"}


def test_split_scores_v2():
    # per question (EM, F1): q1 (1, 1), q2 (0, 2/3), q3 (1, 1), q4 (0, 0)
    metrics = score(PREDS, GOLDS, version_2=True)
    assert metrics == pytest.approx({
        "exact_match": 50.0, "f1": 100 * (1 + 2 / 3 + 1 + 0) / 4,
        "HasAns_exact": 50.0, "HasAns_f1": 100 * (1 + 2 / 3) / 2, "HasAns_total": 2.0,
        "NoAns_exact": 50.0, "NoAns_f1": 50.0, "NoAns_total": 2.0})
    assert all(type(v) is float for v in metrics.values())


def test_split_scores_v1_and_missing_predictions():
    golds = {k: v for k, v in GOLDS.items() if v}
    assert score(PREDS, golds, version_2=False) == pytest.approx(
        {"exact_match": 50.0, "f1": 100 * (1 + 2 / 3) / 2})
    # q2 has no prediction: scored as "" -> (0, 0); q1 stays (1, 1)
    assert score({"q1": "Paris"}, golds, version_2=False) == pytest.approx(
        {"exact_match": 50.0, "f1": 50.0})


def test_v2_without_unanswerable_questions_has_no_noans_keys():
    # Like the official script, an empty group reports nothing rather than 0/0.
    metrics = score({"q1": "paris"}, {"q1": ["Paris"]}, version_2=True)
    assert set(metrics) == {"exact_match", "f1", "HasAns_exact", "HasAns_f1", "HasAns_total"}
