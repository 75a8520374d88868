"""Your own labels through the commands a user runs: the 3-class ticket CSV and the
similarity regression CSV (configs/smoke/classification.yaml, regression.yaml) train,
record their labels, predict the class names, export to PEFT and reload there with PEFT and
transformers alone, and score again with ``adalora eval``. (tests/test_families.py takes
both configs through every command too: dry run, sweep, report, merged export.)

The run's own logits, to which predictions and exports are compared, come from
:func:`~adalora_cli.artifacts.load.load_run` and the tokenizer called here.
"""

from __future__ import annotations

import csv
import json
from pathlib import Path

import peft  # the `test` extra: the real library, offline
import pytest
import torch
import yaml
from safetensors.torch import load_file, save_file
from transformers import AutoConfig, AutoModelForSequenceClassification, AutoTokenizer
from typer.testing import CliRunner

from adalora_cli.artifacts.load import load_run
from adalora_cli.cli import app
from adalora_cli.rundir.summary import read_summary
from adalora_cli.sweep.plan import PlannedRun
from adalora_cli.sweep.runs import config_drift
from tests.conftest import FIXTURES, ROOT, copy_of

pytestmark = pytest.mark.filterwarnings("ignore:The following rank_pattern keys")

CLASSIFIER = "configs/smoke/classification.yaml"
REGRESSOR = "configs/smoke/regression.yaml"
TICKETS = FIXTURES / "classification" / "tickets"
NAMES = ["billing", "shipping", "technical"]
PAIRS = [("the cat sat on a red chair", "a red chair near the window"),
         ("the river by the old bridge", "people walked to the quiet city")]


def invoke(*args) -> str:
    with pytest.MonkeyPatch.context() as mp:
        mp.chdir(ROOT)
        result = CliRunner().invoke(app, [str(a) for a in args])
    assert result.exit_code == 0, result.output
    return result.output


def refused(*args) -> str:
    with pytest.MonkeyPatch.context() as mp:
        mp.chdir(ROOT)
        result = CliRunner().invoke(app, [str(a) for a in args])
    errors = [line for line in result.output.splitlines() if line.startswith("error:")]
    assert result.exit_code == 2 and "Traceback" not in result.output, result.output
    assert len(errors) == 1 and result.output.rstrip().endswith(errors[0]), result.output
    return errors[0]


def tickets(split: str) -> list[dict[str, str]]:
    with (TICKETS / f"{split}.csv").open(newline="") as handle:
        return list(csv.DictReader(handle))


@torch.no_grad()
def our_logits(run: Path, texts: list, pairs: bool = False) -> torch.Tensor:
    model, _, _ = load_run(run)
    tok = AutoTokenizer.from_pretrained(FIXTURES / "tiny-bert")
    batch = (tok([a for a, _ in texts], [b for _, b in texts], padding=True,
                 return_tensors="pt") if pairs else tok(texts, padding=True, return_tensors="pt"))
    return model.eval()(**batch).logits


def amplify(run: Path) -> None:
    """A larger Delta W of the same rank pattern (lam x 40, P and Q x 5), so an export that
    dropped or mis-scaled the adapter would move the logits by far more than the tolerance."""
    path = run / "adapter_model.safetensors"
    state = load_file(str(path))
    for name in state:
        factor = 40.0 if name.endswith(".lam") else 5.0 if name.endswith((".P", ".Q")) else 1.0
        state[name] = state[name] * factor
    save_file(state, str(path))


def test_the_run_records_its_labels_and_reports_them(smoke_runs):
    run = smoke_runs(CLASSIFIER)
    recorded = yaml.safe_load((run / "config.yaml").read_text())["task"]
    assert (recorded["labels"], recorded["regression"]) == (NAMES, False)
    summary = read_summary(run)
    assert summary.report.title == "classification (billing, shipping, technical)"
    assert set(summary.metrics["validation"]) == {"accuracy", "macro_f1"}
    regressor = yaml.safe_load((smoke_runs(REGRESSOR) / "config.yaml").read_text())["task"]
    assert (regressor["labels"], regressor["regression"]) == (None, True)


def test_predict_writes_the_run_s_class_names(smoke_runs, tmp_path):
    run = smoke_runs(CLASSIFIER)
    rows = tickets("validation")  # text and label columns: predict reads the text
    invoke("predict", run, "--input", TICKETS / "validation.csv", "--output",
           tmp_path / "out.jsonl", "-q")
    out = [json.loads(line) for line in (tmp_path / "out.jsonl").read_text().splitlines()]
    logits = our_logits(run, [r["text"] for r in rows])
    assert [o["label"] for o in out] == [NAMES[i] for i in logits.argmax(-1).tolist()]
    probs = logits.softmax(-1)
    for o, p in zip(out, probs):
        assert list(o["scores"]) == NAMES
        assert list(o["scores"].values()) == pytest.approx(p.tolist(), abs=1e-6)


