"""The classification task (your own labels): labels read from the data, the head sized from
them, numeric labels making a regressor, and every refusal one line.

The expected labels, ids and targets are read from the fixture CSVs with the ``csv``
module here, independently of the task's pandas/datasets path.
"""

from __future__ import annotations

import csv
import dataclasses
import re
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

from adalora_cli.cli import app
from adalora_cli.config import ConfigError, load_config
from adalora_cli.engine.build import resolve_resources
from adalora_cli.tasks import get_task, metrics
from adalora_cli.tasks.classification import infer_labels
from adalora_cli.tasks.columns import task_report
from tests.conftest import FIXTURES, ROOT

CLASSIFIER = "configs/smoke/classification.yaml"
REGRESSOR = "configs/smoke/regression.yaml"
TICKETS = FIXTURES / "classification" / "tickets"
SIMILARITY = FIXTURES / "classification" / "similarity"


def rows(path: Path) -> list[dict[str, str]]:
    with path.open(newline="", encoding="utf-8") as handle:
        return list(csv.DictReader(handle))


def task_of(config: str, *overrides: str):
    return get_task(resolve_resources(load_config(ROOT / config, list(overrides))))


def invoke(*args: str):
    with pytest.MonkeyPatch.context() as mp:
        mp.chdir(ROOT)
        return CliRunner().invoke(app, [str(a) for a in args])


def one_error_line(result) -> str:
    """The one error line of a refused command (exit 2, no traceback); a start header may
    come before it."""
    errors = [line for line in result.output.splitlines() if line.startswith("error:")]
    assert result.exit_code == 2 and "Traceback" not in result.output, result.output
    assert len(errors) == 1 and result.output.rstrip().endswith(errors[0]), result.output
    return errors[0]


# ------------------------------------------------------------------------- inference


def test_names_are_sorted_and_integer_ids_sort_as_numbers():
    assert infer_labels(["shipping", " billing", "technical", "billing", ""], "f", "label",
                        None) == ("billing", "shipping", "technical")
    assert infer_labels([2, 10, 1, 2], "f", "label", None) == ("1", "2", "10")
    assert infer_labels(["2", "10", "1", None], "f", "label", None) == ("1", "2", "10")
    assert infer_labels([True, False], "f", "label", None) == ("false", "true")


def test_a_decimal_point_means_regression_unless_told_otherwise():
    assert infer_labels([0.5, 1.0, 3.25], "f", "label", None) is None
    assert infer_labels(["0.5", "1", "", "2e-1"], "f", "label", None) is None
    assert infer_labels([1, 2, 3], "f", "label", True) is None  # star ratings as a regressor
    assert infer_labels([0.5, 1.5, 0.5], "f", "label", False) == ("0.5", "1.5")


@pytest.mark.parametrize("values, regression, message", [
    (["billing", "billing", ""], None, "has one label only ('billing' in column 'label')"),
    ([0.5, 0.5], None, "every label in column 'label' is 0.5"),
    (["billing", "0.5"], None, "mixes numbers ('0.5') and names ('billing')"),
    (["billing", 3], None, "mixes numbers (3) and names ('billing')"),
    (["billing", "shipping"], True, "task.regression=true needs numeric labels"),
    (["", None], None, "has no labels in column 'label'"),
])
def test_labels_that_cannot_train_are_one_line(values, regression, message):
    with pytest.raises(ConfigError, match=f"^f.*{re.escape(message)}"):
        infer_labels(values, "f", "label", regression)


# ------------------------------------------------------------------------- the task on a CSV


def test_the_head_is_sized_and_named_from_the_training_labels():
    train, validation = rows(TICKETS / "train.csv"), rows(TICKETS / "validation.csv")
    names = sorted({r["label"] for r in train})
    assert names == ["billing", "shipping", "technical"]  # the fixture's three classes
    task = task_of(CLASSIFIER)
    assert task.spec.label_names == tuple(names) and task.num_labels == 3
    model, tokenizer = task.build_model()
    assert model.config.num_labels == 3 and model.classifier.out_features == 3
    assert model.config.id2label == dict(enumerate(names))
    assert model.config.problem_type == "single_label_classification"
    data = task.load_data(tokenizer)
    assert list(data.train["labels"]) == [names.index(r["label"]) for r in train]
    assert list(data.eval_splits["validation"]["labels"]) == [
        names.index(r["label"]) for r in validation]
    assert data.info["labels"] == names and data.info["regression"] is False
    # the run records what it read, so config.yaml alone rebuilds this head
    cfg = load_config(ROOT / CLASSIFIER)
    recorded = task.recorded(cfg)
    assert (recorded.task.labels, recorded.task.regression) == (names, False)
    assert dataclasses.replace(recorded, task=cfg.task) == cfg  # nothing else changes


