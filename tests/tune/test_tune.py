"""adalora tune on the smoke config: a full search completes with the values the trials
scored, a tune killed in the middle of a trial continues to the same study and choices, a
diverging trial ends pruned, and bad manifests are refused in one line."""

from __future__ import annotations

import io
import json
import math
import os
import sys
from pathlib import Path

import pytest
from rich.console import Console
from typer.testing import CliRunner

from adalora_cli.cli import app
from adalora_cli.config import load_config
from adalora_cli.rundir.run import RunDir, is_finished
from adalora_cli.sweep.runs import run_state
from adalora_cli.sweep.tune.cells import plan_cells
from adalora_cli.sweep.tune.command import _View
from adalora_cli.sweep.tune.manifest import load_tune_manifest
from adalora_cli.sweep.tune.study import open_study, optuna

from .conftest import InProcess, manifest, tune

GRID = [0.001, 0.00464, 0.0215, 0.1]  # 4 points, evenly in log space, 1e-3..1e-1
CELLS = ["glue-adalora-b16", "glue-lora-b16", "glue-loraplus-b16"]


def record(where: Path) -> dict:
    return json.loads((where / "tune.json").read_text())


def heldout_accuracy(run: Path) -> float:
    return json.loads((run / "summary.json").read_text())["metrics"]["heldout"]["accuracy"]


def test_a_smoke_tune_completes(smoke_tune):
    where, launcher, output = smoke_tune
    data = record(where)
    assert [c["name"] for c in data["cells"]] == CELLS
    for cell in data["cells"]:
        trials = cell["trials"]
        # each grid point tried once, every trial told the score its run directory holds
        assert sorted(t["params"]["train.learning_rate"] for t in trials) == GRID
        for t in trials:
            run = where / t["run"]
            assert t["state"] == "complete" and is_finished(run)
            assert t["value"] == heldout_accuracy(run)
            cfg = load_config(run / "config.yaml")
            assert cfg.train.learning_rate == t["params"]["train.learning_rate"]
            assert cfg.task.holdout == 16 and cfg.tune.trial == t["number"]
            info = json.loads((run / "summary.json").read_text())["data"]
            assert (info["train_examples"], info["heldout_examples"]) == (48, 16)
            # scored on the held-out rows only, at every evaluation: the search's points
            scored = {json.loads(line).get("split") for line in
                      (run / "metrics.jsonl").read_text().splitlines()} - {None}
            assert scored == {"heldout"}
            summary = json.loads((run / "summary.json").read_text())
            assert set(summary["metrics"]) == {"heldout"}
        # the choice: the best held-out accuracy, the earliest trial among equals
        best = max(trials, key=lambda t: (t["value"], -t["number"]))
        assert cell["chosen"]["params"] == best["params"]
        # ... run on the manifest's seed as an ordinary run on the whole training split
        seed_run = where / f"{cell['name']}-tuned-s0"
        assert is_finished(seed_run)
        cfg = load_config(seed_run / "config.yaml")
        assert cfg.train.learning_rate == best["params"]["train.learning_rate"]
        assert cfg.task.holdout is None and cfg.tune.study is None
    assert len(launcher.trained) == 12 + 3  # nothing trained twice
    assert "glue-lora-b16: chose train.learning_rate=" in output


def test_the_report_shows_the_search_apart_from_the_results(smoke_tune, tmp_path):
    where, _, _ = smoke_tune
    result = CliRunner().invoke(app, ["report", str(where), "--format", "markdown",
                                      "--out", str(tmp_path / "rep")])
    assert result.exit_code == 0, result.output
    text = (tmp_path / "rep" / "report.md").read_text()
    results, tuning = text.split("## Tuning")
    assert "(1) |" in results and "(4) |" not in results  # seed runs only, no trial pooled
    assert "training 16 rows held out by row hash" in tuning
    assert tuning.count("| 4/4 | 0 | 16 held-out rows |") == 3  # trials run, pruned
    assert (tmp_path / "rep" / "figures" / "tune_lr_tune_smoke-glue-b16.png").is_file()


