"""causal_lm's instruction formats (alpaca, sharegpt), how a file's format is told or named,
task.system_prompt, and the CPU recipe for your own chats (configs/demo/own_chats.yaml).

Expected token ids are built by hand from the tiny Llama fixture's chat template
(tests/fixtures/tiny-llama/chat_template.jinja: ``<s>``, then ``<|role|>\\n`` + content per
turn, ``</s>`` after an assistant's, ``\\n`` after each, and ``<|assistant|>\\n`` as the
generation prompt), tokenized without special tokens."""

from __future__ import annotations

import json
from pathlib import Path

import datasets
import pytest
from transformers import AutoTokenizer
from typer.testing import CliRunner

from adalora_cli.cli import app
from adalora_cli.config import ConfigError, TaskConfig, load_config
from adalora_cli.tasks import get_task
from adalora_cli.tasks.causal_lm_data import LABEL_PAD, row_shape
from adalora_cli.tasks.data import read_table
from tests.conftest import FIXTURES, ROOT

SMOKE = ROOT / "configs/smoke/causal_lm.yaml"
RECIPE = ROOT / "configs/demo/own_chats.yaml"
LLAMA = FIXTURES / "tiny-llama"
ALPACA = FIXTURES / "causal_lm/alpaca"
SHAREGPT = FIXTURES / "causal_lm/sharegpt"
runner = CliRunner()


@pytest.fixture(scope="module")
def tok():
    return AutoTokenizer.from_pretrained(LLAMA)


def _task(*overrides: str):
    return get_task(load_config(SMOKE, [f"model.name_or_path={LLAMA}", *overrides]))


def _ids(tok, text: str) -> list[int]:
    return tok(text, add_special_tokens=False)["input_ids"]


def _expected(tok, prompt: str, reply: str) -> tuple[list[int], list[int]]:
    """(input_ids, labels) of a chat whose rendered prompt and last reply are given: the
    loss on the reply and the template's ``</s>\\n`` after it, nowhere else."""
    p, r = _ids(tok, prompt), _ids(tok, reply + "</s>\n")
    return p + r, [LABEL_PAD] * len(p) + r


def _rows(folder: Path, split: str = "validation") -> list[dict]:
    return [json.loads(line) for line in (folder / f"{split}.jsonl").read_text().splitlines()]


# ------------------------------------------------------------------------- alpaca


def test_alpaca_rows_are_one_user_turn_and_the_output_as_reply(tok) -> None:
    """instruction + "\\n" + input (an empty input adds nothing) is the user's turn, output
    the assistant's reply; the loss covers the reply only."""
    data = _task(f"task.data_dir={ALPACA}").load_data(tok)
    val = data.eval_splits["validation"]
    first = "<s><|user|>\nWhich river runs through Morden?\n<|assistant|>\n"
    spell = "<s><|user|>\nSpell this name.\nMorden\n<|assistant|>\n"  # row 4: input "Morden"
    assert (val[0]["input_ids"], val[0]["labels"]) == _expected(tok, first, "The Nene.")
    assert (val[3]["input_ids"], val[3]["labels"]) == _expected(tok, spell, "M O R D E N")
    for row, raw in zip(val, _rows(ALPACA)):
        user = "\n".join(x for x in (raw["instruction"], raw["input"]) if x)
        prompt = f"<s><|user|>\n{user}\n<|assistant|>\n"
        assert (row["input_ids"], row["labels"]) == _expected(tok, prompt, raw["output"])
        assert row["prompt_ids"] == _ids(tok, prompt) and row["reference"] == raw["output"]
    assert (len(data.train), len(val)) == (48, 8)
    named = _task(f"task.data_dir={ALPACA}", "task.format=alpaca").load_data(tok)
    assert named.eval_splits["validation"]["input_ids"] == val["input_ids"]


