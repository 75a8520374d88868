"""The CLI end to end on the smoke config: run directory contents, schedule in the logs,
dry run, and one-line errors for bad input."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from adalora_cli.cli import app
from adalora_cli.engine import build as training
from adalora_cli.rundir.run import is_finished, read_metrics
from tests.conftest import copy_of

ROOT = Path(__file__).resolve().parent.parent
SMOKE = "configs/smoke/glue.yaml"
runner = CliRunner()


def run_cli(*args: str):
    return runner.invoke(app, list(args), catch_exceptions=False)


def expected_budget(t: int, b0=48, bT=16, ti=4, tf=8, T=32) -> int:
    """docs/maths.md#budget-schedule, written out independently of the allocator."""
    if t <= ti:
        return b0
    if t > T - tf:
        return bT
    frac = 1 - (t - ti) / (T - ti - tf)
    return int(bT + (b0 - bT) * frac ** 3)


@pytest.fixture(scope="module")
def adalora_run(smoke_runs):
    return smoke_runs(SMOKE)


def test_adalora_run_directory(adalora_run):
    names = {p.name for p in adalora_run.iterdir()}
    assert {"config.yaml", "metrics.jsonl", "summary.json", "status.json", "rank_pattern.json",
            "rank_heatmap.png", "rank_history.jsonl", "adapter_model.safetensors"} <= names
    assert is_finished(adalora_run)
    summary = json.loads((adalora_run / "summary.json").read_text())
    assert summary["task"] == "sst2" and summary["method"] == "adalora"
    assert summary["total_steps"] == 32 and summary["seed"] == 0
    # tiny BERT: hidden 32, intermediate 37, 2 layers; AdaLoRA r0 = 4: r0 * (d_in + d_out + 1)
    per_layer = 4 * (4 * (32 + 32 + 1) + (32 + 37 + 1) + (37 + 32 + 1))
    assert summary["adapter_params"] == 2 * per_layer
    assert summary["n_matrices"] == 12
    assert set(summary["metrics"]["validation"]) == {"accuracy"}
    assert 0.0 <= summary["metrics"]["validation"]["accuracy"] <= 1.0
    assert summary["peak_memory_bytes"] > 0 and summary["train_seconds"] > 0


def test_rank_pattern_sums_to_budget(adalora_run):
    pattern = json.loads((adalora_run / "rank_pattern.json").read_text())
    assert len(pattern) == 12 and sum(pattern.values()) == 16
    assert all(0 <= r <= 4 for r in pattern.values())
    summary = json.loads((adalora_run / "summary.json").read_text())

    def cost(path: str) -> int:  # d_in + d_out + 1 of the matrix at this path
        if path.endswith("intermediate.dense"):
            return 32 + 37 + 1
        if path.endswith("output.dense") and not path.endswith("attention.output.dense"):
            return 37 + 32 + 1
        return 32 + 32 + 1
    assert summary["final_adapter_params"] == sum(r * cost(p) for p, r in pattern.items())


def test_metrics_follow_the_schedule(adalora_run):
    rows = read_metrics(adalora_run)
    train_rows = [r for r in rows if "loss" in r]
    assert [r["step"] for r in train_rows] == list(range(1, 33))
    assert [r["budget"] for r in train_rows] == [expected_budget(t) for t in range(1, 33)]
    assert all(r["orth_reg"] >= 0 for r in train_rows)
    evals = [r for r in rows if "split" in r]
    assert [(r["step"], r["split"]) for r in evals] == [(16, "validation"), (32, "validation")]
    history = [json.loads(line) for line in (adalora_run / "rank_history.jsonl").open()]
    steps = [h["step"] for h in history]
    # mask events: t_i < t <= T - t_f with t % delta_t == 0, then the freeze at T - t_f + 1
    assert steps[:len(range(6, 25, 2))] == list(range(6, 25, 2))
    for h in history:
        assert sum(h["ranks"].values()) == expected_budget(h["step"])


