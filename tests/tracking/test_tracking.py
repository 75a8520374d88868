"""Trackers read back with their own libraries, offline: TensorBoard event files through
TensorBoard's EventAccumulator, MLflow through MlflowClient on a SQLite store, W&B from
its offline run file decoded with wandb's own protobuf classes. Values, not file names."""

from __future__ import annotations

import io
import json
from pathlib import Path

import numpy as np
import pytest
from mlflow.tracking import MlflowClient
from PIL import Image
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
from tensorboard.plugins.hparams import api_pb2, plugin_data_pb2
from typer.testing import CliRunner

from adalora_cli.cli import app
from adalora_cli.config import load_config
from adalora_cli.heatmap import heatmap_png
from adalora_cli.rundir.run import read_metrics
from adalora_cli.tracking import Trackers, fanout
from tests.tracking.wandb_records import read_run

ROOT = Path(__file__).resolve().parents[2]
SMOKE = ROOT / "configs" / "smoke" / "glue.yaml"
EXPERIMENT = "tracking-tests"
Q0 = "bert.encoder.layer.0.attention.self.query"
F1 = "bert.encoder.layer.1.output.dense"
SWEEP = ["sweep.name=table1", "sweep.budget_level=144", "train.seed=3"]


@pytest.fixture(autouse=True)
def offline_wandb(monkeypatch, tmp_path):
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    monkeypatch.setenv("WANDB_CONFIG_DIR", str(tmp_path / "wandb-config"))
    monkeypatch.setenv("WANDB_CACHE_DIR", str(tmp_path / "wandb-cache"))


@pytest.fixture(scope="module")
def mlflow_uri(tmp_path_factory) -> str:
    """One SQLite store for the module (creating its schema costs seconds), with the test
    experiment's artifacts in a temporary folder rather than the working directory."""
    root = tmp_path_factory.mktemp("mlflow")
    uri = f"sqlite:///{root}/mlflow.db"
    MlflowClient(uri).create_experiment(EXPERIMENT, artifact_location=(root / "art").as_uri())
    return uri


def config(mlflow_uri: str, *to: str, extra: tuple[str, ...] = ()):
    return load_config(SMOKE, [f"log.to=[{','.join(to)}]", f"log.mlflow_uri={mlflow_uri}",
                               f"log.project={EXPERIMENT}", "log.heatmap_every_s=0", *extra])


