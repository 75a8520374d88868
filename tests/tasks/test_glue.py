"""GLUE tasks on the committed fixtures and the tiny BERT: columns, labels, encoding, scores."""

import contextlib
import json
from pathlib import Path

import datasets
import numpy as np
import pandas as pd
import pytest
import torch
from scipy import stats
from sklearn.metrics import accuracy_score, f1_score, matthews_corrcoef
from torch.utils.data import DataLoader

from adalora_cli.config import ConfigError, from_dict
from adalora_cli.tasks import TASKS, get_task

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
TINY_BERT = str(FIXTURES / "tiny-bert")
CPU = torch.device("cpu")

# Independent statement of the hub (nyu-mll/glue) layout: text columns, label order, splits.
HUB = {
    "cola": (["sentence"], ["unacceptable", "acceptable"], ["validation"]),
    "sst2": (["sentence"], ["negative", "positive"], ["validation"]),
    "mrpc": (["sentence1", "sentence2"], ["not_equivalent", "equivalent"], ["validation"]),
    "qqp": (["question1", "question2"], ["not_duplicate", "duplicate"], ["validation"]),
    "stsb": (["sentence1", "sentence2"], [], ["validation"]),
    "mnli": (["premise", "hypothesis"], ["entailment", "neutral", "contradiction"],
             ["validation_matched", "validation_mismatched"]),
    "qnli": (["question", "sentence"], ["entailment", "not_entailment"], ["validation"]),
    "rte": (["sentence1", "sentence2"], ["entailment", "not_entailment"], ["validation"]),
}
METRIC_KEYS = {"cola": ["matthews"], "sst2": ["accuracy"], "mrpc": ["accuracy", "f1"],
               "qqp": ["accuracy", "f1"], "stsb": ["pearson", "spearman", "corr"],
               "mnli": ["accuracy"], "qnli": ["accuracy"], "rte": ["accuracy"]}


def make_cfg(name, **task):
    task.setdefault("data_dir", str(FIXTURES / "glue" / name))
    return from_dict({"task": {"name": name, **task}, "model": {"name_or_path": TINY_BERT}})


def read_fixture(name, split):
    """The fixture file read directly with pandas, as a reference."""
    path = next((FIXTURES / "glue" / name).glob(f"{split}.*"))
    if path.suffix == ".tsv":
        return pd.read_csv(path, sep="\t", quoting=3, na_filter=False)
    if path.suffix == ".csv":
        return pd.read_csv(path)
    if path.suffix == ".parquet":
        return pd.read_parquet(path)
    if path.suffix == ".json":
        return pd.DataFrame(json.loads(path.read_text()))
    return pd.read_json(path, lines=True)


