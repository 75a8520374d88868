"""SLURM without accounting: a run whose recorded job may still wait in the queue is never
submitted a second time unless asked. The job states come from sacct, else squeue (which
lists only queued and running jobs), else nowhere; every status says which tool answered.
Fake ``sacct``/``squeue``/``srun`` scripts on PATH stand in for a cluster."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import pytest
import submitit
from typer.testing import CliRunner

from adalora_cli.cli import app
from adalora_cli.sweep.plan import build_spec, plan
from adalora_cli.sweep.slurm import SlurmLauncher, make_executor
from adalora_cli.sweep.slurm_options import parse_slurm
from adalora_cli.sweep.status import sweep_states, write_records

SMOKE = "configs/smoke/glue.yaml"
OPTS = parse_slurm(["time=10"])
runner = CliRunner()


def _tool(bin_dir: Path, name: str, stdout: str = "", code: int = 0) -> None:
    script = bin_dir / name
    script.write_text(f"#!/bin/sh\nprintf '{stdout}'\nexit {code}\n")
    script.chmod(0o755)


@pytest.fixture()
def cluster(tmp_path, monkeypatch, in_repo):
    """Two runs, each submitted once as a task of job array 100; only srun on PATH."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    _tool(bin_dir, "srun")
    monkeypatch.setenv("PATH", str(bin_dir))
    spec = build_spec(Path(SMOKE), None, "lora,bitfit", "0")
    runs = plan(spec)
    where = tmp_path / "sweep"
    where.mkdir()
    write_records(where, {r.name: {"job_id": f"100_{i}", "cluster": "slurm",
                                   "submitted": "2026-01-01T00:00:00+00:00"}
                          for i, r in enumerate(runs)})
    return bin_dir, spec, runs, where


def _launch(spec, runs, where, monkeypatch, **kwargs) -> tuple[list[str], dict]:
    """Launch with sbatch replaced: (the runs it would submit, {run: outcome state})."""
    submitted: list[str] = []

    def fake_submit(self, spec, todo, sweep_dir):
        submitted.extend(r.name for r in todo)
        return {r.name: SimpleNamespace(job_id=f"200_{i}") for i, r in enumerate(todo)}

    monkeypatch.setattr(SlurmLauncher, "_submit", fake_submit)
    outcomes = SlurmLauncher(OPTS, **kwargs).launch(spec, runs, where)
    return submitted, {o.run.name: o.status for o in outcomes}


def test_without_sacct_and_squeue_a_recorded_run_is_unknown_and_kept(cluster, monkeypatch):
    _, spec, runs, where = cluster
    rows = sweep_states(runs, where)
    assert [(r.state, r.job) for r in rows] == [("unknown", "100_0"), ("unknown", "100_1")]
    assert all("no sacct or squeue" in r.source for r in rows)
    assert "may still be queued" in rows[0].detail
    submitted, states = _launch(spec, runs, where, monkeypatch)
    assert submitted == [] and set(states.values()) == {"unknown"}
    submitted, _ = _launch(spec, runs, where, monkeypatch, resubmit=True)
    assert submitted == [r.name for r in runs]  # asked for: both go again


def test_squeue_tells_queued_from_ended(cluster, monkeypatch):
    bin_dir, spec, runs, where = cluster
    _tool(bin_dir, "squeue", "100_0 PENDING\\n999_3 RUNNING\\n")  # 100_1 has left the queue
    rows = sweep_states(runs, where)
    assert [(r.state, r.detail) for r in rows] == [("queued", "job pending"),
                                                  ("not started", "")]
    assert {r.source for r in rows} == {"squeue"}
    submitted, states = _launch(spec, runs, where, monkeypatch)
    assert submitted == [runs[1].name]
    assert states == {runs[0].name: "queued", runs[1].name: "submitted"}


def test_a_failing_sacct_falls_back_to_squeue(cluster, monkeypatch):
    bin_dir, _, runs, where = cluster
    _tool(bin_dir, "sacct", "sacct: error: Slurm accounting storage is disabled\\n", code=1)
    _tool(bin_dir, "squeue", "100_1 RUNNING\\n")
    rows = sweep_states(runs, where)
    assert [r.state for r in rows] == ["not started", "running"]
    # sacct's refusal said once, in the source line; submitit is not asked (it would warn)
    assert rows[0].source == "squeue (sacct refused: Slurm accounting storage is disabled)"