def test_alpaca_system_and_history_columns(tmp_path, tok) -> None:
    """An optional system column opens the chat; history's [instruction, output] pairs are
    earlier turns, context only (their replies carry no loss)."""
    rows = [{"instruction": "And Arden?", "input": "", "output": "The Tay.",
             "system": "Answer briefly.",
             "history": [["Which river runs through Morden?", "The Nene."]]},
            {"instruction": "Which river runs through Kelso?", "input": "", "output": "The Wye.",
             "system": None, "history": []}]
    data = _task(f"task.data_dir={_write(tmp_path / 'd', rows)}").load_data(tok)
    val = data.eval_splits["validation"]
    prompt = ("<s><|system|>\nAnswer briefly.\n<|user|>\nWhich river runs through Morden?\n"
              "<|assistant|>\nThe Nene.</s>\n<|user|>\nAnd Arden?\n<|assistant|>\n")
    assert (val[0]["input_ids"], val[0]["labels"]) == _expected(tok, prompt, "The Tay.")
    plain = "<s><|user|>\nWhich river runs through Kelso?\n<|assistant|>\n"
    assert (val[1]["input_ids"], val[1]["labels"]) == _expected(tok, plain, "The Wye.")


# ----------------------------------------------------------------------- sharegpt


def test_sharegpt_rows_are_chats_with_the_roles_renamed(tok) -> None:
    """human -> user, gpt -> assistant, system -> system; a row's system column opens a chat
    without a system turn; only the last gpt turn is learned, as for messages."""
    data = _task(f"task.data_dir={SHAREGPT}").load_data(tok)
    val = data.eval_splits["validation"]
    first = ("<s><|system|>\nAnswer briefly.\n<|user|>\nWhich river runs through Morden?\n"
             "<|assistant|>\n")
    assert (val[0]["input_ids"], val[0]["labels"]) == _expected(tok, first, "The Nene.")
    two_turns = ("<s><|system|>\nAnswer briefly.\n<|user|>\nIs Morden a town or a city?\n"
                 "<|assistant|>\nIt is a small city.</s>\n<|user|>\nSpell the name Morden.\n"
                 "<|assistant|>\n")
    assert (val[3]["input_ids"], val[3]["labels"]) == _expected(tok, two_turns, "M O R D E N")
    assert val[3]["reference"] == "M O R D E N"
    # the single-exchange rows are the messages fixture's rows, encoded alike
    chat = _task(f"task.data_dir={FIXTURES / 'causal_lm/chat'}").load_data(tok)
    for i in (0, 1, 2, 4):
        assert val[i]["input_ids"] == chat.eval_splits["validation"][i]["input_ids"]
        assert val[i]["labels"] == chat.eval_splits["validation"][i]["labels"]
    named = _task(f"task.data_dir={SHAREGPT}", "task.format=sharegpt").load_data(tok)
    assert named.eval_splits["validation"]["labels"] == val["labels"]


# ------------------------------------------------------------------ system_prompt


def test_system_prompt_opens_chats_that_have_none(tok) -> None:
    alpaca = _task(f"task.data_dir={ALPACA}", "task.system_prompt=Be brief.").load_data(tok)
    prompt = ("<s><|system|>\nBe brief.\n<|user|>\nWhich river runs through Morden?\n"
              "<|assistant|>\n")
    row = alpaca.eval_splits["validation"][0]
    assert (row["input_ids"], row["labels"]) == _expected(tok, prompt, "The Nene.")
    # a chat's own system turn (or sharegpt's system column) is kept
    own = _task(f"task.data_dir={SHAREGPT}", "task.system_prompt=Be brief.").load_data(tok)
    plain = _task(f"task.data_dir={SHAREGPT}").load_data(tok)
    assert own.eval_splits["validation"]["input_ids"] == \
        plain.eval_splits["validation"]["input_ids"]


def test_predict_opens_a_chat_with_the_system_prompt(tok, monkeypatch) -> None:
    task = _task("task.system_prompt=Be brief.")
    seen = {}

    def generate(model, prompts, **kwargs):
        seen["prompts"] = prompts
        return ["x"] * len(prompts)

    monkeypatch.setattr(task, "generate", generate)
    chats = [[{"role": "user", "content": "Which river runs through Ivel?"}],
             [{"role": "system", "content": "Answer briefly."},
              {"role": "user", "content": "Which river runs through Kelso?"}]]
    task.predict_rows(None, tok, datasets.Dataset.from_dict({"messages": chats}), "cpu")
    assert seen["prompts"] == [
        _ids(tok, "<s><|system|>\nBe brief.\n<|user|>\nWhich river runs through Ivel?\n"
                  "<|assistant|>\n"),
        _ids(tok, "<s><|system|>\nAnswer briefly.\n<|user|>\nWhich river runs through "
                  "Kelso?\n<|assistant|>\n")]


