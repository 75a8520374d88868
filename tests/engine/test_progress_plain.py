"""Without a terminal on stdout (``make demo > log``, a sweep's log file) training prints
one plain progress line per interval; on a terminal it prints none (the bar shows)."""

from __future__ import annotations

import io
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from adalora_cli.config import ConfigError
from adalora_cli.engine import progress as progress_module
from adalora_cli.engine.progress import TrainProgress, clock_text, parse_every

ROOT = Path(__file__).resolve().parents[2]
LINE = re.compile(r"^step (\d+)/(\d+) \((\d+)%\)  loss (\S+)  lr (\S+)(?:  budget (\d+))?  "
                  r"elapsed (\S+)  eta (\S+)$")


@pytest.mark.e2e
def test_a_piped_training_run_prints_plain_lines(tmp_path):
    """The real CLI with stdout a pipe: a line every 8 steps of the smoke run's 32, whose
    numbers are the rows of metrics.jsonl."""
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1",
           "ADALORA_PROGRESS_EVERY": "8", "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"}
    out = tmp_path / "run"
    done = subprocess.run([sys.executable, "-m", "adalora_cli", "train",
                           "configs/smoke/glue.yaml", "--run-dir", str(out)],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr
    lines = [m for m in map(LINE.match, done.stdout.splitlines()) if m]
    assert [int(m[1]) for m in lines] == [8, 16, 24, 32]
    assert {int(m[2]) for m in lines} == {32}
    assert [int(m[3]) for m in lines] == [25, 50, 75, 100]
    rows = {r["step"]: r for r in map(json.loads, (out / "metrics.jsonl").read_text()
                                      .splitlines()) if "split" not in r}
    for m in lines:
        row = rows[int(m[1])]
        assert m[4] == f"{row['loss']:.4f}" and m[5] == f"{row['lr']:.2e}"
        assert int(m[6]) == row["budget"]  # AdaLoRA's budget b(t) at that step
    assert lines[-1][8] == "0:00:00"  # nothing left at the last step
    assert "evaluating validation" in done.stdout  # eval_every 16: the note gets a line too
    assert "━" not in done.stderr  # no bar frames in a log: stderr is not a terminal


class FakeClock:
    def __init__(self):
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def _drive(monkeypatch, every: str | None, tty: bool, steps: int, dt: float,
           total: int = 10, start: int = 0) -> list[str]:
    out = io.StringIO()
    out.isatty = lambda: tty  # type: ignore[method-assign]
    monkeypatch.setattr(sys, "stdout", out)
    if every is None:
        monkeypatch.delenv(progress_module.ENV, raising=False)
    else:
        monkeypatch.setenv(progress_module.ENV, every)
    clock = FakeClock()
    with TrainProgress(total=total, start=start, clock=clock) as bar:
        for step in range(start + 1, start + steps + 1):
            clock.now += dt
            bar.advance(step, {"step": step, "loss": 0.5, "lr": 1e-3})
    return out.getvalue().splitlines()


def test_seconds_interval_and_eta(monkeypatch):
    # 12 s a step, a line at most every 30 s: steps 3, 6, 9 (36 s apart), and the last
    lines = _drive(monkeypatch, "30s", tty=False, steps=10, dt=12.0)
    assert [line.split()[1] for line in lines] == ["3/10", "6/10", "9/10", "10/10"]
    # at step 3: 36 s for 3 steps, 7 to go at 12 s each = 84 s
    assert lines[0] == "step 3/10 (30%)  loss 0.5000  lr 1.00e-03  elapsed 0:00:36  eta 0:01:24"


def test_the_default_is_every_30_seconds(monkeypatch):
    lines = _drive(monkeypatch, None, tty=False, steps=10, dt=10.0)
    assert [line.split()[1] for line in lines] == ["3/10", "6/10", "9/10", "10/10"]


def test_a_resumed_run_counts_its_rate_from_its_own_steps(monkeypatch):
    lines = _drive(monkeypatch, "2", tty=False, steps=4, dt=5.0, total=10, start=4)
    assert [line.split()[1] for line in lines] == ["6/10", "8/10"]
    # step 6: 2 steps in 10 s, 4 to go = 20 s
    assert lines[0].endswith("elapsed 0:00:10  eta 0:00:20")


def test_an_evaluation_before_training_stays_out_of_the_eta(monkeypatch):
    out = io.StringIO()
    out.isatty = lambda: False  # type: ignore[method-assign]
    monkeypatch.setattr(sys, "stdout", out)
    monkeypatch.setenv(progress_module.ENV, "1")
    clock = FakeClock()
    with TrainProgress(total=4, clock=clock) as bar:
        clock.now += 600.0  # ten minutes of scoring the base model
        bar.scores(0, "validation", {"accuracy": 0.5})
        bar.restart_clock()
        clock.now += 5.0
        bar.advance(1, {"step": 1, "loss": 0.5, "lr": 1e-3})
    lines = out.getvalue().splitlines()
    assert lines[0] == "step 0/4  validation: accuracy 0.5000"
    # 5 s for step 1, 3 to go: the 600 s before training count in neither
    assert lines[1].endswith("elapsed 0:00:05  eta 0:00:15")


def test_no_plain_lines_on_a_terminal_or_when_off(monkeypatch):
    assert _drive(monkeypatch, "1", tty=True, steps=10, dt=1.0) == []
    assert _drive(monkeypatch, "0", tty=False, steps=10, dt=1.0) == []


def test_quiet_prints_nothing(monkeypatch):
    out = io.StringIO()
    monkeypatch.setattr(sys, "stdout", out)
    monkeypatch.setenv(progress_module.ENV, "1")
    with TrainProgress(total=3, disable=True) as bar:
        bar.advance(1, {"step": 1, "loss": 0.5, "lr": 1e-3})
    assert out.getvalue() == ""


@pytest.mark.parametrize("text, parsed", [("30s", (0, 30.0)), ("100", (100, 0.0)),
                                          ("0", (0, 0.0)), ("2.5S", (0, 2.5))])
def test_parse_every(text, parsed):
    assert parse_every(text) == parsed


@pytest.mark.parametrize("text", ["soon", "-3", "-1s", ""])
def test_a_bad_interval_is_one_line(text):
    with pytest.raises(ConfigError) as e:
        parse_every(text)
    assert "ADALORA_PROGRESS_EVERY" in str(e.value) and "\n" not in str(e.value)


@pytest.mark.e2e
def test_a_bad_interval_stops_train_before_a_run_directory(tmp_path, in_repo):
    env = {**os.environ, "PYTHONPATH": str(ROOT), "ADALORA_PROGRESS_EVERY": "often"}
    done = subprocess.run([sys.executable, "-m", "adalora_cli", "train",
                           "configs/smoke/glue.yaml", "--run-dir", str(tmp_path / "r")],
                          env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 2
    assert done.stderr.strip().startswith("error: ADALORA_PROGRESS_EVERY='often'")
    assert not (tmp_path / "r").exists()


def test_clock_text():
    assert clock_text(3725.4) == "1:02:05" and clock_text(0) == "0:00:00"