def test_a_recorded_config_builds_the_head_without_reading_the_data(tmp_path):
    task = task_of(CLASSIFIER, f"task.data_dir={tmp_path / 'gone'}",
                   "task.labels=[technical, shipping, billing]")
    model, _ = task.build_model()  # no data folder: the names come from the config
    assert model.config.id2label == {0: "technical", 1: "shipping", 2: "billing"}
    regressor = task_of(REGRESSOR, f"task.data_dir={tmp_path / 'gone'}", "task.regression=true")
    assert regressor.build_model()[0].config.num_labels == 1


def test_task_labels_fix_the_order_and_refuse_a_class_they_lack():
    train = rows(TICKETS / "train.csv")
    order = ["technical", "shipping", "billing"]
    task = task_of(CLASSIFIER, f"task.labels=[{', '.join(order)}]")
    model, tokenizer = task.build_model()
    data = task.load_data(tokenizer)
    assert list(data.train["labels"]) == [order.index(r["label"]) for r in train]
    short = task_of(CLASSIFIER, "task.labels=[technical, shipping]")
    with pytest.raises(ConfigError, match=r"train\.csv: label 'billing' is not one of the "
                                          r"classes in task\.labels \(technical, shipping\)"):
        short.load_data(tokenizer)


def test_a_hub_class_label_keeps_its_names_and_order(monkeypatch):
    import datasets

    from adalora_cli.tasks import classification

    names = ["world", "sports", "business"]  # the dataset's order, not sorted
    features = datasets.Features({"text": datasets.Value("string"),
                                  "label": datasets.ClassLabel(names=names)})
    hub = {"train": datasets.Dataset.from_dict({"text": ["a", "b", "c", "d"],
                                                "label": [2, 0, 1, -1]}, features=features),
           "validation": datasets.Dataset.from_dict({"text": ["e", "f"], "label": [1, 1]},
                                                    features=features)}
    asked = []
    monkeypatch.setattr(classification.rawdata, "load_splits",
                        lambda task, splits, dataset: asked.append(dataset) or hub)
    task = task_of(CLASSIFIER, "task.data_dir=null", "task.dataset=someone/news")
    model, tokenizer = task.build_model()
    assert asked == ["someone/news"] and model.config.id2label == dict(enumerate(names))
    data = task.load_data(tokenizer)
    assert list(data.train["labels"]) == [2, 0, 1]  # -1: unlabelled, left out
    assert data.info["train_unlabeled_dropped"] == 1


def test_float_labels_on_pairs_train_a_regressor():
    train, validation = rows(SIMILARITY / "train.csv"), rows(SIMILARITY / "validation.csv")
    task = task_of(REGRESSOR)
    assert task.spec.is_regression and task.num_labels == 1
    assert task.spec.text_columns == ("sentence1", "sentence2")
    model, tokenizer = task.build_model()
    assert model.config.problem_type == "regression" and model.classifier.out_features == 1
    data = task.load_data(tokenizer)
    assert list(data.train["labels"]) == pytest.approx([float(r["similarity"]) for r in train])
    assert list(data.eval_splits["validation"]["labels"]) == pytest.approx(
        [float(r["similarity"]) for r in validation])
    first = data.train[0]  # a pair: two segments, the second with token type 1
    assert first["input_ids"] == tokenizer(train[0]["sentence1"], train[0]["sentence2"],
                                           truncation="longest_first",
                                           max_length=32)["input_ids"]
    assert set(first["token_type_ids"]) == {0, 1}
    assert task.recorded(load_config(ROOT / REGRESSOR)).task.regression is True


def test_negative_regression_labels_are_kept_and_blank_ones_left_out(tmp_path):
    for split in ("train", "validation"):
        (tmp_path / f"{split}.csv").write_text("text,score\na,-1.5\nb,\nc,2.25\nd,-0.5\n")
    task = task_of(REGRESSOR, f"task.data_dir={tmp_path}", "task.text_column=text",
                   "task.text_pair_column=null", "task.label_column=score")
    _, tokenizer = task.build_model()
    data = task.load_data(tokenizer)
    assert list(data.train["labels"]) == [-1.5, 2.25, -0.5]
    assert data.info["train_unlabeled_dropped"] == 1


