"""Run directory: never overwrites, status says failed/finished, summary written last."""

from __future__ import annotations

import json

import pytest

from adalora_cli.config import ConfigError, RunConfig, load_config
from adalora_cli.errors import RunBusy
from adalora_cli.rundir.run import RunDir, default_run_dir, is_finished, read_metrics
from adalora_cli.rundir.summary import Summary


def test_create_writes_config_and_running_status(tmp_path):
    run = RunDir.create(tmp_path / "r", RunConfig())
    assert (tmp_path / "r" / "config.yaml").is_file()
    assert RunDir.read_status(run.path)["status"] == "running"
    assert not is_finished(run.path)
    # the saved config reads back to the same values
    assert load_config(run.path / "config.yaml") == RunConfig()


def test_never_overwrites_a_run(tmp_path):
    run = RunDir.create(tmp_path / "r", RunConfig())
    with pytest.raises(RunBusy, match="being run by process"):  # its owner (we) is alive
        RunDir.create(tmp_path / "r", RunConfig())
    run.fail("RuntimeError: boom")
    with pytest.raises(ConfigError, match="already exists and holds an unfinished run.*--resume"):
        RunDir.create(tmp_path / "r", RunConfig())


def test_failed_run_is_marked_and_not_finished(tmp_path):
    run = RunDir.create(tmp_path / "r", RunConfig())
    run.log({"step": 1, "loss": 0.5})
    run.fail("RuntimeError: boom")
    status = RunDir.read_status(run.path)
    assert status["status"] == "failed" and status["error"] == "RuntimeError: boom"
    assert not (run.path / "summary.json").exists()
    assert not is_finished(run.path)


def test_finish_writes_summary_and_metrics_lines(tmp_path):
    run = RunDir.create(tmp_path / "r", RunConfig())
    run.log({"step": 1, "loss": 0.5, "lr": 1e-3})
    run.log({"step": 1, "split": "validation", "accuracy": 0.75})
    run.log_ranks(1, {"a": 2, "b": 0})
    run.finish(Summary(task="rte", method="lora"))
    assert is_finished(run.path)
    assert read_metrics(run.path) == [{"step": 1, "loss": 0.5, "lr": 1e-3},
                                      {"step": 1, "split": "validation", "accuracy": 0.75}]
    assert json.loads((run.path / "summary.json").read_text()) == \
        Summary(task="rte", method="lora").to_dict()
    history = (run.path / "rank_history.jsonl").read_text().splitlines()
    assert json.loads(history[0]) == {"step": 1, "ranks": {"a": 2, "b": 0}}


def test_default_run_dirs_are_distinct(tmp_path):
    first = default_run_dir(RunConfig(), tmp_path)
    first.mkdir(parents=True)
    second = default_run_dir(RunConfig(), tmp_path)
    assert first != second and first.name.startswith("rte-adalora-s42-")


@pytest.mark.parametrize("end", ["finish", "preempt", "fail"])
def test_the_heartbeat_goes_when_the_run_ends(tmp_path, end):
    """heartbeat.json is a live run's step; once status.json says how the run ended it is
    removed, however it ended."""
    from adalora_cli.rundir.owner import Heartbeat

    run = RunDir.create(tmp_path / "r", RunConfig())
    with Heartbeat(run.path) as beat:
        beat.step = 3
        beat.beat()
    assert json.loads((run.path / "heartbeat.json").read_text())["step"] == 3
    {"finish": lambda: run.finish(Summary(task="rte", method="lora")),
     "preempt": lambda: run.preempt("stopped by SIGTERM", step=3),
     "fail": lambda: run.fail("RuntimeError: boom")}[end]()
    assert not (run.path / "heartbeat.json").exists()
    assert RunDir.read_status(run.path)["status"] == {"finish": "finished",
                                                     "preempt": "preempted",
                                                     "fail": "failed"}[end]