def test_status_says_where_every_study_stands(smoke_tune, in_repo):
    where, _, _ = smoke_tune
    result = CliRunner().invoke(app, ["tune", str(where / "manifest.yaml"), "--status",
                                      "--sweep-dir", str(where)])
    assert result.exit_code == 0, result.output
    lines = [line for line in result.output.splitlines() if "glue-" in line]
    assert sum("4/4" in line and "0.5625" in line for line in lines) >= 2, result.output
    assert "3 finished" in result.output  # the seed runs, as adalora sweep --status says


class StopsAfterOne(InProcess):
    """Trains the round's first trial, then the tune is stopped (Ctrl-C) mid-round."""

    def launch(self, spec, runs, sweep_dir: Path, quiet: bool = False):
        super().launch(spec, runs[:1], sweep_dir, quiet)
        raise KeyboardInterrupt


def test_status_counts_a_trial_that_ended_before_its_round_did(tmp_path, in_repo):
    """A round of trials is told to the studies when its last trial ends; until then the
    view reads the trials that ended from their run directories."""
    path = manifest(tmp_path, seeds=[0])
    where = tmp_path / "sweep"
    with pytest.raises(KeyboardInterrupt):
        tune(path, where, StopsAfterOne())
    first = sorted(where.glob("*-t000"))
    assert len(first) == 1 and is_finished(first[0])
    cell = first[0].name.rsplit("-t", 1)[0]
    assert [s[1] for s in _study(where, cell)] == ["RUNNING"]  # not told: the round was cut
    result = CliRunner().invoke(app, ["tune", str(path), "--status", "--sweep-dir",
                                      str(where)])
    assert result.exit_code == 0, result.output
    row = next(line for line in result.output.splitlines() if f"{cell} " in line)
    assert "1/4" in row and f"{heldout_accuracy(first[0]):.4g}" in row, result.output
    assert [s[1] for s in _study(where, cell)] == ["RUNNING"]  # --status wrote nothing
    # the live view, redrawn while a round runs, reads them the same way
    spec = load_tune_manifest(path)
    cells = plan_cells(spec)
    view = _View(spec, cells, {c.name: open_study(where, c, spec) for c in cells}, where)
    text = io.StringIO()
    Console(file=text, width=200).print(view)
    row = next(line for line in text.getvalue().splitlines() if f"{cell} " in line)
    assert "1/4" in row and f"{heldout_accuracy(first[0]):.4g}" in row


def test_a_report_of_a_tune_still_searching_says_so(tmp_path, in_repo):
    """Mid-search a tune has finished trials but no results (its seed runs): the report
    says which, and how to see where it stands, instead of only 'no finished runs'."""
    path = manifest(tmp_path, seeds=[0])
    where = tmp_path / "sweep"
    with pytest.raises(KeyboardInterrupt):
        tune(path, where, StopsAfterOne())
    result = CliRunner().invoke(app, ["report", str(where)])
    assert result.exit_code == 2
    # 3 cells of 4 trials; the one that ended was not yet told, and the record counts it
    assert (f"is a tune whose seed runs have not finished (1 of 12 trials of its search "
            "ended; its results are the seed runs of the values it chooses); see where it "
            f"stands with adalora tune {path} --status --sweep-dir {where}"
            ) in " ".join(result.output.split()), result.output
    assert "skipped" not in result.output  # its trials are a tune's, from the start


def _study(where: Path, cell: str) -> list[tuple]:
    from optuna.storages import JournalStorage
    from optuna.storages.journal import JournalFileBackend

    storage = JournalStorage(JournalFileBackend(str(where / "tune" / f"{cell}.journal")))
    study = optuna().load_study(study_name=cell, storage=storage)
    return [(t.number, t.state.name, t.params, t.value, dict(t.intermediate_values))
            for t in study.trials]


class Feeding(InProcess):
    """Trains in this process as a local sweep does with a tune: one launch, each run's
    outcome passed to ``then``, whose runs join the queue."""

    feeds = True

    def __init__(self):
        super().__init__()
        self.calls = 0
        self.joined: list[tuple[str, list[str]]] = []

    def launch(self, spec, runs, sweep_dir: Path, quiet: bool = False, then=None):
        self.calls += 1
        queue, outcomes = list(runs), []
        while queue:
            (o,) = super().launch(spec, [queue.pop(0)], sweep_dir, quiet)
            outcomes.append(o)
            extra = then(o) if then is not None else []
            self.joined.append((o.run.name, [r.name for r in extra]))
            queue += extra
        return outcomes