def test_squeue_failing_counts_as_no_answer(cluster):
    bin_dir, _, runs, where = cluster
    _tool(bin_dir, "squeue", "slurm_load_jobs error\\n", code=1)
    assert [r.state for r in sweep_states(runs, where)] == ["unknown", "unknown"]


def test_a_job_that_logged_its_end_is_not_unknown(cluster):
    """The job's own last event in sweep_log.jsonl says whether it left the queue: both
    runs stopped with a checkpoint, but only job 100_0 was requeued."""
    _, _, runs, where = cluster
    for run in runs:
        (where / run.name).mkdir()
        (where / run.name / "config.yaml").write_text("{}\n")
        (where / run.name / "status.json").write_text('{"status": "preempted", "step": 4}')
    with open(where / "sweep_log.jsonl", "a") as f:
        f.write(json.dumps({"run": runs[1].name, "event": "preempted", "job": "100_1"}) + "\n")
        f.write(json.dumps({"run": runs[0].name, "event": "requeued", "job": "100_0"}) + "\n")
    assert [r.state for r in sweep_states(runs, where)] == ["unknown", "preempted"]


def test_status_names_its_source_and_the_way_out(cluster):
    bin_dir, _, _, where = cluster
    result = runner.invoke(app, ["sweep", SMOKE, "--methods", "lora,bitfit", "--seeds", "0",
                                 "--sweep-dir", str(where), "--status"],
                           env={"COLUMNS": "250"})
    assert result.exit_code == 0, result.output
    assert "2 runs: 2 unknown" in result.stdout
    assert "job states from: none for SLURM jobs (no sacct or squeue answered)" in result.stdout
    assert "add --resubmit" in result.stdout
    _tool(bin_dir, "squeue", "100_0 PENDING\\n100_1 PENDING\\n")
    result = runner.invoke(app, ["sweep", SMOKE, "--methods", "lora,bitfit", "--seeds", "0",
                                 "--sweep-dir", str(where), "--status"],
                           env={"COLUMNS": "250"})
    assert "2 runs: 2 queued" in result.stdout and "job states from: squeue" in result.stdout


def test_resubmit_is_for_slurm_only(in_repo, tmp_path):
    result = runner.invoke(app, ["sweep", SMOKE, "--resubmit", "--sweep-dir",
                                 str(tmp_path / "s")])
    assert result.exit_code == 2 and "--resubmit is for --launcher slurm" in result.stderr


def _sbatch_lines(tmp_path, monkeypatch, items: list[str]) -> list[str]:
    monkeypatch.setattr(submitit.SlurmExecutor, "affinity", classmethod(lambda cls: 2))
    executor = make_executor(tmp_path, parse_slurm(items), "adalora-x")
    text = executor._make_submission_file_text("python -m submitit.core._submit X", "u")
    return [line for line in text.splitlines() if line.startswith("#SBATCH")]


def test_jobs_that_may_be_requeued_ask_sbatch_for_requeue(tmp_path, monkeypatch):
    assert "#SBATCH --requeue" in _sbatch_lines(tmp_path, monkeypatch, ["time=60"])
    lines = _sbatch_lines(tmp_path, monkeypatch, ["time=60,requeues=0"])
    assert not any(line.endswith("requeue") for line in lines)
    lines = _sbatch_lines(tmp_path, monkeypatch, ["time=60,sbatch.no-requeue="])
    assert "#SBATCH --no-requeue" in lines and "#SBATCH --requeue" not in lines


def test_wait_ends_when_the_jobs_leave_the_queue_without_a_result(cluster):
    """A cancelled job writes no result file, and without accounting submitit's own
    ``done()`` never learns it ended: ``--wait`` asks the queue instead."""
    import threading

    bin_dir, _, runs, where = cluster
    queue = bin_dir / "queue.txt"
    queue.write_text("100_0 RUNNING\n100_1 PENDING\n")
    (bin_dir / "squeue").write_text(f"#!/bin/sh\n/bin/cat {queue}\n")
    (bin_dir / "squeue").chmod(0o755)
    never = SimpleNamespace(done=lambda: False,
                            paths=SimpleNamespace(result_pickle=where / "no-result.pkl"))
    launcher = SlurmLauncher(OPTS, wait=True, poll_seconds=0.05)
    waiting = threading.Thread(target=launcher._wait, daemon=True,
                               args=({r.name: never for r in runs}, where))
    waiting.start()
    waiting.join(1.0)
    assert waiting.is_alive()  # both jobs are still in the queue
    queue.write_text("100_0 CANCELLED\n")  # 100_1 cancelled while waiting: gone
    waiting.join(10.0)
    assert not waiting.is_alive()
