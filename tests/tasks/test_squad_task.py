"""The SQuAD task: both local formats and the hub load the same rows, one-line errors for
what a user can fix, the shipped configs carry the pinned values
(docs/maths.md#task-hyperparameters), and every method trains a QA
head on BERT and DeBERTa-v2."""

import contextlib
import json
from pathlib import Path

import datasets
import pandas as pd
import pytest
import torch

from adalora_cli.config import ConfigError, from_dict, load_config
from adalora_cli.methods import apply_method
from adalora_cli.tasks import TASKS, get_task
from adalora_cli.tasks.squad import read_local

ROOT = Path(__file__).resolve().parents[2]
FIXTURES = ROOT / "tests" / "fixtures"
SQUAD = FIXTURES / "squad"
TINY_BERT = str(FIXTURES / "tiny-bert")


def make_cfg(name="squad_v2", **task):
    task = {"name": name, "data_dir": str(SQUAD / name[-2:]), "max_length": 64,
            "doc_stride": 16, **task}
    return from_dict({"task": task, "model": {"name_or_path": TINY_BERT}})


def flat(examples):
    return [(e.id, e.title, e.question, e.context, e.answers, e.answer_starts)
            for e in examples]


def test_registered():
    assert {"squad_v1", "squad_v2"} <= set(TASKS)


def test_official_json_and_flat_columns_load_the_same_rows():
    official = read_local(SQUAD / "v2" / "dev-v2.0.json")
    hub_columns = read_local(SQUAD / "v2" / "validation.jsonl")
    assert flat(official) == flat(hub_columns)
    assert len(official) == 24 and sum(not e.answers for e in official) == 8
    for e in official:  # fixtures are self-consistent: each start points at its text
        for text, start in zip(e.answers, e.answer_starts):
            assert e.context[start:start + len(text)] == text


def test_official_v2_plausible_answers_are_not_gold():
    doc = json.loads((SQUAD / "v2" / "train.json").read_text())
    raw = {qa["id"]: qa for a in doc["data"] for p in a["paragraphs"] for qa in p["qas"]}
    examples = read_local(SQUAD / "v2" / "train.json")
    assert len(examples) == len(raw) == 72
    for e in examples:
        qa = raw[e.id]
        if qa["is_impossible"]:
            assert qa["plausible_answers"] and e.answers == () and e.answer_starts == ()
        else:
            assert e.answers == tuple(a["text"] for a in qa["answers"])


def test_v1_official_json_keeps_every_gold_answer():
    examples = read_local(SQUAD / "v1" / "validation.json")
    assert len(examples) == 16 and all(len(e.answers) == 3 for e in examples)


def test_hub_columns_from_the_hub(monkeypatch):
    rows = pd.read_json(SQUAD / "v2" / "validation.jsonl", lines=True)
    calls = []

    def fake_load_dataset(name, config=None, **kwargs):
        calls.append((name, config))
        ds = datasets.Dataset.from_pandas(rows)
        return datasets.DatasetDict({"train": ds, "validation": ds})

    monkeypatch.setattr(datasets, "load_dataset", fake_load_dataset)
    task = get_task(from_dict({"task": {"name": "squad_v2", "max_length": 384}}))
    loaded = task.load_examples()
    assert calls == [("rajpurkar/squad_v2", None)]
    assert flat(loaded["validation"]) == flat(read_local(SQUAD / "v2" / "dev-v2.0.json"))
    get_task(from_dict({"task": {"name": "squad_v1", "max_length": 384}})).load_examples()
    assert calls[-1] == ("rajpurkar/squad", None)


def test_csv_with_answers_as_json_strings(tmp_path):
    rows = pd.read_json(SQUAD / "v1" / "train.jsonl", lines=True)
    rows["answers"] = rows["answers"].map(json.dumps)
    rows.to_csv(tmp_path / "train.csv", index=False)
    assert flat(read_local(tmp_path / "train.csv")) == flat(read_local(SQUAD / "v1" /
                                                                        "train.jsonl"))


def test_missing_column_is_one_line(tmp_path):
    rows = pd.read_json(SQUAD / "v1" / "train.jsonl", lines=True).drop(columns=["question"])
    rows.to_json(tmp_path / "train.jsonl", orient="records", lines=True)
    with pytest.raises(ConfigError, match="lacks column 'question'.*id, context, question, "
                                          "answers") as err:
        read_local(tmp_path / "train.jsonl")
    assert "\n" not in str(err.value)


@pytest.mark.parametrize("task, message", [
    ({"doc_stride": 64}, "task.doc_stride=64 must lie in.*set task.max_length=384"),
    ({"doc_stride": 200, "max_length": 128}, "task.doc_stride=200"),
    ({"n_best": 0}, "task.n_best"),
    ({"max_answer_length": 0}, "task.max_answer_length"),
    ({"data_files": {"train": "nope.json"}}, "no entry for split validation"),
    ({"data_files": {"train": "nope.json", "validation": "nope.json"}}, "nope.json"),
])
def test_bad_settings_are_config_errors(task, message):
    with pytest.raises(ConfigError, match=message):
        get_task(make_cfg(**task)).load_examples()