def test_a_fed_search_makes_the_rounds_choices(smoke_tune, tmp_path, in_repo):
    """Each cell's next trial joins as soon as its last one is told (no round waits for
    the slowest cell), and every study ends as the rounds left it: same trials, values
    and choices."""
    reference, _, _ = smoke_tune
    launcher = Feeding()
    code, output = tune(manifest(tmp_path, seeds=[0]), tmp_path / "sweep", launcher)
    assert code == 0, output
    assert launcher.calls == 2  # the whole search in one launch, then the seed runs
    # a cell's next trial joins the queue as its last one ends, while other cells' first
    # trials still wait: no round
    assert launcher.joined[0] == ("glue-adalora-b16-t000", ["glue-adalora-b16-t001"])
    assert launcher.trained[:3] == [f"{c}-t000" for c in CELLS]
    for cell in ("glue-adalora-b16", "glue-lora-b16", "glue-loraplus-b16"):
        assert _study(tmp_path / "sweep", cell) == _study(reference, cell)
    assert [c["chosen"] for c in record(tmp_path / "sweep")["cells"]] == [
        c["chosen"] for c in record(reference)["cells"]]


@pytest.mark.e2e
def test_a_tune_killed_mid_trial_continues_to_the_same_study(smoke_tune, tmp_path, in_repo):
    reference, _, _ = smoke_tune
    path = manifest(tmp_path, seeds=[0], runs0={"methods": ["lora"]})
    where = tmp_path / "sweep"
    pid = os.fork()
    if pid == 0:  # the tune, killed (SIGKILL, with its trial) at the first trial's step 6
        code = 1
        try:
            os.environ["ADALORA_FAULT"] = "kill@step=6"
            code = tune(path, where, InProcess(), "train.save_every=4")[0]
        finally:
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == -9
    first = where / "glue-lora-b16-t000"
    assert RunDir.read_status(first)["status"] == "running"  # its owner died with it
    assert [s[1] for s in _study(where, "glue-lora-b16")] == ["RUNNING"]
    launcher = InProcess()
    code, output = tune(path, where, launcher, "train.save_every=4")
    assert code == 0, output
    # the killed trial was resumed, not sampled again; nothing else trained twice
    assert launcher.trained[0] == first.name and len(launcher.trained) == 4 + 1
    assert json.loads((first / "summary.json").read_text())["attempts"] == 2
    assert _study(where, "glue-lora-b16") == _study(reference, "glue-lora-b16")
    assert record(where)["cells"][0]["chosen"] == next(
        c for c in record(reference)["cells"] if c["name"] == "glue-lora-b16")["chosen"]


def test_a_diverging_trial_is_pruned_and_says_so(tmp_path, in_repo):
    path = manifest(tmp_path, seeds=[0], pruner={"name": "none"}, runs0={
        "methods": ["lora"], "search": {"train.learning_rate": {"values": [0.01, 10000.0]}}})
    code, output = tune(path, tmp_path / "sweep")
    assert code == 0, output
    trials = {t["params"]["train.learning_rate"]: t for t in record(tmp_path / "sweep")[
        "cells"][0]["trials"]}
    assert trials[10000.0]["state"] == "pruned" and trials[0.01]["state"] == "complete"
    status = RunDir.read_status(tmp_path / "sweep" / trials[10000.0]["run"])
    assert status["status"] == "pruned" and "diverged" in status["reason"]
    assert status["step"] == 3  # the step whose loss became nan, as the run's log said
    assert not (tmp_path / "sweep" / trials[10000.0]["run"] / "summary.json").exists()
    assert run_state(tmp_path / "sweep" / trials[10000.0]["run"]) == "pruned"  # never resumed
    assert record(tmp_path / "sweep")["cells"][0]["chosen"]["params"] == {
        "train.learning_rate": 0.01}