def play(trackers: Trackers, steps, loss=lambda s: 1.0 / s) -> None:
    """A scripted run: a training row per step, mask events at even steps."""
    for s in steps:
        trackers.log_row({"step": s, "loss": loss(s), "lr": 0.01 * s, "budget": 10 - s,
                          "orth_reg": 0.5 / s})
        if s % 2 == 0:
            trackers.log_ranks(s, {Q0: 4 - s // 2, F1: s // 2})


SUMMARY = {"total_steps": 4, "metrics": {"validation": {"accuracy": 0.75}},
           "device": "cpu", "peak_memory_bytes": 1234, "task": "sst2"}


def scripted(cfg, run: Path, warnings: list[str]) -> Trackers:
    trackers = Trackers.open(cfg, run, resumed=False, warn=warnings.append)
    play(trackers, range(1, 5))
    trackers.log_eval(4, "validation", {"accuracy": 0.75})
    trackers.log_summary(SUMMARY)
    trackers.close()
    return trackers


def tensorboard(path: Path) -> EventAccumulator:
    acc = EventAccumulator(str(path), size_guidance={"scalars": 0, "images": 0, "tensors": 0})
    acc.Reload()
    return acc


def scalars(acc: EventAccumulator, tag: str) -> list[tuple[int, float]]:
    return [(e.step, e.value) for e in acc.Scalars(tag)]


def pixels(png: bytes) -> np.ndarray:
    return np.asarray(Image.open(io.BytesIO(png)).convert("RGB"))


def state(run: Path) -> dict:
    return json.loads((run / "trackers.json").read_text())


def mlflow_steps(client: MlflowClient, run_id: str, key: str) -> list[tuple[int, float]]:
    return sorted((m.step, m.value) for m in client.get_metric_history(run_id, key))


def wandb_files(run: Path) -> list[Path]:
    return sorted(run.glob("wandb/offline-run-*/run-*.wandb"))


def history(wb: dict, key: str) -> list[tuple[int, object]]:
    return [(row["_step"], row[key]) for row in wb["history"] if key in row]


# --------------------------------------------------------------------------- one backend each


def test_tensorboard_scalars_heatmaps_and_hparams_read_back(tmp_path, mlflow_uri):
    warnings: list[str] = []
    scripted(config(mlflow_uri, "tensorboard"), tmp_path, warnings)
    assert warnings == []
    acc = tensorboard(tmp_path / "tensorboard")
    loss = scalars(acc, "train/loss")
    assert [s for s, _ in loss] == [1, 2, 3, 4]
    assert [v for _, v in loss] == pytest.approx([1, 1 / 2, 1 / 3, 1 / 4], rel=1e-6)
    assert scalars(acc, "train/budget") == [(1, 9), (2, 8), (3, 7), (4, 6)]
    assert [v for _, v in scalars(acc, "train/lr")] == pytest.approx([0.01, 0.02, 0.03, 0.04])
    assert scalars(acc, f"rank/{Q0}") == [(2, 3), (4, 2)]
    assert scalars(acc, "rank/total") == [(2, 4), (4, 4)]
    assert scalars(acc, "eval/validation/accuracy") == [(4, 0.75)]
    assert scalars(acc, "final/peak_memory_bytes") == [(4, 1234)]
    assert scalars(acc, "final/metrics/validation/accuracy") == [(4, 0.75)]
    # a heatmap per mask event (heatmap_every_s=0) and the final one, which is exactly
    # the figure of the last pattern
    images = acc.Images("rank_heatmap")
    assert [im.step for im in images] == [2, 4, 4]
    final = heatmap_png({Q0: 2, F1: 2}, title="sst2 adalora: final ranks at step 4 (total 4)")
    assert np.array_equal(pixels(images[-1].encoded_image_string), pixels(final))
    # the resolved config as hparams; the run ends as a success
    content = acc.PluginTagToContent("hparams")
    start = plugin_data_pb2.HParamsPluginData.FromString(
        content["_hparams_/session_start_info"]).session_start_info
    assert start.hparams["adalora.budget"].number_value == 16
    assert start.hparams["task.name"].string_value == "sst2"
    assert start.hparams["adalora.prune"].number_value == 1  # torch writes booleans as 1/0
    assert start.hparams["log.project"].string_value == EXPERIMENT
    assert "_hparams_/experiment" not in content  # TensorBoard infers the metric columns
    end = plugin_data_pb2.HParamsPluginData.FromString(
        content["_hparams_/session_end_info"]).session_end_info
    assert end.status == api_pb2.STATUS_SUCCESS


def test_mlflow_run_reads_back_through_its_client(tmp_path, mlflow_uri):
    warnings: list[str] = []
    scripted(config(mlflow_uri, "mlflow", extra=tuple(SWEEP)), tmp_path, warnings)
    assert warnings == []
    client = MlflowClient(mlflow_uri)
    run = client.get_run(state(tmp_path)["mlflow"]["run_id"])
    assert run.info.status == "FINISHED" and run.info.run_name == tmp_path.name
    assert client.get_experiment(run.info.experiment_id).name == EXPERIMENT
    assert mlflow_steps(client, run.info.run_id, "train/loss") == [
        (1, 1.0), (2, 0.5), (3, 1 / 3), (4, 0.25)]
    assert mlflow_steps(client, run.info.run_id, "train/orth_reg") == [
        (1, 0.5), (2, 0.25), (3, 0.5 / 3), (4, 0.125)]
    assert mlflow_steps(client, run.info.run_id, f"rank/{F1}") == [(2, 1), (4, 2)]
    assert mlflow_steps(client, run.info.run_id, "eval/validation/accuracy") == [(4, 0.75)]
    assert run.data.metrics["final/peak_memory_bytes"] == 1234
    assert run.data.params["adalora.budget"] == "16"
    assert run.data.params["train.seed"] == "3"
    assert {k: run.data.tags[k] for k in ("sweep", "task", "method", "budget_level", "seed")} \
        == {"sweep": "table1", "task": "sst2", "method": "adalora", "budget_level": "144",
            "seed": "3"}
    assert run.data.tags["final/device"] == "cpu"
    images = [a.path for a in client.list_artifacts(run.info.run_id, "images")
              if a.path.endswith(".png")]
    assert sorted(int(p.split("+step+")[1].split("+")[0]) for p in images) == [2, 4, 4]


def test_wandb_offline_run_reads_back(tmp_path, mlflow_uri):
    warnings: list[str] = []
    scripted(config(mlflow_uri, "wandb", extra=tuple(SWEEP)), tmp_path, warnings)
    assert warnings == []
    (path,) = wandb_files(tmp_path)
    wb = read_run(path)
    meta = wb["run"]
    assert meta.run_id == state(tmp_path)["wandb"]["id"]
    assert meta.project == EXPERIMENT and meta.display_name == tmp_path.name
    # grouped as the paper's tables: sweep, then task/method/budget level, seeds inside
    assert meta.run_group == "table1" and meta.job_type == "sst2/adalora/b144"
    assert set(meta.tags) == {"sweep:table1", "task:sst2", "method:adalora",
                              "budget_level:144", "seed:3"}
    assert wb["config"]["adalora"]["budget"] == 16
    assert wb["config"]["sweep"] == {"name": "table1", "budget_level": 144}
    assert history(wb, "train/loss") == [(1, 1.0), (2, 0.5), (3, 1 / 3), (4, 0.25)]
    assert history(wb, "train/budget") == [(1, 9), (2, 8), (3, 7), (4, 6)]
    assert history(wb, f"rank/{Q0}") == [(2, 3), (4, 2)]
    assert history(wb, "eval/validation/accuracy") == [(4, 0.75)]
    heatmaps = history(wb, "rank_heatmap/path")
    assert [s for s, _ in heatmaps] == [2, 4]  # the final image shares step 4's row
    assert all((path.parent / "files" / p).is_file() for _, p in heatmaps)
    assert wb["summary"]["final/metrics/validation/accuracy"] == 0.75
    assert wb["summary"]["final/peak_memory_bytes"] == 1234
    assert wb["summary"]["final/device"] == "cpu"


# --------------------------------------------------------------------------- resume, failure


def test_resumed_run_continues_the_same_tracker_run(tmp_path, mlflow_uri):
    cfg = config(mlflow_uri, "tensorboard", "wandb", "mlflow")
    warnings: list[str] = []
    first = Trackers.open(cfg, tmp_path, resumed=False, warn=warnings.append)
    play(first, range(1, 4))  # killed after step 3; its last checkpoint was step 2
    first.close()
    ids = state(tmp_path)
    client = MlflowClient(mlflow_uri)
    assert client.get_run(ids["mlflow"]["run_id"]).info.status == "FAILED"

    second = Trackers.open(cfg, tmp_path, resumed=True, warn=warnings.append)
    play(second, range(3, 6), loss=lambda s: 10.0 / s)  # step 3 again, from the checkpoint
    second.log_summary({**SUMMARY, "total_steps": 5})
    second.close()
    assert warnings == [] and state(tmp_path) == ids

    # TensorBoard: one curve 1..5; the redone step 3 replaces the one logged past the
    # checkpoint (purge_step)
    acc = tensorboard(tmp_path / "tensorboard")
    assert [(s, round(v, 5)) for s, v in scalars(acc, "train/loss")] == [
        (1, 1.0), (2, 0.5), (3, 3.33333), (4, 2.5), (5, 2.0)]
    # MLflow: the same run, each step once (the point it already held is kept)
    run_id = ids["mlflow"]["run_id"]
    assert mlflow_steps(client, run_id, "train/loss") == [
        (1, 1.0), (2, 0.5), (3, 1 / 3), (4, 2.5), (5, 2.0)]
    assert client.get_run(run_id).info.status == "FINISHED"
    runs = client.search_runs([client.get_run(run_id).info.experiment_id],
                              f"attributes.run_name = '{tmp_path.name}'")
    assert [r.info.run_id for r in runs] == [run_id]
    # W&B offline: two segments of one run id, the second going on where the first stopped
    segments = [read_run(p) for p in wandb_files(tmp_path)]
    assert [s["run"].run_id for s in segments] == [ids["wandb"]["id"]] * 2
    assert [history(s, "train/loss") for s in segments] == [
        [(1, 1.0), (2, 0.5), (3, 1 / 3)], [(3, 10 / 3), (4, 2.5), (5, 2.0)]]


def test_a_failing_tracker_is_dropped_with_one_warning(tmp_path, mlflow_uri):
    warnings: list[str] = []
    trackers = Trackers.open(config(mlflow_uri, "tensorboard", "mlflow"), tmp_path,
                             resumed=False, warn=warnings.append)
    play(trackers, range(1, 3))
    tb = next(s for s in trackers.sinks if s.name == "tensorboard")

    def disk_full(*args, **kwargs):
        raise OSError(28, "No space left on device")
    tb.writer.add_scalar = disk_full
    play(trackers, range(3, 5))
    trackers.log_eval(4, "validation", {"accuracy": 0.75})
    trackers.log_summary(SUMMARY)
    trackers.close()

    assert len(warnings) == 1
    assert warnings[0].startswith("tensorboard tracking failed (OSError:")
    assert "No space left on device" in warnings[0]
    assert [s.name for s in trackers.sinks] == []  # closed
    acc = tensorboard(tmp_path / "tensorboard")
    assert [s for s, _ in scalars(acc, "train/loss")] == [1, 2]  # up to the failure
    client = MlflowClient(mlflow_uri)
    run_id = state(tmp_path)["mlflow"]["run_id"]
    assert [s for s, _ in mlflow_steps(client, run_id, "train/loss")] == [1, 2, 3, 4]
    assert client.get_run(run_id).info.status == "FINISHED"


def test_a_tracker_that_cannot_open_is_skipped_with_one_warning(tmp_path, mlflow_uri):
    cfg = config("notascheme://nowhere", "tensorboard", "mlflow")
    warnings: list[str] = []
    trackers = Trackers.open(cfg, tmp_path, resumed=False, warn=warnings.append)
    assert [s.name for s in trackers.sinks] == ["tensorboard"]
    assert len(warnings) == 1 and warnings[0].startswith("mlflow could not be opened (")
    assert set(state(tmp_path)) == {"tensorboard"}
    trackers.close()


# --------------------------------------------------------------------------- CLI


def test_missing_tracker_package_is_one_line_error_before_training(
        tmp_path, in_repo, monkeypatch):
    real = fanout.importlib.util.find_spec
    monkeypatch.setattr(fanout.importlib.util, "find_spec",
                        lambda name, *a: None if name == "wandb" else real(name, *a))
    out = tmp_path / "run"
    result = CliRunner().invoke(app, ["train", "configs/smoke/glue.yaml", "log.to=[wandb]",
                                      "--run-dir", str(out), "--quiet"])
    assert result.exit_code == 2
    assert "log.to includes wandb but the wandb package is not installed; " \
           "run `make install`" in result.output
    assert "Traceback" not in result.output and not out.exists()


def test_unknown_tracker_is_one_line_error(tmp_path, in_repo):
    result = CliRunner().invoke(app, ["train", "configs/smoke/glue.yaml", "log.to=[neptune]",
                                      "--run-dir", str(tmp_path / "run")])
    assert result.exit_code == 2
    assert "log.to[0] must be one of tensorboard, wandb, mlflow; got 'neptune'" in result.output


def test_train_cli_mirrors_the_run_directory_in_every_tracker(tmp_path, in_repo, mlflow_uri):
    out = tmp_path / "run"
    result = CliRunner().invoke(app, [
        "train", "configs/smoke/glue.yaml", "log.to=[tensorboard,wandb,mlflow]",
        f"log.mlflow_uri={mlflow_uri}", f"log.project={EXPERIMENT}", "--run-dir", str(out),
        "--quiet"])
    assert result.exit_code == 0, result.output
    assert "warning:" not in result.output
    rows = read_metrics(out)
    train_rows = [r for r in rows if "loss" in r]
    evals = [(r["step"], r["accuracy"]) for r in rows if r.get("split") == "validation"]
    ranks = [json.loads(line) for line in (out / "rank_history.jsonl").read_text().splitlines()]
    total = [(r["step"], sum(r["ranks"].values())) for r in ranks]
    summary = json.loads((out / "summary.json").read_text())
    T = summary["total_steps"]

    acc = tensorboard(out / "tensorboard")
    assert scalars(acc, "train/loss") == [
        (r["step"], pytest.approx(r["loss"], rel=1e-6)) for r in train_rows]
    assert scalars(acc, "train/budget") == [(r["step"], r["budget"]) for r in train_rows]
    assert scalars(acc, "rank/total") == total
    assert scalars(acc, "eval/validation/accuracy") == evals
    # heatmap_every_s=60 (default): the first mask event, then the final pattern at T
    assert [im.step for im in acc.Images("rank_heatmap")] == [ranks[0]["step"], T]

    client = MlflowClient(mlflow_uri)
    run_id = state(out)["mlflow"]["run_id"]
    assert mlflow_steps(client, run_id, "train/loss") == [
        (r["step"], r["loss"]) for r in train_rows]
    assert mlflow_steps(client, run_id, "eval/validation/accuracy") == evals
    final = client.get_run(run_id)
    assert final.info.status == "FINISHED"
    assert final.data.metrics["final/metrics/validation/accuracy"] == \
        summary["metrics"]["validation"]["accuracy"]
    assert final.data.metrics["final/final_budget"] == 16

    (path,) = wandb_files(out)
    wb = read_run(path)
    assert history(wb, "train/lr") == [(r["step"], r["lr"]) for r in train_rows]
    assert history(wb, "rank/total") == total
    assert wb["summary"]["final/peak_memory_bytes"] == summary["peak_memory_bytes"]


def test_sweep_checks_trackers_before_any_run(tmp_path, in_repo, monkeypatch):
    real = fanout.importlib.util.find_spec
    monkeypatch.setattr(fanout.importlib.util, "find_spec",
                        lambda name, *a: None if name == "sqlalchemy" else real(name, *a))
    where = tmp_path / "sweep"
    result = CliRunner().invoke(app, ["sweep", "configs/smoke/glue.yaml", "log.to=[mlflow]",
                                      "--methods", "lora", "--seeds", "0",
                                      "--sweep-dir", str(where)])
    assert result.exit_code == 2
    lines = [line for line in result.output.splitlines() if line.strip()]
    assert lines == ["error: log.to includes mlflow but the sqlalchemy package is not "
                     "installed; run `make install` (it installs every tracker), or `pip "
                     "install -e '.[mlflow]'` in the adalora checkout (or drop mlflow from "
                     "log.to)"]
    assert not where.exists()


def test_an_mlflow_run_deleted_mid_run_is_reported_once(tmp_path, mlflow_uri):
    warnings: list[str] = []
    trackers = Trackers.open(config(mlflow_uri, "tensorboard", "mlflow"), tmp_path,
                             resumed=False, warn=warnings.append)
    play(trackers, range(1, 3))
    MlflowClient(mlflow_uri).delete_run(state(tmp_path)["mlflow"]["run_id"])
    play(trackers, range(3, 5))
    trackers.log_summary(SUMMARY)
    trackers.close()
    assert len(warnings) == 1 and warnings[0].startswith("mlflow tracking failed (")
    acc = tensorboard(tmp_path / "tensorboard")  # the other tracker got everything
    assert [s for s, _ in scalars(acc, "train/loss")] == [1, 2, 3, 4]
    assert scalars(acc, "final/metrics/validation/accuracy") == [(4, 0.75)]