def test_saved_weights_reload_to_the_same_score(adalora_run, in_repo):
    from adalora_cli.artifacts.load import load_run

    model, tokenizer, cfg = load_run(adalora_run)
    task = training.get_task(training.resolve_resources(cfg))
    data = task.load_data(tokenizer)
    import contextlib

    import torch
    metrics = task.evaluate(model, "validation", data.eval_splits["validation"], batch_size=64,
                            collate=data.collate, device=torch.device("cpu"),
                            autocast=contextlib.nullcontext)
    summary = json.loads((adalora_run / "summary.json").read_text())
    assert metrics["accuracy"] == pytest.approx(summary["metrics"]["validation"]["accuracy"])


@pytest.mark.parametrize("method", ["lora", "houlsby", "pfeiffer", "bitfit", "full"])
def test_baselines_run(tmp_path, method, in_repo):
    out = tmp_path / method
    result = run_cli("train", SMOKE, f"method.name={method}", "train.epochs=1", "--run-dir",
                     str(out), "--quiet")
    assert result.exit_code == 0, result.output
    summary = json.loads((out / "summary.json").read_text())
    assert summary["method"] == method and summary["total_steps"] == 8
    assert not (out / "rank_pattern.json").exists()
    assert (out / ("model" if method == "full" else "adapter_model.safetensors")).exists()


def test_dry_run_ends_with_json(in_repo):
    result = run_cli("train", SMOKE, "method.name=lora", "lora.r=8", "--dry-run")
    assert result.exit_code == 0, result.output
    info = json.loads(result.stdout.strip().splitlines()[-1])  # stdout alone, no logs
    # LoRA r = 8 on 12 matrices: 8 * (d_in + d_out) summed
    assert info["adapter_params"] == 2 * 8 * (4 * 64 + 69 + 69)
    assert info["n_matrices"] == 12
    assert info["head_params"] > 0
    assert "query" in result.output  # the per-module table


@pytest.mark.parametrize("override, fragment", [
    ("adalora.budget=1000", "adalora.budget=1000 exceeds the initial budget b0=48"),
    ("adalora.t_final=0", "adalora.t_final must be >= 1 when pruning"),
])
def test_dry_run_refuses_a_schedule_a_real_run_refuses(in_repo, override, fragment):
    """The dry run reads no data, so it cannot know T; everything else about the schedule
    (b0 = 12 matrices x r0 4 = 48 on the smoke model) it checks as a real run does."""
    result = run_cli("train", SMOKE, override, "--dry-run")
    assert result.exit_code == 2, result.output
    assert fragment in one_error_line(result)


def cli_subprocess(*args: str, cwd: Path = ROOT):
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    env.pop("ADALORA_DEBUG", None)
    return subprocess.run([sys.executable, "-m", "adalora_cli", *args], cwd=cwd,
                          capture_output=True, text=True, env=env, timeout=300, check=False)


