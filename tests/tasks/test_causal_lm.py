"""The causal_lm task: row shapes, response-only labels, packing, scoring, and bad input.

Token ids are checked against the tiny Llama fixture's tokenizer called piece by piece, and
losses against cross-entropy written out over the logits."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer
from typer.testing import CliRunner

from adalora_cli.cli import app
from adalora_cli.config import ConfigError, load_config
from adalora_cli.tasks import get_task
from adalora_cli.tasks.causal_lm_data import LABEL_PAD, pack, pad_right
from tests.conftest import FIXTURES, ROOT

SMOKE = ROOT / "configs/smoke/causal_lm.yaml"
LLAMA = FIXTURES / "tiny-llama"


@pytest.fixture(scope="module")
def tok():
    return AutoTokenizer.from_pretrained(LLAMA)


def _task(*overrides: str):
    return get_task(load_config(SMOKE, [f"model.name_or_path={LLAMA}", *overrides]))


def _ids(tok, text: str, special: bool = False) -> list[int]:
    return tok(text, add_special_tokens=special)["input_ids"]


def test_prompt_response_rows_mask_the_prompt(tok) -> None:
    task = _task(f"task.data_dir={FIXTURES / 'causal_lm/qa'}")
    data = task.load_data(tok)
    row = data.eval_splits["validation"][0]
    prompt = _ids(tok, "Question: Which river runs through Morden?\nAnswer:", True)
    response = _ids(tok, " The Nene.") + [tok.eos_token_id]
    assert prompt[0] == tok.bos_token_id  # the tokenizer's own framing: <s> first
    assert row["input_ids"] == prompt + response
    assert row["labels"] == [LABEL_PAD] * len(prompt) + response
    assert row["prompt_ids"] == prompt and row["reference"] == " The Nene."
    assert (len(data.train), len(data.eval_splits["validation"])) == (48, 8)


def test_train_on_prompt_keeps_every_label(tok) -> None:
    task = _task(f"task.data_dir={FIXTURES / 'causal_lm/qa'}", "task.train_on_prompt=true")
    row = task.load_data(tok).eval_splits["validation"][0]
    assert row["labels"] == row["input_ids"]


def test_chat_rows_use_the_template_and_train_the_reply(tok) -> None:
    task = _task(f"task.data_dir={FIXTURES / 'causal_lm/chat'}")
    row = task.load_data(tok).eval_splits["validation"][0]
    prompt = "<s><|system|>\nAnswer briefly.\n<|user|>\nWhich river runs through Morden?\n" \
             "<|assistant|>\n"
    reply = "The Nene.</s>\n"  # what the template writes after the generation prompt
    assert row["input_ids"] == _ids(tok, prompt) + _ids(tok, reply)
    assert row["labels"] == [LABEL_PAD] * len(_ids(tok, prompt)) + _ids(tok, reply)
    assert row["reference"] == "The Nene." and tok.eos_token_id in row["labels"]


def test_text_rows_train_every_token(tok) -> None:
    task = _task(f"task.data_dir={FIXTURES / 'causal_lm/text'}")
    row = task.load_data(tok).train[0]
    text = "Question: Which river runs through Arden?\nAnswer: The Tay."
    assert row["input_ids"] == row["labels"] == _ids(tok, text, True) + [tok.eos_token_id]


def test_truncation_cuts_the_response_end(tok) -> None:
    qa = f"task.data_dir={FIXTURES / 'causal_lm/qa'}"
    full = _task(qa).load_data(tok).eval_splits["validation"]
    cut = _task(qa, "task.max_length=26").load_data(tok).eval_splits["validation"]
    lengths = [len(r) for r in full["input_ids"]]  # 29, 30, 31, 28, 32, 32, 26, 30
    assert [len(r) for r in cut["input_ids"]] == [min(n, 26) for n in lengths]
    for whole, short in zip(full, cut):  # the prompt intact, the response's end dropped
        assert short["prompt_ids"] == whole["prompt_ids"]
        assert short["input_ids"] == whole["input_ids"][:26]
        assert short["labels"] == whole["labels"][:26]


def test_packing_concatenates_whole_rows_in_order() -> None:
    rows = [{"input_ids": [i] * n, "labels": [-100] + [i] * (n - 1)}
            for i, n in enumerate([3, 4, 2, 5, 1], start=1)]
    packed = pack(rows, max_length=7)
    assert [r["input_ids"] for r in packed] == [[1, 1, 1, 2, 2, 2, 2], [3, 3, 4, 4, 4, 4, 4],
                                                [5]]
    assert packed[0]["labels"] == [-100, 1, 1, -100, 2, 2, 2]
    batch = pad_right(packed[1:], pad_id=0)
    assert batch["labels"][1].tolist() == [-100, -100, -100, -100, -100, -100, -100]
    assert batch["attention_mask"][1].tolist() == [1, 0, 0, 0, 0, 0, 0]


def test_prompt_tokens_add_nothing_to_the_loss(tok) -> None:
    """Every logit that predicts a prompt token gets exactly zero gradient, and the loss is
    the cross-entropy of the response tokens alone; with train_on_prompt the same batch
    scores differently, so the prompt tokens would change the loss if they counted."""
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_pretrained(LLAMA)
    with torch.no_grad():  # peaked predictions: every token's cross-entropy differs a lot
        model.lm_head.weight.mul_(40.0)
    data = _task(f"task.data_dir={FIXTURES / 'causal_lm/qa'}").load_data(tok)
    items = [data.eval_splits["validation"][i] for i in range(3)]
    batch = data.collate([{"input_ids": r["input_ids"], "labels": r["labels"]} for r in items])
    out = model(**batch)
    logits = out.logits
    logits.retain_grad()
    out.loss.backward()
    by_hand, n = 0.0, 0
    for b, row in enumerate(items):
        start = len(row["prompt_ids"])
        for t in range(start, len(row["input_ids"])):  # logits at t - 1 predict token t
            log_p = torch.log_softmax(logits[b, t - 1].detach().double(), -1)
            by_hand -= float(log_p[row["input_ids"][t]])
            n += 1
        assert logits.grad[b, :start - 1].abs().max() == 0  # positions predicting the prompt
        assert logits.grad[b, start - 1:len(row["input_ids"]) - 1].abs().sum(-1).min() > 0
    assert math.isclose(float(out.loss.detach()), by_hand / n, rel_tol=1e-5)
    everything = _task(f"task.data_dir={FIXTURES / 'causal_lm/qa'}",
                       "task.train_on_prompt=true").load_data(tok)
    items = [everything.eval_splits["validation"][i] for i in range(3)]
    batch = everything.collate([{"input_ids": r["input_ids"], "labels": r["labels"]}
                                for r in items])
    with torch.no_grad():
        assert abs(float(model(**batch).loss) - float(out.loss.detach())) > 0.5  # 15.5 vs 14.5


def test_evaluation_loss_perplexity_and_generation_scores(tok, monkeypatch) -> None:
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_pretrained(LLAMA)
    task = _task(f"task.data_dir={FIXTURES / 'causal_lm/qa'}", "task.max_new_tokens=4")
    data = task.load_data(tok)
    val = data.eval_splits["validation"]
    refs = [r.strip() for r in val["reference"]]
    # two of the eight answers exactly right, the others wrong: exact match 25
    monkeypatch.setattr(task, "generate", lambda *a, **k: refs[:2] + ["no"] * 6)
    import contextlib
    metrics = task.evaluate(model, "validation", val, batch_size=3, collate=data.collate,
                            device=torch.device("cpu"), autocast=contextlib.nullcontext)
    with torch.no_grad():  # the token-weighted mean over the whole split, one row at a time
        total, count = 0.0, 0
        for row in val:
            batch = data.collate([{"input_ids": row["input_ids"], "labels": row["labels"]}])
            n = sum(x != LABEL_PAD for x in row["labels"][1:])
            total += float(model(**batch).loss) * n
            count += n
    assert math.isclose(metrics["loss"], total / count, rel_tol=1e-5)
    assert math.isclose(metrics["perplexity"], math.exp(metrics["loss"]), rel_tol=1e-9)
    assert metrics["exact_match"] == 25.0
    assert task.predictions["validation"][0]["prediction"] == refs[0]
    assert task.predictions["validation"][0]["prompt"].startswith("Question: Which river")


# ----------------------------------------------------------------------- bad input

runner = CliRunner()


def _train_fails(tmp_path: Path, *overrides: str) -> str:
    run_dir = tmp_path / "run"
    result = runner.invoke(app, ["train", str(SMOKE), *overrides, "--run-dir", str(run_dir),
                                 "-q"])
    assert result.exit_code == 2, result.output
    lines = result.output.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ")
    assert not run_dir.exists()  # nothing half-written
    return lines[0]


def _write(folder: Path, train: str, validation: str | None = None) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "train.jsonl").write_text(train)
    (folder / "validation.jsonl").write_text(validation if validation is not None else train)
    return folder


def test_rows_with_neither_text_nor_prompt_response(tmp_path, in_repo) -> None:
    data = _write(tmp_path / "d", json.dumps({"question": "a", "answer": "b"}) + "\n")
    line = _train_fails(tmp_path, f"task.data_dir={data}")
    assert line == (f"error: {data}/train.jsonl has neither a 'text' column nor 'prompt' + "
                    "'response' (nor 'messages', sharegpt's 'conversations' or alpaca's "
                    "'instruction' + 'output'); it has question, answer; rename its columns "
                    "or set task.text_column, task.prompt_column / task.response_column or "
                    "task.messages_column")
    # ... which the column settings fix
    result = runner.invoke(app, ["train", str(SMOKE), f"task.data_dir={data}",
                                 "task.prompt_column=question", "task.response_column=answer",
                                 "--run-dir", str(tmp_path / "ok"), "-q", "method.name=lora",
                                 "train.max_steps=1", "task.max_new_tokens=0"])
    assert result.exit_code == 0, result.output


def test_empty_file(tmp_path, in_repo) -> None:
    good = json.dumps({"text": "hello there"}) + "\n"
    data = _write(tmp_path / "d", good, "")
    line = _train_fails(tmp_path, f"task.data_dir={data}")
    assert f"{data}/validation.jsonl" in line and ("no rows" in line or "could not read" in line)


def test_prompt_longer_than_max_length(tmp_path, in_repo) -> None:
    rows = [{"prompt": "Question: " + "a b c d " * 3, "response": " yes"},
            {"prompt": "Question: " + "a b c d " * 40, "response": " no"}]
    data = _write(tmp_path / "d", "".join(json.dumps(r) + "\n" for r in rows))
    line = _train_fails(tmp_path, f"task.data_dir={data}", "task.max_length=32")
    assert line.startswith(f"error: {data}/train.jsonl row 2: the prompt is ")
    assert line.endswith("tokens, which leaves no room for the response within "
                         "task.max_length=32; raise task.max_length or shorten the prompt")


def test_model_type_without_defaults(tmp_path, in_repo) -> None:
    from transformers import BloomConfig, BloomForCausalLM

    folder = tmp_path / "tiny-bloom"
    BloomForCausalLM(BloomConfig(hidden_size=16, n_layer=1, n_head=2, vocab_size=320)
                     ).save_pretrained(folder)
    for name in ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja"):
        (folder / name).write_bytes((LLAMA / name).read_bytes())
    line = _train_fails(tmp_path, f"model.name_or_path={folder}")
    assert line == ("error: no default target modules for model type bloom; its linear modules "
                    "are query_key_value, dense, dense_h_to_4h, dense_4h_to_h; set "
                    "method.target_modules=[query_key_value,dense,dense_h_to_4h,dense_4h_to_h] "
                    "(names match the end of a module path)")


def test_encoder_decoder_is_refused() -> None:
    with pytest.raises(ConfigError, match="is an encoder-decoder; causal_lm needs a "
                                          "decoder-only model"):
        get_task(load_config(SMOKE, [f"model.name_or_path={FIXTURES / 'tiny-bart'}"])
                 ).build_model()


def test_chat_rows_need_a_chat_template(tmp_path, in_repo) -> None:
    folder = tmp_path / "no-template"
    folder.mkdir()
    for f in LLAMA.iterdir():
        if f.name != "chat_template.jinja":
            (folder / f.name).write_bytes(f.read_bytes())
    line = _train_fails(tmp_path, f"model.name_or_path={folder}",
                        f"task.data_dir={FIXTURES / 'causal_lm/chat'}")
    assert line == (f"error: {FIXTURES}/causal_lm/chat/train.jsonl row 1 holds chat messages "
                    "but the tokenizer has no chat template; give prompt and response columns "
                    "instead")


def _jsonl(rows: list[dict]) -> str:
    return "".join(json.dumps(r) + "\n" for r in rows)


GOOD = [{"prompt": f"Question: {i} plus one?\nAnswer:", "response": f" {i + 1}."}
        for i in range(6)]


def test_rows_with_nothing_to_learn_are_left_out_and_named(tmp_path, tok, in_repo) -> None:
    """A missing, null, empty or blank response is left out with one line naming the rows;
    what is trained (and counted in the summary) is exactly the whole rows."""
    bad = [{"prompt": "Question: lost?\nAnswer:"}, {"prompt": "Q: a", "response": None},
           {"prompt": "Q: b", "response": ""}, {"prompt": "Q: c", "response": "   "}]
    rows = GOOD[:2] + bad + GOOD[2:]  # rows 3-6 are the bad ones
    data = _write(tmp_path / "d", _jsonl(rows), _jsonl(GOOD))
    clean = _write(tmp_path / "clean", _jsonl(GOOD))
    loaded = _task(f"task.data_dir={data}").load_data(tok)
    expected = _task(f"task.data_dir={clean}").load_data(tok)
    assert loaded.train["input_ids"] == expected.train["input_ids"]
    assert loaded.train["labels"] == expected.train["labels"]
    assert loaded.info["train_examples"] == 6 and loaded.info["train_left_out"] == 4
    assert "validation_left_out" not in loaded.info
    assert loaded.notes == [f"left out 4 of the 10 rows of {data}/train.jsonl: rows 3, 4, 5, 6 "
                            "have no 'response' (missing, null or empty); the run uses the "
                            "other 6"]
    run_dir = tmp_path / "run"
    result = runner.invoke(app, ["train", str(SMOKE), f"task.data_dir={data}", "-q",
                                 "method.name=lora", "train.max_steps=1",
                                 "task.max_new_tokens=0", "--run-dir", str(run_dir)])
    assert result.exit_code == 0, result.output
    assert f"warning: {loaded.notes[0]}" in result.output
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["data"]["train_examples"] == 6 and summary["data"]["train_left_out"] == 4


def test_text_rows_without_text_and_a_null_prompt_are_left_out(tmp_path, tok) -> None:
    texts = [{"text": "one two"}, {"text": None}, {"text": ""}, {"text": "three"}]
    data = _write(tmp_path / "t", _jsonl(texts))
    loaded = _task(f"task.data_dir={data}").load_data(tok)
    assert loaded.info["train_examples"] == 2 and loaded.info["validation_left_out"] == 2
    assert loaded.notes[0].endswith("rows 2, 3 have no 'text' (missing, null or empty); the "
                                    "run uses the other 2")
    pairs = GOOD[:1] + [{"prompt": None, "response": " x"}]
    data = _write(tmp_path / "p", _jsonl(pairs))
    assert _task(f"task.data_dir={data}").load_data(tok).notes[0].endswith(
        "row 2 has no 'prompt' (missing, null or empty); the run uses the other 1")


def test_a_file_mixing_row_shapes_is_refused(tmp_path, in_repo) -> None:
    rows = GOOD + [{"text": "Question: 9 plus one?\nAnswer: 10."}, {"text": "more"}]
    data = _write(tmp_path / "d", _jsonl(rows), _jsonl(GOOD))
    line = _train_fails(tmp_path, f"task.data_dir={data}")
    assert line == (f"error: {data}/train.jsonl mixes row shapes: its rows are prompt + "
                    "response, but 2 rows (the first is row 7) are text; keep one shape per "
                    "file, or rewrite those rows in the file's shape")


def test_a_split_with_nothing_to_learn_is_refused(tmp_path, in_repo) -> None:
    rows = [{"prompt": "Q: a", "response": ""}, {"prompt": "Q: b", "response": None}]
    data = _write(tmp_path / "d", _jsonl(GOOD), _jsonl(rows))
    line = _train_fails(tmp_path, f"task.data_dir={data}")
    assert line == (f"error: {data}/validation.jsonl: none of its 2 rows has anything to "
                    "learn (rows 1, 2 have no 'response' (missing, null or empty)); fill "
                    "those values in")


@pytest.mark.parametrize("messages, expected", [
    ("hello there", "must be a list of {\"role\": ..., \"content\": ...} objects, got str "
                    "'hello there'; give a list, or use a prompt column"),
    (["hi", "there"], "must be a non-empty list of {\"role\": ..., \"content\": ...} objects, "
                      "got 'hi'"),
])
def test_predict_chat_messages_that_are_not_a_chat(smoke_runs, tmp_path, in_repo, messages,
                                                   expected) -> None:
    run = smoke_runs(str(SMOKE), "method.name=lora", "train.max_steps=2")
    given = tmp_path / "in.jsonl"
    given.write_text(json.dumps({"messages": messages}) + "\n")
    out = tmp_path / "out.jsonl"
    result = runner.invoke(app, ["predict", str(run), "-i", str(given), "-o", str(out), "-q"])
    assert result.exit_code == 2, result.output
    assert result.output.strip() == f"error: the input: chat messages {expected}"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["in.jsonl"]


def test_training_chat_messages_that_are_not_a_chat(tmp_path, in_repo) -> None:
    data = _write(tmp_path / "d", _jsonl([{"messages": "just a string"}]))
    line = _train_fails(tmp_path, f"task.data_dir={data}")
    assert line == (f"error: {data}/train.jsonl row 1: chat messages must be a list of "
                    "{\"role\": ..., \"content\": ...} objects, got str 'just a string'; give "
                    "a list, or use a prompt column")