def test_v1_refuses_unanswerable_validation_questions():
    cfg = make_cfg("squad_v1", data_dir=str(SQUAD / "v2"))
    task = get_task(cfg)
    _, tokenizer = task.build_model()
    with pytest.raises(ConfigError, match="unanswerable question .* task.name=squad_v2"):
        task.load_data(tokenizer)


def test_slow_tokenizer_is_refused(monkeypatch):
    import transformers

    class SlowTokenizer:
        is_fast = False

    monkeypatch.setattr(transformers.AutoTokenizer, "from_pretrained",
                        lambda *a, **k: SlowTokenizer())
    with pytest.raises(ConfigError, match="needs a fast tokenizer.*SlowTokenizer"):
        get_task(make_cfg()).build_model()


def test_evaluate_returns_floats_and_saves_predictions(tmp_path):
    task = get_task(make_cfg(max_eval_samples=7))
    model, tokenizer = task.build_model()
    data = task.load_data(tokenizer)
    metrics = task.evaluate(model, "validation", data.eval_splits["validation"], batch_size=16,
                            collate=data.collate, device=torch.device("cpu"),
                            autocast=contextlib.nullcontext)
    assert all(type(v) is float for v in metrics.values())
    assert {"exact_match", "f1", "HasAns_exact", "HasAns_f1", "HasAns_total"} <= set(metrics)
    (path,) = task.save_predictions(tmp_path)
    assert path == tmp_path / "predictions.json"
    predictions = json.loads(path.read_text())
    ids = [json.loads(line)["id"] for line in (SQUAD / "v2" / "validation.jsonl").open()][:7]
    assert list(predictions) == ids and all(isinstance(v, str) for v in predictions.values())


# docs/maths.md#task-hyperparameters: lr, batch, epochs, gamma, t_i, delta_t, t_f
SQUAD_TABLE = {"squad_v1": (1e-3, 16, 10, 0.1, 5000, 100, 25000),
               "squad_v2": (1e-3, 16, 12, 0.1, 5000, 100, 50000)}


@pytest.mark.parametrize("name", sorted(SQUAD_TABLE))
def test_configs_carry_spec_values(name):
    path = ROOT / "configs" / "squad" / f"{name}.yaml"
    cfg = load_config(path)
    lr, batch, epochs, gamma, t_i, delta_t, t_f = SQUAD_TABLE[name]
    a, t, task = cfg.adalora, cfg.train, cfg.task
    assert (t.learning_rate, t.batch_size, t.epochs) == (lr, batch, epochs)
    assert (a.gamma, a.t_init, a.delta_t, a.t_final) == (gamma, t_i, delta_t, t_f)
    assert (a.alpha, a.beta1, a.beta2) == (16, 0.85, 0.85)
    # Table 9's smallest budget: b(T) 72 = rbar 1 on 72 matrices -> r0 2, LoRA r 1, d 4
    assert (a.budget, a.init_rank, cfg.lora.r, cfg.adapter.dim) == (72, 2, 1, 4)
    assert (task.name, task.max_length, task.doc_stride) == (name, 384, 128)
    assert (task.n_best, task.max_answer_length, task.null_score_threshold) == (20, 30, 0.0)
    assert cfg.model.name_or_path == "microsoft/deberta-v3-base"
    assert "Table 2" in path.read_text().splitlines()[0]


def tiny_deberta_qa():
    from transformers import DebertaV2Config, DebertaV2ForQuestionAnswering

    torch.manual_seed(0)
    config = DebertaV2Config(vocab_size=100, hidden_size=32, num_hidden_layers=2,
                             num_attention_heads=4, intermediate_size=37,
                             max_position_embeddings=64, type_vocab_size=0,
                             relative_attention=True, pos_att_type=["p2c", "c2p"])
    return DebertaV2ForQuestionAnswering(config)


@pytest.mark.parametrize("method", ["adalora", "lora", "houlsby", "pfeiffer", "bitfit", "full"])
@pytest.mark.parametrize("backbone", ["bert", "deberta-v2"])
def test_every_method_trains_the_qa_head(method, backbone):
    cfg = from_dict({"task": {"name": "squad_v2", "max_length": 64, "doc_stride": 16},
                     "model": {"name_or_path": TINY_BERT}, "method": {"name": method},
                     "adalora": {"init_rank": 2, "budget": 8, "t_final": 2}})
    if backbone == "bert":
        model, _ = get_task(cfg).build_model()
    else:
        model = tiny_deberta_qa()
    handle = apply_method(model, cfg, 10)
    head = {id(p) for p in model.qa_outputs.parameters()}
    trainable = {id(p) for p in handle.trainable}
    assert head <= trainable
    if method == "full":
        assert handle.head == [] or head <= {id(p) for p in handle.head}
    else:
        assert head == {id(p) for p in handle.head}
        assert 0 < handle.adapter_params < sum(p.numel() for p in model.parameters()) / 2
    ids = torch.randint(5, 90, (2, 12))
    out = model(input_ids=ids, attention_mask=torch.ones_like(ids),
                start_positions=torch.tensor([0, 3]), end_positions=torch.tensor([0, 5]))
    out.loss.backward()
    assert model.qa_outputs.weight.grad is not None
    assert out.start_logits.shape == out.end_logits.shape == (2, 12)