@pytest.mark.e2e
@pytest.mark.parametrize("args, fragment", [
    (("train", "configs/nope.yaml"), "does not exist"),
    (("train", SMOKE, "adalora.budjet=3"), "unknown config key adalora.budjet"),
    (("train", SMOKE, "adalora.t_init=20", "adalora.t_final=20"), "20"),
    (("train", SMOKE, "adalora.budget=100"), "100"),
    (("train", SMOKE, "model.name_or_path=tests/fixtures/no-such-model"), "no-such-model"),
])
def test_bad_input_one_line_no_traceback_no_run(tmp_path, args, fragment):
    out = tmp_path / "run"
    proc = cli_subprocess(*args, "--run-dir", str(out))
    assert proc.returncode == 2, proc.stderr
    lines = [line for line in proc.stderr.strip().splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error:"), proc.stderr
    assert fragment in lines[0]
    assert "Traceback" not in proc.stderr
    assert not out.exists()


@pytest.mark.e2e
def test_malformed_yaml(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("task: [unclosed\n")
    proc = cli_subprocess("train", str(bad))
    assert proc.returncode == 2 and "not valid YAML" in proc.stderr
    assert "Traceback" not in proc.stderr


def test_failure_mid_run_marks_directory_failed(tmp_path, in_repo, monkeypatch):
    def broken(*args, **kwargs):
        raise RuntimeError("evaluation exploded")
    from adalora_cli.engine import loop
    monkeypatch.setattr(loop, "_evaluate", broken)
    out = tmp_path / "run"
    result = run_cli("train", SMOKE, "method.name=lora", "train.epochs=1", "--run-dir", str(out),
                     "--quiet")
    assert result.exit_code == 1
    assert "evaluation exploded" in result.output
    status = json.loads((out / "status.json").read_text())
    assert status["status"] == "failed" and "evaluation exploded" in status["error"]
    assert not (out / "summary.json").exists()


@pytest.mark.e2e
def test_sigterm_preempts_with_a_checkpoint(tmp_path):
    """A real SIGTERM from outside, at whatever step the run has reached."""
    import signal
    import time
    out = tmp_path / "run"
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    proc = subprocess.Popen(
        [sys.executable, "-m", "adalora_cli", "train", SMOKE, "method.name=lora",
         "train.epochs=400", "--run-dir", str(out), "--quiet"],
        cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.time() + 120
    while not (out / "metrics.jsonl").exists() and time.time() < deadline:
        time.sleep(0.2)  # wait until training has started
    proc.send_signal(signal.SIGTERM)
    _, stderr = proc.communicate(timeout=60)
    assert proc.returncode == 75, stderr
    status = json.loads((out / "status.json").read_text())
    assert status["status"] == "preempted" and "SIGTERM" in status["reason"]
    step = status["step"]
    assert (out / "checkpoints" / f"step-{step:07d}" / "state.pt").is_file()
    lines = [line for line in stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and f"adalora train --resume {out}" in lines[0]
    assert "Traceback" not in stderr and not (out / "summary.json").exists()
    # the rows stop at the checkpointed step: nothing after it was logged
    assert max(r["step"] for r in read_metrics(out) if "loss" in r) == step


HEADER = ("train ", "device ", "loading ")
"""What a run says before its model loads (engine/header.py), before a load's error."""


def one_error_line(result) -> str:
    """The one error line, after nothing but a run's header lines."""
    lines = [line for line in result.output.splitlines() if line.strip()]
    assert lines and lines[-1].startswith("error:"), result.output
    assert all(line.startswith(HEADER) for line in lines[:-1]), result.output
    return lines[-1]


@pytest.mark.parametrize("overrides, fragment", [
    (["adalora.init_rank=40"], "adalora.init_rank=40 exceeds the smallest adapted matrix "
                               "dimension (32)"),
    (["train.learning_rate=inf"], "train.learning_rate must be a finite number, got inf"),
    (["adalora.gamma=nan"], "adalora.gamma must be a finite number, got nan"),
    (["train.device=tpu9"], "train.device='tpu9' is not a device"),
    (["train.device=cuda"], "CUDA is not available; use train.device=cpu"),
    (["model.name_or_path=tests/fixtures/no-such-model"],
     "model folder tests/fixtures/no-such-model does not exist"),
    (["train.save_every=-1"], "train.save_every must be >= 0"),
])
def test_more_bad_input_before_any_run_directory(tmp_path, in_repo, overrides, fragment):
    if "train.device=cuda" in overrides:
        import torch
        if torch.cuda.is_available():
            pytest.skip("this machine has CUDA")
    out = tmp_path / "run"
    result = runner.invoke(app, ["train", SMOKE, *overrides, "--run-dir", str(out)])
    assert result.exit_code == 2
    assert fragment in one_error_line(result)
    assert not out.exists()


def test_empty_config_and_directory_config(tmp_path):
    empty = tmp_path / "empty.yaml"
    empty.write_text("\n# nothing here\n")
    result = runner.invoke(app, ["train", str(empty)])
    assert result.exit_code == 2 and f"{empty} is empty" in one_error_line(result)
    result = runner.invoke(app, ["train", str(tmp_path)])
    assert result.exit_code == 2
    assert f"{tmp_path} is a directory, not a config file" in one_error_line(result)


def test_resume_refusals(tmp_path, in_repo, adalora_run):
    # a finished run
    result = runner.invoke(app, ["train", "--resume", str(adalora_run)])
    assert result.exit_code == 2 and "is finished; nothing to resume" in one_error_line(result)
    # not a run
    result = runner.invoke(app, ["train", "--resume", str(tmp_path)])
    assert result.exit_code == 2 and "is not a run directory" in one_error_line(result)
    # an unfinished run, but an override that changes what it computes
    broken = copy_of(adalora_run, tmp_path / "broken")
    (broken / "summary.json").unlink()
    status = json.loads((broken / "status.json").read_text())
    (broken / "status.json").write_text(json.dumps({**status, "status": "failed"}))
    for key in ("adalora.t_final=4", "train.seed=3", "train.batch_size=4", "method.name=lora",
                "task.name=rte", "model.name_or_path=x", "train.learning_rate=1e-3"):
        result = runner.invoke(app, ["train", "--resume", str(broken), key])
        line = one_error_line(result)
        assert result.exit_code == 2
        assert f"{key.split('=')[0]} cannot change when resuming" in line, key
    # a run owned by a live process (this one)
    from adalora_cli.rundir.owner import identity
    (broken / "status.json").write_text(json.dumps({"status": "running", **identity()}))
    result = runner.invoke(app, ["train", "--resume", str(broken)])
    assert result.exit_code == 73 and "is being run by process" in one_error_line(result)


def test_resume_without_a_checkpoint_starts_over_with_a_note(tmp_path, in_repo, adalora_run):
    broken = copy_of(adalora_run, tmp_path / "broken")
    (broken / "summary.json").unlink()
    (broken / "status.json").write_text(json.dumps({"status": "failed", "error": "x"}))
    result = runner.invoke(app, ["train", "--resume", str(broken), "--quiet"])
    assert result.exit_code == 0, result.output
    assert f"note: {broken} has no checkpoint yet; starting it over from step 0" in \
        " ".join(result.output.split())
    assert (broken / "metrics.jsonl").read_bytes() == (adalora_run / "metrics.jsonl").read_bytes()
    assert json.loads((broken / "status.json").read_text())["status"] == "finished"


def test_sweep_and_report_paths_that_are_files(tmp_path, in_repo, adalora_run):
    a_file = tmp_path / "file.txt"
    a_file.write_text("x")
    result = runner.invoke(app, ["sweep", SMOKE, "--sweep-dir", str(a_file)])
    assert result.exit_code == 2 and "--sweep-dir" in one_error_line(result)
    result = runner.invoke(app, ["sweep", SMOKE, "--sweep-dir", str(a_file / "sub"), "-q"])
    assert result.exit_code == 1 and "Not a directory" in one_error_line(result)
    result = runner.invoke(app, ["report", str(adalora_run), "--out", str(a_file)])
    assert result.exit_code == 2 and "--out" in one_error_line(result)
    result = runner.invoke(app, ["report", str(adalora_run), "--format", "csv", "--out",
                                 str(a_file / "sub")])
    assert result.exit_code == 2
    assert one_error_line(result) == (f"error: --out {a_file / 'sub'} lies under {a_file}, "
                                      "which is a file; pass a folder for the report (it is "
                                      "created if missing)")


def test_a_huge_budget_is_refused_before_allocating(in_repo):
    """--budget 100000 on the smoke model asked for r0 = 12,500 and was OOM-killed."""
    result = runner.invoke(app, ["sweep", SMOKE, "--budget", "100000", "--dry-run"])
    assert result.exit_code == 2
    assert "adalora.init_rank=12500 exceeds the smallest adapted matrix dimension" in \
        one_error_line(result)


@pytest.mark.parametrize("command", [["train"], ["train", "--dry-run"],
                                     ["sweep", "--budget", "14", "--dry-run"]])
@pytest.mark.parametrize("contents, fragment", [
    # a folder holding one GGUF file loads that file (tasks/gguf.py): here, not a model
    ({"model.gguf": b"GGUF"}, "model.gguf as a model ("),
    ({"README.md": b"notes"}, "has no config.json; set model.name_or_path to a checkpoint"),
])
def test_a_model_folder_without_config_json_is_one_line(in_repo, tmp_path, command,
                                                        contents, fragment):
    folder = tmp_path / "model"
    folder.mkdir()
    for name, data in contents.items():
        (folder / name).write_bytes(data)
    where = ["--run-dir", str(tmp_path / "run")] if command == ["train"] else (
        ["--sweep-dir", str(tmp_path / "sweep")] if command[0] == "sweep" else [])
    result = run_cli(command[0], "configs/smoke/causal_lm.yaml",
                     f"model.name_or_path={folder}", *command[1:], *where)
    assert result.exit_code == 2
    assert fragment in one_error_line(result)
    assert not (tmp_path / "run").exists() and not (tmp_path / "sweep").exists()