# ---------------------------------------------------------------------- detection


@pytest.mark.parametrize("columns, fmt, kind", [
    (["instruction", "input", "output"], "auto", "alpaca"),
    (["instruction", "output"], "auto", "alpaca"),
    # tatsu-lab/alpaca's columns: "text" is its pre-rendered prompt, the columns win
    (["instruction", "input", "output", "text"], "auto", "alpaca"),
    (["instruction", "input", "output", "text"], "text", "text"),
    (["conversations", "system"], "auto", "sharegpt"),
    (["messages", "conversations"], "auto", "messages"),
    (["messages", "conversations"], "sharegpt", "sharegpt"),
    (["id", "prompt", "response", "text"], "auto", "pair"),
    (["id", "prompt", "response", "text"], "prompt_response", "pair"),
    (["instruction", "text"], "auto", "text"),  # no output: not alpaca, but a text file
])
def test_the_format_is_told_by_the_columns_or_named(columns, fmt, kind) -> None:
    assert row_shape(columns, TaskConfig(format=fmt), "f").kind == kind


@pytest.mark.parametrize("columns, fmt, message", [
    (["instruction", "input"], "auto",
     "f has an 'instruction' column but no 'output', the reply an alpaca row teaches "
     "(instruction, optional input, output); it has instruction, input; add the replies as "
     "'output'"),
    (["prompt", "response"], "alpaca",
     "f has no 'instruction' column, which task.format=alpaca reads (instruction + output); "
     "it has prompt, response; rename its columns, or set task.format=auto to tell the "
     "format by the columns"),
    (["messages"], "sharegpt",
     "f has no 'conversations' column, which task.format=sharegpt reads (conversations); it "
     "has messages; rename its columns, or set task.format=auto to tell the format by the "
     "columns"),
])
def test_a_format_without_its_columns_is_one_line(columns, fmt, message) -> None:
    with pytest.raises(ConfigError) as err:
        row_shape(columns, TaskConfig(format=fmt), "f")
    assert str(err.value) == message


# ---------------------------------------------------------------------- bad input


def _write(folder: Path, train: list[dict], validation: list[dict] | None = None) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    for split, rows in (("train", train), ("validation", validation or train)):
        (folder / f"{split}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return folder


def _train_fails(tmp_path: Path, *overrides: str) -> str:
    run_dir = tmp_path / "run"
    result = runner.invoke(app, ["train", str(SMOKE), *overrides, "--run-dir", str(run_dir),
                                 "-q"])
    assert result.exit_code == 2, result.output
    lines = result.output.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), result.output
    assert not run_dir.exists()  # nothing half-written
    return lines[0]


ASK = [{"instruction": f"What is {i} plus one?", "input": "", "output": f"{i + 1}."}
       for i in range(4)]


def test_an_alpaca_file_without_output_is_refused(tmp_path, in_repo) -> None:
    data = _write(tmp_path / "d", [{"instruction": r["instruction"], "input": ""}
                                   for r in ASK])
    line = _train_fails(tmp_path, f"task.data_dir={data}")
    assert line == (f"error: {data}/train.jsonl has an 'instruction' column but no 'output', "
                    "the reply an alpaca row teaches (instruction, optional input, output); it "
                    "has instruction, input; add the replies as 'output'")


def test_a_named_format_the_file_does_not_have_is_refused(tmp_path, in_repo) -> None:
    line = _train_fails(tmp_path, f"task.data_dir={FIXTURES / 'causal_lm/qa'}",
                        "task.format=alpaca")
    assert line == (f"error: {FIXTURES}/causal_lm/qa/train.jsonl has no 'instruction' column, "
                    "which task.format=alpaca reads (instruction + output); it has id, prompt, "
                    "response; rename its columns, or set task.format=auto to tell the format "
                    "by the columns")


def test_an_unknown_format_is_refused(tmp_path, in_repo) -> None:
    line = _train_fails(tmp_path, "task.format=xml")
    assert line == ("error: task.format must be one of auto, prompt_response, messages, text, "
                    "alpaca, sharegpt; got 'xml'")