@pytest.fixture(autouse=True, scope="module")
def one_thread():
    """The tiny model's ops are too small to split; extra threads only spin (10x slower
    on a busy 2-core machine)."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="module")
def tokenizer():
    return get_task(make_cfg("rte")).build_model()[1]


def test_every_glue_task_and_the_demo_are_registered():
    assert set(HUB) | {"rotten_tomatoes"} <= set(TASKS)


def test_unknown_task_lists_valid_names():
    with pytest.raises(ConfigError, match="unknown task.name 'rtee'.*cola.*rte.*rotten_tomatoes"):
        get_task(from_dict({"task": {"name": "rtee"}}))


@pytest.mark.parametrize("name", list(HUB))
def test_task_facts_need_no_data(name):
    task = get_task(from_dict({"task": {"name": name, "data_dir": "/nonexistent"}}))
    _, label_names, eval_splits = HUB[name]
    assert task.num_labels == (len(label_names) or 1)
    assert tuple(task.eval_split_names) == tuple(eval_splits)
    assert task.primary_metric in METRIC_KEYS[name]


@pytest.mark.parametrize("name", list(HUB))
def test_fixture_loads_with_hub_columns_and_label_ids(name, tokenizer):
    columns, label_names, eval_splits = HUB[name]
    task = get_task(make_cfg(name))
    data = task.load_data(tokenizer)
    assert set(data.eval_splits) == set(eval_splits)
    for split, ds in [("train", data.train), *data.eval_splits.items()]:
        ref = read_fixture(name, split)
        assert len(ds) == len(ref) == data.info[f"{split}_examples"]
        expected = [label_names.index(v) if isinstance(v, str) else v for v in ref["label"]]
        assert ds["labels"] == pytest.approx(expected)
        # The first row's text survives encoding: decode it back.
        text = tokenizer.decode(ds[0]["input_ids"], skip_special_tokens=True)
        assert text.split()[:3] == str(ref[columns[0]][0]).lower().split()[:3]
        assert {"input_ids", "attention_mask", "labels"} <= set(ds.column_names)


@pytest.mark.parametrize("name", list(HUB))
def test_pairs_are_encoded_as_two_segments(name, tokenizer):
    columns = HUB[name][0]
    ds = get_task(make_cfg(name, max_eval_samples=4)).load_data(tokenizer).eval_splits
    item = next(iter(ds.values()))[0]
    segments = sorted(set(item["token_type_ids"]))
    assert segments == ([0, 1] if len(columns) == 2 else [0])
    assert item["input_ids"].count(tokenizer.sep_token_id) == len(columns)


def test_pair_truncation_is_longest_first(tmp_path, tokenizer):
    long, short = " ".join(["film"] * 40), "the cat"
    pd.DataFrame({"sentence1": [long], "sentence2": [short], "label": ["entailment"]}).to_csv(
        tmp_path / "train.csv", index=False)
    pd.DataFrame({"sentence1": [short], "sentence2": [long], "label": [1]}).to_csv(
        tmp_path / "validation.csv", index=False)
    data = get_task(make_cfg("rte", data_dir=str(tmp_path), max_length=16)).load_data(tokenizer)
    for ds in (data.train, data.eval_splits["validation"]):
        ids = ds[0]["input_ids"]
        assert len(ids) == 16
        # The short sentence is kept whole; only the long one lost tokens.
        assert tokenizer.decode(ids).count("the cat") == 1


def test_label_names_ids_and_unlabeled_rows(tmp_path, tokenizer):
    rows = {"premise": ["a", "b", "c", "d", "e"], "hypothesis": ["f"] * 5,
            "label": ["Contradiction", "neutral", "-1", "2", ""]}
    pd.DataFrame(rows).to_csv(tmp_path / "train.tsv", sep="\t", index=False)
    for split in ("validation_matched", "validation_mismatched"):
        pd.DataFrame({"premise": ["x"] * 3, "hypothesis": ["y"] * 3, "label": [0, -1, 1]}
                     ).to_json(tmp_path / f"{split}.jsonl", orient="records", lines=True)
    data = get_task(make_cfg("mnli", data_dir=str(tmp_path))).load_data(tokenizer)
    assert data.train["labels"] == [2, 1, 2]
    assert data.info["train_unlabeled_dropped"] == 2
    assert data.eval_splits["validation_matched"]["labels"] == [0, 1]


def test_unknown_label_name_names_file_and_choices(tmp_path, tokenizer):
    for split in ("train", "validation"):
        pd.DataFrame({"sentence": ["good"], "label": ["happy"]}).to_csv(
            tmp_path / f"{split}.csv", index=False)
    with pytest.raises(ConfigError, match="train.csv: label 'happy' is not one of negative"):
        get_task(make_cfg("sst2", data_dir=str(tmp_path))).load_data(tokenizer)


def test_regression_labels_must_be_numbers(tmp_path, tokenizer):
    for split in ("train", "validation"):
        pd.DataFrame({"sentence1": ["a"], "sentence2": ["b"], "label": ["high"]}).to_csv(
            tmp_path / f"{split}.csv", index=False)
    with pytest.raises(ConfigError, match="train.csv: stsb labels must be numbers"):
        get_task(make_cfg("stsb", data_dir=str(tmp_path))).load_data(tokenizer)


def test_missing_column_and_missing_split_are_config_errors(tmp_path, tokenizer):
    pd.DataFrame({"text": ["good"], "label": [1]}).to_csv(tmp_path / "train.csv", index=False)
    with pytest.raises(ConfigError, match=f"no validation.* in {tmp_path}"):
        get_task(make_cfg("sst2", data_dir=str(tmp_path))).load_data(tokenizer)
    (tmp_path / "validation.csv").write_text((tmp_path / "train.csv").read_text())
    with pytest.raises(ConfigError, match="train.csv lacks column 'sentence'"):
        get_task(make_cfg("sst2", data_dir=str(tmp_path))).load_data(tokenizer)


def test_sample_limits_take_the_first_rows(tokenizer):
    data = get_task(make_cfg("rte", max_train_samples=10, max_eval_samples=5)
                    ).load_data(tokenizer)
    assert (len(data.train), len(data.eval_splits["validation"])) == (10, 5)


def test_hub_source_is_nyu_mll_glue(monkeypatch, tokenizer):
    features = datasets.Features({"sentence1": datasets.Value("string"),
                                  "sentence2": datasets.Value("string"),
                                  "label": datasets.ClassLabel(names=HUB["rte"][1]),
                                  "idx": datasets.Value("int32")})
    rows = {"sentence1": ["a cat", "a dog"], "sentence2": ["a cat", "a car"],
            "label": [0, 1], "idx": [0, 1]}
    hub = datasets.DatasetDict({s: datasets.Dataset.from_dict(rows, features=features)
                                for s in ("train", "validation", "test")})
    calls = []
    monkeypatch.setattr(datasets, "load_dataset", lambda *a: calls.append(a) or hub)
    data = get_task(make_cfg("rte", data_dir=None)).load_data(tokenizer)
    assert calls == [("nyu-mll/glue", "rte")]
    assert data.train["labels"] == [0, 1]
    assert data.info["validation_source"] == "hub nyu-mll/glue/rte split validation"


def test_stsb_is_regression_with_correlation_metrics(tokenizer):
    task = get_task(make_cfg("stsb"))
    model, _ = task.build_model()
    assert model.config.problem_type == "regression" and model.config.num_labels == 1
    data = task.load_data(tokenizer)
    batch = data.collate([data.train[i] for i in range(3)])
    assert batch["labels"].dtype == torch.float32
    assert model(**batch).logits.shape == (3, 1)
    logits = np.array([[0.5], [2.0], [1.0], [4.0]])
    labels = np.array([1.0, 3.0, 2.5, 4.5])
    out = task.compute_metrics(logits, labels)
    assert list(out) == ["pearson", "spearman", "corr"]
    assert out["spearman"] == pytest.approx(1.0)
    assert out["corr"] == pytest.approx((out["pearson"] + 1.0) / 2)


@pytest.mark.parametrize("name", list(HUB))
def test_evaluate_matches_a_manual_computation(name):
    torch.manual_seed(0)
    task = get_task(make_cfg(name))
    model, tokenizer = task.build_model()
    model.train()
    data = task.load_data(tokenizer)
    split, ds = next(iter(data.eval_splits.items()))
    out = task.evaluate(model, split, ds, batch_size=7, collate=data.collate, device=CPU,
                        autocast=contextlib.nullcontext)
    assert model.training  # train mode restored
    assert list(out) == METRIC_KEYS[name] and task.primary_metric in out
    model.eval()
    with torch.no_grad():
        batch = data.collate([ds[i] for i in range(len(ds))])
        logits = model(**batch).logits.numpy()
    y = batch["labels"].numpy()
    if name == "stsb":
        expected = {"pearson": stats.pearsonr(logits[:, 0], y)[0],
                    "spearman": stats.spearmanr(logits[:, 0], y)[0]}
        expected["corr"] = (expected["pearson"] + expected["spearman"]) / 2
    else:
        pred = logits.argmax(-1)
        reference = {"accuracy": lambda: accuracy_score(y, pred),
                     "f1": lambda: f1_score(y, pred, zero_division=0),
                     "matthews": lambda: matthews_corrcoef(y, pred)}
        expected = {k: reference[k]() for k in out}
    assert out == pytest.approx({k: expected[k] for k in out}, abs=1e-5)


def test_missing_model_folder_is_config_error(tmp_path):
    cfg = from_dict({"task": {"name": "rte"}, "model": {"name_or_path": str(tmp_path / "m")}})
    with pytest.raises(ConfigError, match="could not load model .*model.name_or_path"):
        get_task(cfg).build_model()


def test_tiny_model_learns_sst2_fixture():
    torch.manual_seed(0)
    task = get_task(make_cfg("sst2"))
    model, tokenizer = task.build_model()
    data = task.load_data(tokenizer)
    val = data.eval_splits["validation"]
    def evaluate() -> float:
        return task.evaluate(model, "validation", val, batch_size=32, collate=data.collate,
                             device=CPU, autocast=contextlib.nullcontext)["accuracy"]

    before = evaluate()
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    loader = DataLoader(data.train, batch_size=16, shuffle=True, collate_fn=data.collate,
                        generator=torch.Generator().manual_seed(0))
    for _ in range(15):
        for batch in loader:
            model(**batch).loss.backward()
            opt.step()
            opt.zero_grad()
    assert before < 0.7 and evaluate() >= 0.9
