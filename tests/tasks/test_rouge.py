"""ROUGE on pairs scored by hand, and the download-free sentence splitter behind ROUGE-Lsum.

Hand scoring follows rouge-score's rules: lower-case, keep [a-z0-9] tokens, Porter-stem
tokens longer than three characters; F = 2PR / (P + R), reported x 100.
"""

from __future__ import annotations

import pytest

from adalora_cli.tasks.rouge import ROUGE_TYPES, rouge, split_sentences


def test_identical_text_scores_100():
    text = "Quarterly profits at US media giant TimeWarner jumped 76%. Shares rose."
    assert rouge([text], [text]) == pytest.approx(dict.fromkeys(ROUGE_TYPES, 100.0))


def test_unigram_and_bigram_overlap_equal_lengths():
    # ref: the cat sat on the mat / pred: the cat lay on a mat (6 tokens each)
    # unigrams: clipped overlap the, cat, on, mat = 4 -> P = R = F = 4/6
    # bigrams: only "the cat" of 5 each -> F = 1/5
    # LCS: the cat on mat = 4 -> F = 4/6
    scores = rouge(["the cat lay on a mat"], ["the cat sat on the mat"])
    assert scores["rouge1"] == pytest.approx(100 * 4 / 6)
    assert scores["rouge2"] == pytest.approx(20.0)
    assert scores["rougeL"] == pytest.approx(100 * 4 / 6)
    assert scores["rougeLsum"] == pytest.approx(100 * 4 / 6)


def test_overlap_with_unequal_lengths_and_stemming():
    # ref (4): polic arrest two men / pred (8): two men were arrest by polic on friday
    # unigrams: 4 matches, P = 4/8, R = 4/4 -> F = 2/3
    # bigrams: "two men" of 7 predicted, 3 reference: P = 1/7, R = 1/3 -> F = 0.2
    # LCS = 2 (two men): P = 2/8, R = 2/4 -> F = 1/3
    scores = rouge(["Two men were arrested by police on Friday."], ["Police arrested two men"])
    assert scores["rouge1"] == pytest.approx(100 * 2 / 3)
    assert scores["rouge2"] == pytest.approx(20.0)
    assert scores["rougeL"] == pytest.approx(100 / 3)


def test_stemming_matches_inflections():
    # ref: the rate were rise / pred: rate rise -> P = 2/2, R = 2/4, F = 2/3 (0 unstemmed)
    assert rouge(["rate rises"], ["The rates were rising"])["rouge1"] == pytest.approx(200 / 3)


def test_rouge_lsum_scores_sentence_by_sentence():
    # Swapped sentences: the LCS over the whole text is 3 of 6 tokens (F = 1/2), but each
    # reference sentence is matched in full by one predicted sentence (F = 1).
    scores = rouge(["The dog ran. The cat sat."], ["The cat sat. The dog ran."])
    assert scores["rougeL"] == pytest.approx(50.0)
    assert scores["rougeLsum"] == pytest.approx(100.0)


def test_corpus_score_is_the_mean_of_examples():
    scores = rouge(["a perfect match", "nothing here"], ["a perfect match", "totally different"])
    assert scores == pytest.approx(dict.fromkeys(ROUGE_TYPES, 50.0))
    assert all(isinstance(v, float) for v in scores.values())


def test_empty_prediction_scores_zero_and_bad_input_raises():
    assert rouge([""], ["some reference"])["rouge1"] == 0.0
    with pytest.raises(ValueError):
        rouge(["one"], ["one", "two"])
    with pytest.raises(ValueError):
        rouge([], [])


@pytest.mark.parametrize("text, expected", [
    ("Mr. Smith went to Washington. He arrived on Monday!",
     ["Mr. Smith went to Washington.", "He arrived on Monday!"]),
    ("It cost $3.5m. Shares rose 2%.", ["It cost $3.5m.", "Shares rose 2%."]),
    ('He said: "Stop." Then he left?', ['He said: "Stop."', "Then he left?"]),
    ("George W. Bush spoke in the U.S. capital.", ["George W. Bush spoke in the U.S. capital."]),
    ("first highlight\nsecond highlight .", ["first highlight", "second highlight ."]),
    ("  \n ", []),
])
def test_split_sentences(text, expected):
    assert split_sentences(text) == expected