def test_a_sharegpt_row_in_an_alpaca_file_is_refused(tmp_path, in_repo) -> None:
    chat = {"conversations": [{"from": "human", "value": "Hi?"}, {"from": "gpt", "value": "Hi."}]}
    data = _write(tmp_path / "d", ASK[:2] + [chat] + ASK[2:], ASK)
    line = _train_fails(tmp_path, f"task.data_dir={data}")
    assert line == (f"error: {data}/train.jsonl mixes row shapes: its rows are alpaca "
                    "(instruction + output), but row 3 is sharegpt conversations; keep one "
                    "shape per file, or rewrite those rows in the file's shape")


def test_alpaca_rows_without_an_output_are_left_out_and_named(tmp_path, tok) -> None:
    """As a prompt/response row without a response: left out with one line naming them."""
    rows = ASK[:1] + [{**ASK[1], "output": ""}, {**ASK[2], "output": None}] + ASK[3:]
    data = _write(tmp_path / "d", rows, ASK)
    loaded = _task(f"task.data_dir={data}").load_data(tok)
    assert loaded.info["train_examples"] == 2 and loaded.info["train_left_out"] == 2
    assert loaded.notes == [f"left out 2 of the 4 rows of {data}/train.jsonl: rows 2, 3 have "
                            "no 'output' (missing, null or empty); the run uses the other 2"]


@pytest.mark.parametrize("conversation, message", [
    ([{"from": "human", "value": "Hi?"}, {"from": "observation", "value": "{}"},
      {"from": "gpt", "value": "Hi."}],
     "turn 2 is from 'observation'; sharegpt turns are read from human, gpt or system (user "
     "and assistant too; tool turns are not read); rewrite or drop the row"),
    ([{"from": "gpt", "value": "Hi."}, {"from": "human", "value": "Hi?"}],
     "a sharegpt conversation must end with a 'gpt' turn, the reply the model learns to "
     "write"),
    ([{"role": "user", "content": "Hi?"}],
     "sharegpt conversations must be a list of {\"from\": ..., \"value\": ...} objects, got "
     "\"{'role': 'user', 'content': 'Hi?'}\""),
])
def test_a_sharegpt_row_that_cannot_be_read_is_named(tmp_path, in_repo, conversation,
                                                     message) -> None:
    good = {"conversations": [{"from": "human", "value": "Hi?"}, {"from": "gpt", "value": "Hi."}]}
    data = _write(tmp_path / "d", [good, {"conversations": conversation}], [good])
    line = _train_fails(tmp_path, f"task.data_dir={data}", "task.format=sharegpt")
    assert line == f"error: {data}/train.jsonl row 2: {message}"


def test_alpaca_history_that_is_not_pairs_is_named(tmp_path, in_repo) -> None:
    rows = [{**ASK[0], "history": []}, {**ASK[1], "history": [["What is 0 plus one?"]]}]
    data = _write(tmp_path / "d", rows, ASK[:1])
    line = _train_fails(tmp_path, f"task.data_dir={data}")
    assert line == (f"error: {data}/train.jsonl row 2: alpaca history must be a list of "
                    "[instruction, output] pairs of texts, got \"['What is 0 plus one?']\"")


def test_a_system_prompt_with_prompt_response_rows_is_refused(tmp_path, in_repo) -> None:
    line = _train_fails(tmp_path, "task.system_prompt=Be brief.")
    assert line == ("error: tests/fixtures/causal_lm/qa/train.jsonl holds prompt + response "
                    "rows, which are used verbatim with no place for task.system_prompt; put "
                    "the system text into the prompts (and drop task.system_prompt), or give "
                    "the rows as chats (messages, alpaca or sharegpt)")


# ------------------------------------------------------------------ the CPU recipe


def test_the_recipe_is_the_llm_demos_model_and_schedule() -> None:
    recipe = load_config(RECIPE)
    demo = load_config(ROOT / "configs/demo/smollm2_bbc_topic.yaml")
    assert recipe.task.name == "causal_lm" and recipe.task.system_prompt is None
    assert recipe.model == demo.model
    assert (recipe.method, recipe.adalora, recipe.lora, recipe.train) == \
        (demo.method, demo.adalora, demo.lora, demo.train)


@pytest.mark.parametrize("folder, reply", [(ALPACA, lambda r: r["output"]),
                                           (SHAREGPT, lambda r: r["conversations"][-1]["value"])])
