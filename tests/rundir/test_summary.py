"""summary.json as a typed record: what it round-trips, and how an older file reads back."""

from __future__ import annotations

import json

import pytest

from adalora_cli.rundir.summary import (
    ExportFacts,
    ReportColumn,
    Summary,
    TaskReport,
    read_summary,
)

RTE = TaskReport("RTE", "glue", (ReportColumn("Acc", ("validation",), "accuracy", 100),))


def test_a_written_summary_reads_back_equal(tmp_path):
    summary = Summary(task="rte", method="adalora", seed=3, metrics={"validation": {
        "accuracy": 0.75}}, budget_level=144, size="r0=4", config_digest="ab" * 32,
        report=RTE, final_adapter_params=600, data={"train": 64}, checkpoint_bytes=10,
        export=ExportFacts(base_model="m", target_modules=["a.q"]))
    data = summary.to_dict()
    assert data["data"] == {"train": 64} and data["checkpoint_bytes"] == 10
    assert data["report"] == {"title": "RTE", "family": "glue", "columns": [
        {"label": "Acc", "splits": ["validation"], "metric": "accuracy", "scale": 100,
         "lower_is_better": False}]}
    assert data["export"]["base_model"] == "m" and data["export"]["target_modules"] == ["a.q"]
    (tmp_path / "summary.json").write_text(json.dumps(data))
    assert read_summary(tmp_path) == summary


def test_optional_fields_are_written_only_when_set():
    data = Summary(task="rte", method="lora", metrics={}).to_dict()
    assert "final_adapter_params" not in data and "weights" not in data
    assert data["budget_level"] is None  # always written, as before the record was typed


def test_an_older_summary_reads_with_the_new_fields_missing(tmp_path):
    old = {"task": "rte", "method": "lora", "model": "m", "seed": 0, "adapter_params": 800,
           "metrics": {"validation": {"accuracy": 0.8}}, "budget_level": 144,
           "weights": {"file": "adapter_model.safetensors"}}
    (tmp_path / "summary.json").write_text(json.dumps(old))
    summary = read_summary(tmp_path)
    assert (summary.size, summary.config_digest, summary.report) == (None, None, None)
    assert summary.adapter_params == 800 and summary.weights == old["weights"]
    assert summary.to_dict() == {**Summary(task="rte", method="lora").to_dict(), **old}
    # a newer writer's keys are not read, and a damaged export record reads as empty
    newer = Summary.from_dict({**old, "from_the_future": 1, "export": [1]})
    assert newer.export == ExportFacts() and "from_the_future" not in newer.to_dict()


@pytest.mark.parametrize("data, reason", [
    ([1, 2], "not a JSON object"),
    ({"task": "rte", "method": "lora"}, "no metrics mapping"),
    ({"method": "lora", "metrics": {}}, "lacks task or method"),
])
def test_a_malformed_summary_is_a_value_error(data, reason):
    with pytest.raises(ValueError, match=reason):
        Summary.from_dict(data)


def test_a_damaged_report_record_reads_as_none():
    assert TaskReport.from_dict({"title": "RTE", "columns": []}) is None
    assert TaskReport.from_dict(RTE.to_dict()) == RTE


def test_a_trained_run_records_size_columns_and_digest(tmp_path, in_repo):
    """The engine writes the new fields, and the digest it records is the one the report
    recomputes from the run's config.yaml; an unknown method is refused before any file."""
    from typer.testing import CliRunner

    from adalora_cli.cli import app
    from adalora_cli.config import load_config
    from adalora_cli.methods.registry import config_digest

    out = tmp_path / "run"
    result = CliRunner().invoke(app, ["train", "configs/smoke/glue.yaml", "method.name=lora",
                                      "train.max_steps=2", "task.max_eval_samples=4",
                                      "train.eval_every=null", "--run-dir", str(out), "--quiet"])
    assert result.exit_code == 0, result.output
    summary = read_summary(out)
    assert summary.size == "r=2"  # configs/smoke/glue.yaml: lora.r 2
    assert summary.report == TaskReport("SST-2", "glue", (
        ReportColumn("Acc", ("validation",), "accuracy", 100),))
    assert summary.config_digest == config_digest(load_config(out / "config.yaml"))
    assert summary.data["train_examples"] == 64 and summary.checkpoint_bytes > 0
    # the end-of-run facts: what trained, LoRA r=2 on the 2 layers of tiny-bert (hidden 32,
    # FFN 37): four 32x32 attention matrices and the 32<->37 FFN pair per layer, + the head
    assert summary.adapter_params == 2 * (4 * 2 * (32 + 32) + 2 * 2 * (32 + 37))
    assert summary.trainable_params == summary.adapter_params + summary.head_params
    assert summary.final_mean_rank is None  # LoRA keeps no budget

    bad = tmp_path / "bad"
    # the model folder does not exist either: the method is named first, before any loading
    result = CliRunner().invoke(app, ["train", "configs/smoke/glue.yaml", "method.name=qlora",
                                      f"model.name_or_path={tmp_path / 'no-model'}",
                                      "--run-dir", str(bad), "--quiet"])
    assert result.exit_code == 2
    assert "unknown method.name 'qlora'; choose from none, full, bitfit" in result.output
    assert not bad.exists()
