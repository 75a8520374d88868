"""``adalora report`` on run directories built here with known numbers.

Every expected value is worked out by hand (or by scipy for p-values) from the numbers
written into the fixtures, never read back from the implementation.
"""

from __future__ import annotations

import csv
import errno
import io
import json
import math
import os
from pathlib import Path

import pytest
import yaml
from rich.console import Console
from scipy import stats
from typer.testing import CliRunner

from adalora_cli.cli import app
from adalora_cli.report import paper as paper_results
from adalora_cli.report.figures import mean_rank_pattern, write_figures
from adalora_cli.report.render import render_csv, render_latex, render_markdown, render_rich
from adalora_cli.report.tables import build_report, welch_p

runner = CliRunner()


def make_run(root: Path, name: str, task: str, method: str, seed: int, metrics: dict,
             level: int | None = None, params: int = 1000, final: int | None = None,
             status: str = "finished", size: dict | None = None, orth: list | None = None,
             pattern: dict | None = None, seconds: float = 10.0, epochs: float = 2.0,
             memory: int = 2**30) -> Path:
    """A run directory as ``adalora train`` leaves it (only the files the report reads)."""
    path = root / name
    path.mkdir(parents=True)
    config = {"method": {"name": method}, "adalora": {"init_rank": 4, "budget": level or 16},
              "lora": {"r": 2}, "adapter": {"dim": 8}, "train": {"seed": seed, "epochs": 3},
              "sweep": {"budget_level": level}}
    for section, values in (size or {}).items():
        config[section].update(values)
    (path / "config.yaml").write_text(yaml.safe_dump(config))
    (path / "status.json").write_text(json.dumps({"status": status}))
    if status == "finished":
        summary = {"task": task, "method": method, "seed": seed, "adapter_params": params,
                   "metrics": metrics, "train_seconds": seconds, "epochs": epochs,
                   "peak_memory_bytes": memory, "device": "cpu", "budget_level": level}
        if final is not None:
            summary["final_adapter_params"] = final
        (path / "summary.json").write_text(json.dumps(summary))
    rows = [{"step": s, "loss": 0.5, "orth_reg": v} for s, v in (orth or [])]
    (path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    if pattern is not None:
        (path / "rank_pattern.json").write_text(json.dumps(pattern))
    return path


def acc(value: float) -> dict:
    return {"validation": {"accuracy": value}}


# RTE accuracies per seed: LoRA and AdaLoRA at b(T) 144, one BitFit run.
LORA_RTE = [0.80, 0.82, 0.84]      # mean 82.0, deviations -2 0 2: sample var 8/2 -> std 2.0
ADA_RTE = [0.85, 0.87, 0.86]       # mean 86.0, deviations -1 1 0: sample var 2/2 -> std 1.0
PATTERN = "bert.encoder.layer.{}.attention.self.query"


@pytest.fixture()
def runs(tmp_path) -> Path:
    root = tmp_path / "runs"
    for seed, (lo, ada) in enumerate(zip(LORA_RTE, ADA_RTE)):
        make_run(root / "sweep-a", f"rte-lora-s{seed}", "rte", "lora", seed, acc(lo), 144,
                 params=800, orth=None)
        # nested one level deeper on purpose: the report finds runs at any depth
        make_run(root / "sweep-b" / "deep", f"rte-adalora-s{seed}", "rte", "adalora", seed,
                 acc(ada), 144, params=1200, final=600 + 100 * seed,
                 orth=[(1, 2.0), (2, 1.0 + seed)],
                 pattern={PATTERN.format(0): seed, PATTERN.format(1): 4})
    make_run(root, "rte-bitfit-s0", "rte", "bitfit", 0, acc(0.75), None, params=500)
    # SST-2 for LoRA only: 0.90 and 0.94 -> 92.0 +- 2.83 (sqrt(8))
    for seed, value in enumerate([0.90, 0.94]):
        make_run(root, f"sst2-lora-s{seed}", "sst2", "lora", seed, acc(value), 144, params=800)
    return root


def test_cells_mean_std_and_seed_count(runs):
    report = build_report([runs])
    assert report.skipped == [] and len(report.runs) == 9
    (table,) = report.tables
    assert [c.key for c in table.columns] == ["sst2:Acc", "rte:Acc"]  # paper column order
    rows = {(r.method, r.budget_level): r for r in table.rows}
    # BitFit (no budget level) first, then the 144 level, LoRA before AdaLoRA
    assert [(r.method, r.budget_level) for r in table.rows] == [
        ("bitfit", None), ("lora", 144), ("adalora", 144)]
    lora, ada = rows[("lora", 144)], rows[("adalora", 144)]
    assert lora.cells["rte:Acc"].mean == pytest.approx(82.0)
    assert lora.cells["rte:Acc"].std == pytest.approx(2.0)
    assert ada.cells["rte:Acc"].mean == pytest.approx(86.0)
    assert ada.cells["rte:Acc"].std == pytest.approx(1.0)
    assert ada.cells["rte:Acc"].n == 3 and lora.cells["sst2:Acc"].n == 2
    assert lora.cells["sst2:Acc"].std == pytest.approx(math.sqrt(8))
    assert rows[("bitfit", None)].cells["rte:Acc"].std is None  # one seed: no spread
    # "# Params" as the paper counts it: AdaLoRA after pruning, (600 + 700 + 800) / 3
    assert ada.params == pytest.approx(700) and lora.params == 800
    assert table.best("rte:Acc") == pytest.approx(86.0)
    # All Ave. over the tasks present (a row missing one has none); the paper's All Ave.
    # covers all eight tasks, so it is not comparable here
    assert table.has_all_ave and not table.paper_all_ave
    assert lora.all_ave == pytest.approx((92.0 + 82.0) / 2) and ada.all_ave is None


def test_welch_p_against_scipy():
    cases = [(LORA_RTE, ADA_RTE), ([1.0, 2.0, 4.0, 8.0], [3.0, 3.5]),
             ([90.1, 90.4, 89.9, 90.6, 90.2], [90.7, 90.9, 90.5, 91.2, 90.6])]
    for a, b in cases:
        assert welch_p(a, b) == pytest.approx(stats.ttest_ind(a, b, equal_var=False).pvalue,
                                              rel=1e-9)
    assert welch_p([1.0], [2.0, 3.0]) is None  # fewer than two seeds
    assert math.isnan(welch_p([1.0, 1.0], [1.0, 1.0]))


def test_comparison_with_lora(runs):
    report = build_report([runs])
    (comp,) = [c for c in report.comparisons if c.column == "rte:Acc"]
    assert comp.row.method == "adalora" and comp.baseline.method == "lora"
    assert comp.diff == pytest.approx(4.0)
    expected = stats.ttest_ind([100 * v for v in ADA_RTE], [100 * v for v in LORA_RTE],
                               equal_var=False).pvalue
    assert comp.p == pytest.approx(expected, rel=1e-9)
    # BitFit has no budget level, so it has no LoRA to be compared with
    assert all(c.row.method == "adalora" for c in report.comparisons)


SORA_RTE = [0.83, 0.86, 0.83]      # mean 84.0: 4.0 below AdaLoRA's 86.0, 2.0 above LoRA's


def test_comparison_against_adalora(runs):
    for seed, value in enumerate(SORA_RTE):
        make_run(runs / "sweep-c", f"rte-sora-s{seed}", "rte", "sora", seed, acc(value), 144)
    report = build_report([runs], against="adalora")
    comps = {c.row.method: c for c in report.comparisons}
    assert set(comps) == {"lora", "sora"}  # BitFit has no level, SST-2 no AdaLoRA row
    assert all(c.baseline.method == "adalora" and c.column == "rte:Acc" for c in comps.values())
    assert comps["lora"].diff == pytest.approx(82.0 - 86.0)
    assert comps["sora"].diff == pytest.approx(84.0 - 86.0)
    for method, values in (("lora", LORA_RTE), ("sora", SORA_RTE)):
        expected = stats.ttest_ind([100 * v for v in values], [100 * v for v in ADA_RTE],
                                   equal_var=False).pvalue
        assert comps[method].p == pytest.approx(expected, rel=1e-9)
    text = render_markdown(report)
    assert "Against AdaLoRA at the same budget level" in text and "Against LoRA" not in text
    assert "| SoRA | 144 | AdaLoRA |  | -2.00 (p 0.176) |" in text, text
    rows = list(csv.DictReader(io.StringIO(render_csv(report))))
    sora = next(r for r in rows if r["method"] == "sora")
    assert float(sora["diff_vs_adalora"]) == pytest.approx(-2.0)
    assert "diff_vs_lora" not in rows[0]
    # the default stays LoRA: its CSV columns keep their names
    assert "diff_vs_lora" in render_csv(build_report([runs])).splitlines()[0]


def test_cli_against_adalora_and_its_errors(runs):
    result = runner.invoke(app, ["report", str(runs), "--format", "markdown", "--against",
                                 "adalora"])
    assert result.exit_code == 0, result.output
    assert "| LoRA r=2 | 144 | AdaLoRA |  | -4.00 (p 0.055) |" in result.stdout
    for name, fragment in (("nosuch", "unknown --against 'nosuch'; choose a method name: "),
                           ("sora", "--against sora: no finished sora runs under ")):
        result = runner.invoke(app, ["report", str(runs), "--against", name])
        assert result.exit_code == 2
        lines = [line for line in result.stderr.splitlines() if line.strip()]
        assert len(lines) == 1 and lines[0].startswith("error: " + fragment), result.stderr
    assert "the methods there: adalora, bitfit, lora" in lines[0]


def glue_metrics(task: str, v: float) -> dict:
    if task == "mnli":
        return {"validation_matched": {"accuracy": v},
                "validation_mismatched": {"accuracy": v + 0.01}}
    if task == "qqp":
        return {"validation": {"accuracy": v, "f1": v - 0.02}}
    if task == "stsb":  # no "corr": the report averages pearson and spearman
        return {"validation": {"pearson": v, "spearman": v + 0.02}}
    if task == "cola":
        return {"validation": {"matthews": v}}
    return acc(v)


def test_glue_columns_and_all_average(tmp_path):
    tasks = ["mnli", "sst2", "cola", "qqp", "qnli", "rte", "mrpc", "stsb"]
    for i, task in enumerate(tasks):
        make_run(tmp_path, f"{task}-ada", task, "adalora", 0, glue_metrics(task, 0.80 + i / 100),
                 576)
    make_run(tmp_path, "rte-lora", "rte", "lora", 0, acc(0.5), 576)  # lacks 7 tasks
    (table,) = build_report([tmp_path]).tables
    assert [c.key for c in table.columns] == [
        "mnli:m", "mnli:mm", "sst2:Acc", "cola:Mcc", "qqp:Acc", "qqp:F1", "qnli:Acc",
        "rte:Acc", "mrpc:Acc", "stsb:Corr"]
    ada = next(r for r in table.rows if r.method == "adalora")
    assert ada.cells["mnli:mm"].mean == pytest.approx(81.0)
    assert ada.cells["qqp:F1"].mean == pytest.approx(81.0)     # 0.83 - 0.02
    assert ada.cells["stsb:Corr"].mean == pytest.approx(88.0)  # (0.87 + 0.89) / 2
    # by hand: per-task scores mnli 80.5, sst2 81, cola 82, qqp 82 (83, 81), qnli 84,
    # rte 85, mrpc 86, stsb 88 -> 668.5 / 8
    assert ada.all_ave == pytest.approx(668.5 / 8)
    assert table.has_all_ave and table.paper_all_ave
    assert next(r for r in table.rows if r.method == "lora").all_ave is None


def test_all_average_reproduces_the_papers_column(tmp_path):
    """Our All Ave. applied to the paper's own rows gives the paper's All Ave. (to its
    rounding), which also checks that the twelve rows were copied consistently."""
    tasks = {"mnli": ("m", "mm"), "sst2": ("Acc",), "cola": ("Mcc",), "qqp": ("Acc", "F1"),
             "qnli": ("Acc",), "rte": ("Acc",), "mrpc": ("Acc",), "stsb": ("Corr",)}
    names = {"mnli": ("validation_matched", "validation_mismatched")}
    metric = {"Acc": "accuracy", "Mcc": "matthews", "F1": "f1", "Corr": "corr"}
    rows = paper_results.TABLES["Table 1 (GLUE, DeBERTaV3-base)"]
    for (method, level), values in rows.items():
        for task, labels in tasks.items():
            if task == "mnli":
                m = {names["mnli"][i]: {"accuracy": values[f"mnli:{lab}"] / 100}
                     for i, lab in enumerate(labels)}
            else:
                m = {"validation": {metric[lab]: values[f"{task}:{lab}"] / 100
                                    for lab in labels}}
            make_run(tmp_path, f"{task}-{method}-{level}", task, method, 0, m, level,
                     size={"lora": {"r": {576: 8, 144: 2}.get(level, 2)}})
    (table,) = build_report([tmp_path]).tables
    assert len(table.rows) == 12
    for row in table.rows:
        assert row.all_ave == pytest.approx(row.paper("All Ave."), abs=0.01), row.label


def test_task_families_scales_and_paper_values(tmp_path):
    make_run(tmp_path, "sq", "squad_v2", "adalora", 0,
             {"validation": {"exact_match": 85.0, "f1": 88.0}}, 72)
    make_run(tmp_path, "xs", "xsum", "lora", 0,
             {"validation": {"rouge1": 43.0, "rouge2": 20.0, "rougeL": 35.0, "rougeLsum": 36.0}},
             192)
    make_run(tmp_path, "sst", "sst2", "adalora", 0, acc(0.955), 144)
    report = build_report([tmp_path], show_paper=True)
    tables = {t.family: t for t in report.tables}
    assert list(tables) == ["glue", "squad", "summarization"]
    (sq,) = tables["squad"].rows
    assert sq.cells["squad_v2:F1"].mean == 88.0  # SQuAD is stored x100 already
    assert sq.paper("squad_v2:F1") == 88.7       # Table 2, AdaLoRA 0.08 %
    (xs,) = tables["summarization"].rows
    assert [c.key for c in tables["summarization"].columns] == ["xsum:R-1", "xsum:R-2",
                                                                 "xsum:R-L"]
    assert xs.cells["xsum:R-L"].mean == 35.0 and xs.paper("xsum:R-2") == 19.68
    (sst,) = tables["glue"].rows
    assert sst.cells["sst2:Acc"].mean == pytest.approx(95.5) and sst.paper("sst2:Acc") == 95.80
    md = render_markdown(report)
    assert "| paper |  |  | 95.80 |" in md
    assert "| Δ vs paper |  |  | -0.30 |" in md  # 95.50 - 95.80


def test_broken_runs_are_skipped_by_name(runs, tmp_path):
    bad = tmp_path / "runs" / "broken"
    make_run(bad, "failed", "rte", "lora", 5, {}, 144, status="failed")
    make_run(bad, "running", "rte", "lora", 6, {}, 144, status="running")
    garbled = make_run(bad, "garbled", "rte", "lora", 7, acc(0.1), 144)
    (garbled / "summary.json").write_text("{not json")
    no_metrics = make_run(bad, "no-metrics", "rte", "lora", 8, acc(0.1), 144)
    (no_metrics / "summary.json").write_text(json.dumps({"task": "rte", "method": "lora"}))
    wrong_type = make_run(bad, "wrong-type", "rte", "lora", 9, acc(0.1), 144)
    (wrong_type / "summary.json").write_text(json.dumps(
        {"task": "rte", "method": "lora", "metrics": {"validation": {"accuracy": "high"}}}))
    lost = make_run(bad, "lost-summary", "rte", "lora", 10, acc(0.1), 144)
    (lost / "summary.json").unlink()
    (bad / "junk-status").mkdir()
    (bad / "junk-status" / "status.json").write_text("[1, 2")
    report = build_report([runs])
    skipped = {p.name: why for p, why in report.skipped}
    assert set(skipped) == {"failed", "running", "garbled", "no-metrics", "wrong-type",
                            "lost-summary", "junk-status"}
    assert "failed" in skipped["failed"] and "not valid JSON" in skipped["garbled"]
    assert len(report.runs) == 9  # the good ones, numbers unchanged
    lora = next(r for r in report.tables[0].rows if r.method == "lora")
    assert lora.cells["rte:Acc"].n == 3

    result = runner.invoke(app, ["report", str(runs), "--format", "markdown"])
    assert result.exit_code == 0, result.output
    warned = [line for line in result.stderr.splitlines() if line.startswith("warning: skipped")]
    assert len(warned) == 7 and any(str(bad / "garbled") in line for line in warned)


def test_every_format_renders(runs):
    report = build_report([runs], show_paper=True)
    md = render_markdown(report)
    assert "| AdaLoRA | 700 | 144 |  | **86.00** ± 1.00 (3) |" in md
    assert "| LoRA r=2 | 800 | 144 | **92.00** ± 2.83 (2) | 82.00 ± 2.00 (3) |" in md
    tex = render_latex(report)
    for token in (r"\toprule", r"\midrule", r"\bottomrule", r"\textbf{86.00} $\pm$ 1.00 (3)"):
        assert token in tex
    assert "_" not in tex.replace(r"\_", "")  # every underscore escaped
    lines = list(csv.DictReader(io.StringIO(render_csv(report))))
    rte = {(r["method"], r["budget_level"]): r for r in lines if r["column"] == "rte:Acc"}
    assert float(rte[("lora", "144")]["std"]) == pytest.approx(2.0)
    assert rte[("adalora", "144")]["best"] == "1" and rte[("lora", "144")]["best"] == "0"
    expected_p = stats.ttest_ind(ADA_RTE, LORA_RTE, equal_var=False).pvalue
    assert float(rte[("adalora", "144")]["p_vs_lora"]) == pytest.approx(expected_p, rel=1e-5)
    console = Console(record=True, width=200)
    render_rich(report, console)
    text = console.export_text()
    assert "86.00 ± 1.00 (3)" in text and "Training cost" in text


def test_per_seed_shows_every_seeds_value_in_every_format(runs):
    """``--per-seed``: each row's seeds and, per column, the fixture's values in that seed
    order (LoRA's SST-2 has seeds 0 and 1 only, so its RTE seed 2 has no SST-2 value)."""
    plain = build_report([runs])
    assert "Per seed" not in render_markdown(plain)
    assert "seeds" not in next(csv.reader(io.StringIO(render_csv(plain))))
    report = build_report([runs], per_seed=True)
    md = render_markdown(report)
    assert "| LoRA r=2 | 144 | 0 / 1 / 2 | 90.00 / 94.00 / - | 80.00 / 82.00 / 84.00 |" in md
    assert "| AdaLoRA | 144 | 0 / 1 / 2 | - / - / - | 85.00 / 87.00 / 86.00 |" in md
    assert "| BitFit |  | 0 | - | 75.00 |" in md
    lines = list(csv.DictReader(io.StringIO(render_csv(report))))
    rte = {r["method"]: r for r in lines if r["column"] == "rte:Acc"}
    assert (rte["adalora"]["seeds"], rte["adalora"]["values"]) == ("0;1;2",
                                                                   "85.0000;87.0000;86.0000")
    sst2 = {r["method"]: r for r in lines if r["column"] == "sst2:Acc"}
    assert (sst2["lora"]["seeds"], sst2["lora"]["values"]) == ("0;1", "90.0000;94.0000")
    assert "85.00 / 87.00 / 86.00" in render_latex(report)
    console = Console(record=True, width=200)
    render_rich(report, console)
    assert "85.00 / 87.00 / 86.00" in console.export_text()
    result = runner.invoke(app, ["report", str(runs), "--format", "markdown", "--per-seed"])
    assert result.exit_code == 0 and "80.00 / 82.00 / 84.00" in result.output


def test_training_cost(tmp_path):
    make_run(tmp_path, "a", "mnli", "lora", 0, {"validation_matched": {"accuracy": 0.9}}, 72,
             seconds=10.0, epochs=2.0, memory=2**30)
    make_run(tmp_path, "b", "mnli", "lora", 1, {"validation_matched": {"accuracy": 0.9}}, 72,
             seconds=14.0, epochs=2.0, memory=2 * 2**30)
    (cost,) = build_report([tmp_path]).cost
    assert cost.seconds_per_epoch == pytest.approx(6.0)  # (5 + 7) / 2
    assert cost.memory_gib == pytest.approx(1.5)
    assert cost.paper == (11.094, 105.0)  # Table 9: MNLI, 0.08 %, LoRA


def test_duplicate_seed_is_reported(runs):
    make_run(runs / "copy", "rte-lora-s0", "rte", "lora", 0, acc(0.80), 144, params=800)
    notes = build_report([runs]).notes
    assert len(notes) == 1 and "seed 0" in notes[0]


def test_runs_inside_a_run_directory_are_found_and_named(runs):
    """`train --run-dir X` and then a sweep into X: the report used to stop at X and show
    one row. Runs in the run's own folders (model/, checkpoints/, eval/) are not runs."""
    outer = runs / "rte-bitfit-s0"
    make_run(outer, "rte-lora-s7", "rte", "lora", 7, acc(0.70), 144, params=800)
    make_run(outer / "checkpoints", "step-0000001", "rte", "lora", 9, acc(0.1), 144)
    report = build_report([outer])
    assert sorted(r.path.name for r in report.runs) == ["rte-bitfit-s0", "rte-lora-s7"]
    assert report.notes == [f"{outer} is a run directory holding 1 other run in its folder; "
                            "they are reported as runs of their own (keep a sweep's runs out "
                            "of run directories: --sweep-dir)"]


def test_figures_are_pngs(runs, tmp_path):
    out = tmp_path / "fig"
    paths, warnings = write_figures(build_report([runs]), out)
    names = sorted(p.name for p in paths)
    assert names == ["fig3_rank_rte-adalora-b144.png", "fig4_budget_rte.png",
                     "fig4_budget_sst2.png", "fig5_orth_rte.png"]
    for p in paths:
        assert p.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert warnings == []
    assert mean_rank_pattern([{"a": 2, "b": 0}, {"a": 1, "b": 3}, {"a": 3}]) == {
        "a": 2.0, "b": 1.5}


def test_cli_writes_every_format(runs, tmp_path):
    out = tmp_path / "report"
    result = runner.invoke(app, ["report", str(runs), "--format", "all", "--out", str(out),
                                 "--paper"])
    assert result.exit_code == 0, result.output
    assert {p.name for p in out.iterdir()} == {"report.md", "report.tex", "results.csv",
                                               "training_cost.csv", "figures"}
    assert len(list((out / "figures").glob("*.png"))) == 4


def _full_disk(monkeypatch, victim: str) -> None:
    """Writes fail as on a full disk: ``report.md`` after half its text, a PNG with the file
    created and nothing in it (what a full disk left before)."""
    real = Path.write_text

    def write_text(self, data, *args, **kwargs):
        if self.name == "report.md":
            real(self, data[:len(data) // 2])
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        return real(self, data, *args, **kwargs)

    def savefig(self, fname, *args, **kwargs):
        Path(fname).write_bytes(b"")
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    if victim == "report.md":
        monkeypatch.setattr(Path, "write_text", write_text)
    else:
        from matplotlib.figure import Figure

        monkeypatch.setattr(Figure, "savefig", savefig)


@pytest.mark.parametrize("victim, failed", [
    ("report.md", "report.md"), ("png", "figures/fig3_rank_rte-adalora-b144.png")])
def test_a_full_disk_leaves_the_out_folder_as_it_was(runs, tmp_path, monkeypatch, victim,
                                                     failed):
    out = tmp_path / "report"
    out.mkdir()
    (out / "report.md").write_text("the earlier report\n")
    _full_disk(monkeypatch, victim)
    result = runner.invoke(app, ["report", str(runs), "--format", "markdown,csv", "--out",
                                 str(out)])
    assert result.exit_code == 1
    assert result.stderr.strip() == (f"error: could not write {out / failed}: No space left "
                                     "on device (free some space)")
    assert [p.name for p in out.iterdir()] == ["report.md"]  # no partial folder, no figures
    assert (out / "report.md").read_text() == "the earlier report\n"
    fresh = tmp_path / "fresh" / "report"  # a folder made for the report goes again
    result = runner.invoke(app, ["report", str(runs), "--format", "markdown", "--out",
                                 str(fresh)])
    assert result.exit_code == 1 and not fresh.exists()


@pytest.mark.parametrize("args, fragment", [
    (["report", "no/such/dir"], "does not exist"),
    (["report", ".", "--format", "html"], "unknown --format 'html'"),
])
def test_cli_errors_are_one_line(args, fragment, tmp_path):
    result = runner.invoke(app, args)
    assert result.exit_code == 2
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error:") and fragment in lines[0]


def test_cli_no_finished_runs(tmp_path):
    make_run(tmp_path, "failed", "rte", "lora", 0, {}, status="failed")
    result = runner.invoke(app, ["report", str(tmp_path)])
    assert result.exit_code == 2 and "no finished runs" in result.stderr


def test_unfinished_runs_say_whether_they_live(tmp_path):
    from adalora_cli.report.runs import load_run
    from adalora_cli.rundir.owner import identity

    live = make_run(tmp_path, "live", "rte", "lora", 1, {}, 144, status="running")
    (live / "status.json").write_text(json.dumps({"status": "running", **identity()}))
    (live / "heartbeat.json").write_text(json.dumps({"time": 0, "step": 12}))
    assert load_run(live) == f"still running at step 12 (process {os.getpid()} on this host)"
    dead = make_run(tmp_path, "dead", "rte", "lora", 2, {}, 144, status="running")
    (dead / "status.json").write_text(json.dumps(
        {"status": "running", **identity(), "pid": 2**22 + 7}))
    assert load_run(dead) == (f"died while running (process {2**22 + 7} is gone); resume "
                              f"with adalora train --resume {dead}")
    stopped = make_run(tmp_path, "stopped", "rte", "lora", 3, {}, 144, status="preempted")
    (stopped / "status.json").write_text(json.dumps({"status": "preempted", "step": 7}))
    assert load_run(stopped) == (f"preempted at step 7; resume with adalora train --resume "
                                 f"{stopped}")


def test_size_keys_are_never_extra_columns(tmp_path):
    """AdaLoRA alone at two budget levels differs in adalora.budget and init_rank; b(T) and
    the row's size say so already. A key that really differs within a task still shows."""
    for level, r0 in ((12, 2), (24, 4)):
        for seed in (0, 1):
            make_run(tmp_path, f"a{level}s{seed}", "sst2", "adalora", seed, acc(0.5), level,
                     size={"adalora": {"init_rank": r0}})
    (table,) = build_report([tmp_path]).tables
    assert table.differs == []
    make_run(tmp_path, "lr", "sst2", "adalora", 0, acc(0.5), 12,
             size={"adalora": {"init_rank": 2}, "train": {"learning_rate": 0.01}})
    (table,) = build_report([tmp_path]).tables
    assert table.differs == ["train.learning_rate"]


def test_a_report_written_with_out_is_printed_too(runs, tmp_path):
    """--out writes the files and still shows the report: the first text format asked for
    goes to stdout (the same text as the file), the list of files to stderr."""
    out = tmp_path / "report"
    result = runner.invoke(app, ["report", str(runs), "--format", "markdown,csv", "--out",
                                 str(out), "--no-figures"])
    assert result.exit_code == 0, result.output
    assert result.stdout == (out / "report.md").read_text() + "\n"
    assert "wrote 3 files" in result.stderr


def test_extra_columns_come_from_the_tables_own_tasks(tmp_path):
    """Two learning rates of AdaLoRA on a causal-LM task split its rows by lr; the GLUE
    table, whose rows do not differ, gets no lr column from the other table's task."""
    lm = {"validation": {"loss": 5.0, "perplexity": 148.4}}
    for lr in (1e-3, 2e-3):
        make_run(tmp_path, f"lm-{lr}", "causal_lm", "adalora", 0, lm, 16,
                 size={"train": {"learning_rate": lr}})
    make_run(tmp_path, "rte", "rte", "adalora", 0, acc(0.7), 16,
             size={"train": {"learning_rate": 1e-3}})
    tables = {t.family: t for t in build_report([tmp_path]).tables}
    assert tables["other"].differs == ["train.learning_rate"]
    assert tables["glue"].differs == []