def test_a_gsm8k_trial_reports_its_held_out_accuracy(tmp_path, in_repo, monkeypatch):
    """gsm8k_metamath's trials are scored on rows of GSM8K's train split: the study is told
    their final-answer accuracy at every evaluation. The random smoke model answers nothing
    right, so a stand-in generation answers GSM8K-train questions about apples, and only
    those (none of the test questions)."""
    from adalora_cli.tasks.gsm8k import Gsm8kMetaMathTask, parse_answer
    from tests.tasks.test_gsm8k import lowest_hashes, rows

    known = {r["question"]: parse_answer(r["answer"]) for r in rows("gsm8k_train.jsonl")
             if "apples" in r["question"]}

    def generate(self, model, prompts, **kwargs):
        asked = [self.tokenizer.decode(p, skip_special_tokens=True).removeprefix(
            "Question: ").removesuffix(" Think step by step.\nAnswer:") for p in prompts]
        return [f"The answer is: {known[q]}" if q in known else "no idea" for q in asked]

    monkeypatch.setattr(Gsm8kMetaMathTask, "generate", generate)
    path = manifest(tmp_path, seeds=[0], holdout=4, metric="accuracy",
                    overrides=["train.eval_every=4"], runs0={
                        "configs": ["configs/smoke/gsm8k.yaml"], "methods": ["lora"],
                        "budgets": None, "search": {"train.learning_rate": {"values": [0.05]}}})
    code, output = tune(path, tmp_path / "sweep")
    assert code == 0, output
    cell = record(tmp_path / "sweep")["cells"][0]
    assert cell["metric"] == "heldout/accuracy"
    held = lowest_hashes(rows("gsm8k_train.jsonl"), 4)
    expected = 100.0 * sum("apples" in r["question"] for r in held) / 4
    [trial] = cell["trials"]
    assert trial["value"] == expected == heldout_accuracy(tmp_path / "sweep" / trial["run"])
    summary = json.loads((tmp_path / "sweep" / trial["run"] / "summary.json").read_text())
    # a trial scores only what its study reads; the seed run scores GSM8K test, where the
    # stand-in answers nothing
    assert expected > 0 and set(summary["metrics"]) == {"heldout"}
    seed_run = tmp_path / "sweep" / f"{cell['name']}-tuned-s0" / "summary.json"
    assert set(json.loads(seed_run.read_text())["metrics"]) == {"validation"}
    assert json.loads(seed_run.read_text())["metrics"]["validation"]["accuracy"] == 0
    assert trial["reported"] == {"4": expected}  # step 8 is the end: its value above


def test_a_gsm8k_tune_refuses_more_held_out_rows_than_gsm8k_train_has(tmp_path, in_repo):
    path = manifest(tmp_path, holdout=13, metric="accuracy", runs0={
        "configs": ["configs/smoke/gsm8k.yaml"], "methods": ["lora"], "budgets": None})
    where = tmp_path / "sweep"
    result = CliRunner().invoke(app, ["tune", str(path), "--sweep-dir", str(where)])
    assert result.exit_code == 2, result.output
    assert result.output.strip() == (
        "error: task.holdout=13 asks for more rows than GSM8K's train split has (12 in "
        "tests/fixtures/gsm8k/gsm8k_train.jsonl); hold out at most task.holdout=12")
    assert not where.exists()  # before any trial


@pytest.mark.parametrize("changes, words", [
    ({"runs0": {"search": {"train.learning_rate": {"low": 0.01, "high": 0.01}}}},
     "range 0.01..0.01 is empty"),
    ({"runs0": {"search": {"train.learning_rate": {"low": 0.1, "high": 0.001}}}},
     "range 0.1..0.001 is inverted"),
    ({"runs0": {"search": {"train.learning_rte": {"values": [0.01]}}}},
     "search.train.learning_rte is not a config key"),
    ({"sampler": {"name": "anneal"}}, "unknown sampler 'anneal'"),
    ({"pruner": {"name": "hyperband"}}, "unknown pruner 'hyperband'"),
    ({"holdout": 64}, "task.holdout=64 holds out at least the whole training split (64 rows"),
    ({"runs0": {"methods": ["lora"], "search": {"sora.l1": {"values": [1.0, 10.0]}}}},
     "method lora does not read sora.l1"),
    ({"runs0": {"search": {"task.holdout": {"values": [8, 16]}}}},
     "search.task.holdout is set by the tune itself"),
    ({"overrides": ["train.max_steps=16", "train.eval_every=null"]},
     "stops trials at their periodic evaluations, and glue-adalora-b16 has none"),
    ({"select_on": "test"}, "select_on 'test' must be heldout"),
])
def test_bad_manifests_are_one_line_and_exit_2(tmp_path, in_repo, changes, words):
    path = manifest(tmp_path, **changes)
    where = tmp_path / "sweep"
    result = CliRunner().invoke(app, ["tune", str(path), "--sweep-dir", str(where)])
    assert result.exit_code == 2, result.output
    lines = result.output.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and words in lines[0], lines
    assert not where.exists()  # refused before anything was written


