"""Decoding answers from hand-set logits: the known best span wins, invalid spans never do,
windows merge, and v2's null answer follows the threshold."""

import numpy as np
import pytest

from adalora_cli.tasks.squad_postprocess import best_span, decode, decode_example

CONTEXT = "alpha beta gamma delta"
# One window: [CLS] q [SEP] alpha beta gamma delta [SEP]; -1 marks non-context tokens.
OFFSETS = np.array([[-1, -1], [-1, -1], [-1, -1], [0, 5], [6, 10], [11, 16], [17, 22],
                    [-1, -1]])
# Highest logits sit on the question token (position 1), which must never be chosen.
START = np.array([0.0, 9.0, 0.0, 2.0, 1.0, 4.0, 0.0, 0.0])
END = np.array([0.0, 9.0, 0.0, 0.0, 3.0, 0.5, 2.5, 0.0])
# Valid pairs (start <= end, both in context), score = start + end:
#   (3,3) 2.0  (3,4) 5.0  (3,5) 2.5  (3,6) 4.5  (4,4) 4.0  (4,5) 1.5  (4,6) 3.5
#   (5,5) 4.5  (5,6) 6.5  (6,6) 2.5       -> best (5,6) = "gamma delta", 6.5


def decode_one(windows, **kw):
    kw = {"n_best": 20, "max_answer_length": 30, "version_2": False, "null_threshold": 0.0,
          **kw}
    return decode_example(CONTEXT, windows, **kw)


def test_best_valid_span():
    span = best_span(START, END, OFFSETS, n_best=20, max_answer_length=30)
    assert (span.score, span.start_char, span.end_char) == (6.5, 11, 22)
    assert CONTEXT[span.start_char:span.end_char] == "gamma delta"


def test_max_answer_length():
    # one-token spans only: (5,5) 4.5 > (4,4) 4.0 > (6,6) 2.5 > (3,3) 2.0
    span = best_span(START, END, OFFSETS, n_best=20, max_answer_length=1)
    assert (span.score, span.start_char, span.end_char) == (4.5, 11, 16)


def test_n_best_limits_the_search():
    # n_best 1: start {1}, end {1}: only the question token -> nothing valid.
    assert best_span(START, END, OFFSETS, n_best=1, max_answer_length=30) is None
    # n_best 2: starts {1, 5}, ends {1, 4}: (5,4) has end < start -> nothing valid.
    assert best_span(START, END, OFFSETS, n_best=2, max_answer_length=30) is None
    # n_best 3: starts {1, 5, 3}, ends {1, 4, 6}: (5,6) 6.5 is among them.
    assert best_span(START, END, OFFSETS, n_best=3, max_answer_length=30).score == 6.5


def test_batch_padding_beyond_the_window_is_ignored():
    pad = np.full(4, 100.0)  # logits of padded positions, after the window's last token
    span = best_span(np.r_[START, pad], np.r_[END, pad], OFFSETS, n_best=20,
                     max_answer_length=30)
    assert span.score == 6.5


def test_best_window_wins_across_windows():
    # Window 2 covers "gamma delta" only (its tokens 3, 4). With start2/end2 its best span
    # is (4,4) "delta": 3 + 4 = 7 > window 1's 6.5, so "delta" is the answer.
    offsets2 = np.array([[-1, -1], [-1, -1], [-1, -1], [11, 16], [17, 22], [-1, -1]])
    start2 = np.array([0.0, 0.0, 0.0, 0.0, 3.0, 0.0])
    end2 = np.array([0.0, 0.0, 0.0, 1.0, 4.0, 0.0])
    # window 2 pairs: (3,3) 0+1 = 1, (3,4) 0+4 = 4, (4,4) 3+4 = 7
    assert decode_one([(START, END, OFFSETS, 0), (start2, end2, offsets2, 0)]) == "delta"
    # start2[4] = 2: (4,4) = 6 < 6.5, so window 1's "gamma delta" wins (order irrelevant).
    start2[4] = 2.0
    assert decode_one([(start2, end2, offsets2, 0), (START, END, OFFSETS, 0)]) == \
        "gamma delta"


def with_null(start_cls, end_cls):
    s, e = START.copy(), END.copy()
    s[0], e[0] = start_cls, end_cls
    return s, e


def test_null_answer_against_threshold_v2():
    s, e = with_null(4.0, 3.5)  # null 7.5, best span 6.5: null - best = 1.0
    window = [(s, e, OFFSETS, 0)]
    assert decode_one(window, version_2=True, null_threshold=0.0) == ""
    assert decode_one(window, version_2=True, null_threshold=0.99) == ""
    assert decode_one(window, version_2=True, null_threshold=1.0) == "gamma delta"  # not >
    assert decode_one(window, version_2=True, null_threshold=2.0) == "gamma delta"
    # v1 never answers "" when a valid span exists
    assert decode_one(window, version_2=False) == "gamma delta"


def test_null_score_is_the_smallest_over_windows():
    s1, e1 = with_null(4.0, 3.5)  # null 7.5
    s2, e2 = with_null(2.0, 3.0)  # null 5.0 -> question null 5.0; best 6.5 -> answer
    assert decode_one([(s1, e1, OFFSETS, 0), (s2, e2, OFFSETS, 0)], version_2=True) == \
        "gamma delta"
    assert decode_one([(s1, e1, OFFSETS, 0)], version_2=True) == ""


def test_no_valid_span_means_no_answer():
    only_question = np.array([[-1, -1]] * 8)
    assert decode_one([(START, END, only_question, 0)]) == ""
    assert decode_one([(START, END, only_question, 0)], version_2=True) == ""


def test_leading_space_in_offsets_is_stripped():
    # SentencePiece offsets include the space before a word: "▁beta" -> (5, 10)
    offsets = OFFSETS.copy()
    offsets[4] = [5, 10]
    start = np.array([0.0, 0.0, 0.0, 0.0, 5.0, 0.0, 0.0, 0.0])
    end = np.array([0.0, 0.0, 0.0, 0.0, 5.0, 0.0, 0.0, 0.0])
    assert decode_one([(start, end, offsets, 0)]) == "beta"


def test_decode_groups_windows_by_example():
    contexts = [CONTEXT, "one two"]
    off_b = np.array([[-1, -1], [0, 3], [4, 7], [-1, -1]])
    s_b, e_b = np.array([0.0, 0.0, 2.0, 0.0]), np.array([0.0, 0.0, 2.0, 0.0])
    # windows in order: example 0, example 1, example 0 (interleaved on purpose)
    answers = decode(contexts, np.array([0, 1, 0]), [START, s_b, START * 0],
                     [END, e_b, END * 0], [OFFSETS, off_b, OFFSETS], np.array([0, 0, 0]),
                     n_best=20, max_answer_length=30, version_2=False, null_threshold=0.0)
    assert answers == ["gamma delta", "two"]


@pytest.mark.parametrize("threshold", [-1.0, 0.0])
def test_negative_threshold_prefers_null_more_often(threshold):
    # null 6.0 vs best 6.5: diff -0.5 > -1.0 -> ""; with threshold 0 -> span
    s, e = with_null(3.0, 3.0)
    expected = "" if threshold < -0.5 else "gamma delta"
    assert decode_one([(s, e, OFFSETS, 0)], version_2=True,
                      null_threshold=threshold) == expected