def test_the_recipe_trains_on_your_chats(tmp_path, in_repo, folder, reply) -> None:
    """The recipe as shipped, but on the tiny Llama: its 14 matrices hold b0 = 56, so the
    budget and schedule shrink with the steps."""
    run = tmp_path / "run"
    result = runner.invoke(app, [
        "train", str(RECIPE), f"task.data_dir={folder}", f"model.name_or_path={LLAMA}",
        "adalora.budget=28", "train.max_steps=4", "adalora.t_init=1", "adalora.delta_t=1",
        "adalora.t_final=1", "train.warmup_steps=1", "train.precision=fp32",
        "--run-dir", str(run), "-q"])
    assert result.exit_code == 0, result.output
    summary = json.loads((run / "summary.json").read_text())
    assert (summary["data"]["train_examples"], summary["data"]["validation_examples"]) == (48, 8)
    predictions = [json.loads(line) for line in
                   (run / "predictions.jsonl").read_text().splitlines()]
    assert sorted(p["reference"] for p in predictions) == \
        sorted(reply(r) for r in _rows(folder))
    metrics = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    scored = [m for m in metrics if m.get("split") == "validation" and "exact_match" in m]
    assert [m["step"] for m in scored] == [0, 4]  # the base model first, as in the demo


# ------------------------------------------------------------------------ predict


@pytest.mark.parametrize("folder", [ALPACA, SHAREGPT, FIXTURES / "causal_lm/chat"])
def test_predict_asks_a_validation_row_what_evaluation_asked(tmp_path, tok, monkeypatch,
                                                             folder) -> None:
    """A chat's closing reply (an assistant or gpt turn, an alpaca output) is left out: the
    prompts are the evaluation's own prompt_ids, row for row (the file read as predict reads
    its --input)."""
    task = _task(f"task.data_dir={folder}")
    asked = task.load_data(tok).eval_splits["validation"]["prompt_ids"]
    seen = {}

    def generate(model, prompts, **kwargs):
        seen["prompts"] = prompts
        return ["x"] * len(prompts)

    monkeypatch.setattr(task, "generate", generate)
    rows = read_table(folder / "validation.jsonl")
    task.predict_columns(rows.column_names, "--input f")
    assert task.predict_rows(None, tok, rows, "cpu") == [{"response": "x"}] * 8
    assert seen["prompts"] == asked
    # the same questions without their answers ask the same
    if folder == ALPACA:
        bare = [{k: v for k, v in r.items() if k != "output"} for r in _rows(folder)]
    else:
        column = "conversations" if folder == SHAREGPT else "messages"
        bare = [{**r, column: r[column][:-1]} for r in _rows(folder)]
    (tmp_path / "bare.jsonl").write_text("".join(json.dumps(r) + "\n" for r in bare))
    task.predict_rows(None, tok, read_table(tmp_path / "bare.jsonl"), "cpu")
    assert seen["prompts"] == asked


def test_predict_refuses_a_chat_without_a_user_turn(tok) -> None:
    rows = datasets.Dataset.from_dict({"conversations": [[{"from": "gpt", "value": "Hi."}]]})
    with pytest.raises(ConfigError) as err:
        _task().predict_rows(None, tok, rows, "cpu")
    assert str(err.value) == ("the input: a chat to answer needs a user turn (sharegpt: "
                              "human), got '[]'")


def test_predict_reads_alpaca_and_sharegpt_files(smoke_runs, tmp_path, in_repo) -> None:
    run = smoke_runs(str(SMOKE), "method.name=lora", "train.max_steps=2")
    for folder in (ALPACA, SHAREGPT):
        out = tmp_path / f"{folder.name}.jsonl"
        result = runner.invoke(app, ["predict", str(run), "-i", str(folder / "validation.jsonl"),
                                     "-o", str(out), "-q"])
        assert result.exit_code == 0, result.output
        rows = [json.loads(line) for line in out.read_text().splitlines()]
        assert len(rows) == 8 and all(isinstance(r["response"], str) for r in rows)
    given = tmp_path / "bad.jsonl"
    given.write_text(json.dumps({"question": "Which river runs through Ivel?"}) + "\n")
    result = runner.invoke(app, ["predict", str(run), "-i", str(given), "-o",
                                 str(tmp_path / "no.jsonl"), "-q"])
    assert result.exit_code == 2
    assert result.output.strip() == (
        f"error: --input {given} has no 'prompt' (or 'messages', sharegpt's 'conversations', "
        "alpaca's 'instruction', 'text') column; it has question")