def test_a_config_stating_b_t_as_target_rank_takes_a_search(in_repo):
    """configs/smoke/gsm8k.yaml sets adalora.target_rank, so its budget keeps the default
    144: the two read back as both set unless the default one is dropped."""
    from adalora_cli.config import ConfigError
    from adalora_cli.sweep.tune.space import Space, check_key

    cfg = load_config("configs/smoke/gsm8k.yaml", ["method.name=adalora"])
    assert (cfg.adalora.target_rank, cfg.adalora.budget) == (2.0, 144)
    check_key(Space("train.learning_rate", low=1e-3, high=1e-1, log=True), "adalora", cfg,
              "here")
    check_key(Space("adalora.budget", values=(4, 8)), "adalora", cfg, "here")  # replaces it
    with pytest.raises(ConfigError, match="search.adalora.target_rank value -1.0 is refused"):
        check_key(Space("adalora.target_rank", values=(2.0, -1.0)), "adalora", cfg, "here")


def test_the_held_out_rows_do_not_depend_on_the_file_order():
    import datasets

    from adalora_cli.tasks.data import carve_holdout, row_key

    rows = [{"sentence": f"row {i}", "label": i % 2} for i in range(20)]
    a = carve_holdout({"train": datasets.Dataset.from_list(rows)}, 5, "here")
    b = carve_holdout({"train": datasets.Dataset.from_list(rows[::-1])}, 5, "here")
    held = sorted(r["sentence"] for r in a["heldout"])
    assert held == sorted(r["sentence"] for r in b["heldout"])
    # the five rows of lowest sha256, computed here independently
    assert held == sorted(r["sentence"] for r in sorted(rows, key=row_key)[:5])
    assert len(a["train"]) == 15 and not set(held) & {r["sentence"] for r in a["train"]}
    assert math.isclose(len(a["heldout"]) / 20, 0.25)


@pytest.mark.slow
@pytest.mark.e2e
def test_a_tune_on_slurm_prunes_through_the_job_and_chooses(tmp_path, in_repo):
    """The SLURM launcher through submitit's local executor (real `adalora train`
    processes in job arrays, about 90 s on 2 cores): a trial's exit 76 is pruned, not failed."""
    from adalora_cli.sweep.slurm import SlurmLauncher
    from adalora_cli.sweep.slurm_options import parse_slurm

    path = manifest(tmp_path, seeds=[0], pruner={"name": "none"}, runs0={
        "methods": ["lora"], "search": {"train.learning_rate": {"values": [0.01, 10000.0]}}})
    launcher = SlurmLauncher(parse_slurm(["time=10,gpus_per_job=0"]), cluster="local",
                             wait=True, poll_seconds=0.5)
    code, output = tune(path, tmp_path / "sweep", launcher)
    assert code == 0, output
    cell = record(tmp_path / "sweep")["cells"][0]
    assert sorted((t["params"]["train.learning_rate"], t["state"]) for t in cell["trials"]) == [
        (0.01, "complete"), (10000.0, "pruned")]
    assert cell["chosen"]["params"] == {"train.learning_rate": 0.01}
    assert is_finished(tmp_path / "sweep" / "glue-lora-b16-tuned-s0")


def test_without_optuna_it_says_how_to_install_the_extra(tmp_path, in_repo, monkeypatch):
    monkeypatch.setitem(sys.modules, "optuna", None)  # import optuna raises ImportError
    path = manifest(tmp_path)
    result = CliRunner().invoke(app, ["tune", str(path), "--sweep-dir", str(tmp_path / "s")])
    assert result.exit_code == 2
    assert result.output.strip() == ("error: adalora tune needs optuna: pip install -e "
                                     "'.[tune]' in the adalora checkout (make install "
                                     "includes it)")
    assert not (tmp_path / "s").exists()