def test_scores_and_report_columns():
    task = task_of(CLASSIFIER)

    logits = np.array([[2.0, 0, 0], [0, 2.0, 0], [0, 2.0, 0], [0, 0, 2.0]])
    labels = np.array([0, 1, 2, 2])  # predicted 0 1 1 2
    # per class F1: billing 1, shipping 2/3 (P 1/2, R 1), technical 2/3 (P 1, R 1/2)
    assert task.compute_metrics(logits, labels) == pytest.approx(
        {"accuracy": 0.75, "macro_f1": (1 + 2 / 3 + 2 / 3) / 3})
    report = task.report({})
    assert report.title == "classification (billing, shipping, technical)"
    assert [(c.label, c.metric, c.scale) for c in report.columns] == [
        ("Acc", "accuracy", 100), ("Macro-F1", "macro_f1", 100)]
    regressor = task_of(REGRESSOR)
    assert regressor.compute_metrics(np.array([[1.0], [2.0], [4.0]]), np.array([1.0, 3.0, 2.0])
                                     )["mse"] == pytest.approx((0 + 1 + 4) / 3)
    columns = regressor.report({}).columns
    assert [(c.metric, c.lower_is_better) for c in columns] == [
        ("pearson", False), ("spearman", False), ("mse", True)]
    assert metrics.mse([0.0, 1.0], [1.0, 1.0]) == 0.5


def test_scores_shown_without_the_run_s_report_keep_their_scale_and_direction():
    """``adalora report --eval NAME`` shows an eval's scores by the metric names alone."""
    shown = task_report("classification", {"validation": {"accuracy": 0.5, "macro_f1": 0.4,
                                                          "pearson": 0.1, "mse": 2.0}})
    assert [(c.metric, c.scale, c.lower_is_better) for c in shown.columns] == [
        ("accuracy", 100, False), ("macro_f1", 100, False), ("pearson", 100, False),
        ("mse", 1, True)]


# ------------------------------------------------------------------------- bad input


def bad_data(tmp_path: Path, train: str, validation: str, ext: str = "csv") -> Path:
    folder = tmp_path / "data"
    folder.mkdir()
    (folder / f"train.{ext}").write_text(train)
    (folder / "validation.csv").write_text(validation)
    return folder


@pytest.mark.parametrize("train, validation, ext, message", [
    ("text,label\na b,billing\nc d,billing\n", "text,label\na b,billing\n", "csv",
     r"train\.csv has one label only \('billing' in column 'label'\); a classifier needs "
     "two or more"),
    ("text,label\na b,billing\nc d,shipping\n", "text,label\na b,refunds\n", "csv",
     r"validation\.csv: label 'refunds' is not among the training split's labels "
     r"\(billing, shipping\)"),
    ("text,label\na b,billing\nc d,0.5\n", "text,label\na b,billing\n", "csv",
     r"train\.csv: label column 'label' mixes numbers \('0\.5'\) and names \('billing'\)"),
    ('{"text": "a b", "label": "billing"}\n{"text": "c d", "label": 0.5}\n',
     "text,label\na b,billing\n", "jsonl", r"train\.jsonl: a column mixes value types"),
    ("text,label\na b,0.5\nc d,1.5\n", "text,label\na b,high\n", "csv",
     r"validation\.csv: label 'high' is not a number, but this task is a regression"),
    ("text,category\na b,billing\nc d,shipping\n", "text,label\na b,billing\n", "csv",
     r"train\.csv lacks column 'label' \(it has text, category\); name the columns with "
     r"task\.text_column"),
])
@pytest.mark.parametrize("dry", [False, True])
def test_labels_that_cannot_train_stop_train_and_dry_run_in_one_line(
        tmp_path, train, validation, ext, message, dry):
    folder = bad_data(tmp_path, train, validation, ext)
    run = tmp_path / "run"
    line = one_error_line(invoke("train", CLASSIFIER, f"task.data_dir={folder}", "--run-dir",
                                 run, *(["--dry-run"] if dry else [])))
    assert re.search(message, line), line
    assert not run.exists()  # nothing half-written


@pytest.mark.parametrize("override, message", [
    ("task.labels=[billing]", "task.labels needs at least two class names, got 1"),
    ("task.labels=[billing, shipping, billing]", "task.labels names 'billing' twice"),
    ("task.labels=[a, '']", "task.labels holds an empty name"),
])
def test_task_labels_are_checked_as_the_config_loads(override, message):
    with pytest.raises(ConfigError, match=message):
        load_config(ROOT / CLASSIFIER, [override])
    with pytest.raises(ConfigError, match="task.labels names classes, but task.regression=true"):
        load_config(ROOT / CLASSIFIER, ["task.labels=[a, b]", "task.regression=true"])


def test_a_checkpoint_saved_before_the_classification_keys_still_resumes(tmp_path):
    """Every key this task added is unset by default, so a GLUE run's checkpoint written
    before them matches its config now: an upgrade must not strand a checkpoint."""
    from adalora_cli.engine import checkpoint as ckpt

    cfg = load_config(ROOT / "configs/smoke/glue.yaml")
    new = {"task.text_pair_column", "task.label_column", "task.labels", "task.regression"}
    before = {k: v for k, v in ckpt.flat_config(cfg).items() if k not in new}
    state = {"config": before, "config_digest": ckpt.resume_digest(before)}
    assert ckpt.check_config(tmp_path / "checkpoints" / "step-8", state, cfg) == {}