def test_predict_writes_a_regressor_s_score(smoke_runs, tmp_path):
    run = smoke_runs(REGRESSOR)
    table = tmp_path / "pairs.jsonl"
    table.write_text("".join(json.dumps({"sentence1": a, "sentence2": b}) + "\n"
                             for a, b in PAIRS))
    invoke("predict", run, "--input", table, "--output", tmp_path / "out.jsonl", "-q")
    out = [json.loads(line) for line in (tmp_path / "out.jsonl").read_text().splitlines()]
    expected = our_logits(run, PAIRS, pairs=True)[:, 0].tolist()
    assert [o["score"] for o in out] == pytest.approx(expected, abs=1e-6)
    line = refused("predict", run, "--input", TICKETS / "validation.csv", "--output",
                   tmp_path / "no.jsonl")
    assert "lacks column 'sentence1'" in line and "task.text_pair_column" in line


@pytest.mark.parametrize("config", [CLASSIFIER, REGRESSOR])
def test_peft_export_reloads_with_peft_and_transformers_alone(smoke_runs, tmp_path, config):
    run = copy_of(smoke_runs(config), tmp_path / "run")
    amplify(run)
    invoke("export", run, tmp_path / "peft", "--format", "peft")
    folder = tmp_path / "peft"
    assert not (folder / "config.json").exists()  # transformers would take it for a model
    # what a user writes: the base with this run's head, then the adapter
    base_path = peft.PeftConfig.from_pretrained(folder).base_model_name_or_path
    head = AutoConfig.from_pretrained(folder / "base_config.json")
    base = AutoModelForSequenceClassification.from_pretrained(base_path, config=head)
    model = peft.PeftModel.from_pretrained(base, folder).eval()
    pairs = config == REGRESSOR
    texts = PAIRS if pairs else [r["text"] for r in tickets("validation")[:4]]
    tok = AutoTokenizer.from_pretrained(base_path)
    batch = (tok([a for a, _ in texts], [b for _, b in texts], padding=True,
                 return_tensors="pt") if pairs else tok(texts, padding=True, return_tensors="pt"))
    ours = our_logits(run, texts, pairs)
    with torch.no_grad():
        theirs = model(**batch).logits
        with model.disable_adapter():
            without = model(**batch).logits
    assert torch.allclose(theirs, ours, atol=1e-5, rtol=0)
    assert (without - ours).abs().max() > 1e-2  # the adapter is what makes them equal
    if pairs:
        assert (head.num_labels, head.problem_type) == (1, "regression")
    else:
        assert head.id2label == dict(enumerate(NAMES))
        assert [head.id2label[i] for i in theirs.argmax(-1).tolist()] == [
            NAMES[i] for i in ours.argmax(-1).tolist()]


def test_a_merged_export_names_the_classes(smoke_runs, tmp_path):
    invoke("export", smoke_runs(CLASSIFIER), tmp_path / "merged", "--format", "merged")
    merged = AutoModelForSequenceClassification.from_pretrained(tmp_path / "merged")
    assert merged.config.id2label == dict(enumerate(NAMES))


def test_eval_scores_again_and_refuses_labels_the_run_lacks(smoke_runs, tmp_path):
    run = copy_of(smoke_runs(CLASSIFIER), tmp_path / "run")
    invoke("eval", run, "-q")
    again = json.loads((run / "eval" / "default.json").read_text())
    trained = read_summary(run).metrics["validation"]
    assert again["metrics"]["validation"] == pytest.approx(trained)
    assert again["data"]["labels"] == NAMES
    other = tmp_path / "other.csv"
    other.write_text("text,label\nmy order never came .,shipping\nplease refund me .,refunds\n")
    line = refused("eval", run, f"task.data_files.validation={other}")
    assert "label 'refunds' is not one of the classes in task.labels (billing, shipping, " \
           "technical)" in line
    for key in ("task.labels=[a, b]", "task.regression=true"):
        assert f"{key.split('=')[0]} cannot change in eval" in refused("eval", run, key)


def test_a_sweep_plan_matches_the_finished_run_whatever_labels_it_recorded(smoke_runs):
    run = smoke_runs(CLASSIFIER)

    def planned(*overrides: str) -> PlannedRun:
        return PlannedRun(run.name, ROOT / CLASSIFIER, "adalora", None, 0, overrides, "r0=4")

    assert not config_drift(planned(), run)  # the plan left the labels to the data
    assert config_drift(planned("task.labels=[technical, shipping, billing]"), run)
    assert config_drift(planned("train.learning_rate=0.01"), run)
