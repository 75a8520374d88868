"""``adalora report`` pools only seeds of one experiment.

Runs are averaged only when their configs are equal apart from the seed and bookkeeping;
runs that differ (here: only in the learning rate, only in the step count, only in the
model) are separate rows, and the config key that differs becomes a column. Expected means
are worked out by hand from the numbers written into the fixtures.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import yaml

from adalora_cli.report import figures
from adalora_cli.report.render import render_csv, render_markdown
from adalora_cli.report.tables import build_report


def make_run(root: Path, name: str, seed: int, accuracy: float, *, task: str = "rte",
             method: str = "adalora", level: int | None = 144, train: dict | None = None,
             model: str = "tiny-bert", summary_extra: dict | None = None,
             sweep: str = "demo") -> Path:
    """A finished run directory with a full config (the report groups by its digest)."""
    path = root / name
    path.mkdir(parents=True)
    config = {"task": {"name": task}, "model": {"name_or_path": model},
              "method": {"name": method}, "adalora": {"init_rank": 4, "budget": 144},
              "train": {"seed": seed, "learning_rate": 5e-4, **(train or {})},
              "sweep": {"name": sweep, "budget_level": level}}
    (path / "config.yaml").write_text(yaml.safe_dump(config))
    (path / "status.json").write_text(json.dumps({"status": "finished"}))
    summary = {"task": task, "method": method, "seed": seed, "adapter_params": 1000,
               "metrics": {"validation": {"accuracy": accuracy}}, "budget_level": level,
               "train_seconds": 10.0, "epochs": 1.0, "device": "cpu", **(summary_extra or {})}
    (path / "summary.json").write_text(json.dumps(summary))
    (path / "metrics.jsonl").write_text("")
    return path


def rows_of(root: Path) -> list[tuple]:
    (table,) = build_report([root]).tables
    return [(r.variant, r.cells["rte:Acc"].n, round(r.cells["rte:Acc"].mean, 6))
            for r in table.rows]


def test_runs_differing_only_in_lr_are_separate_rows(tmp_path):
    for seed, (a, b) in enumerate([(0.60, 0.70), (0.62, 0.74)]):
        make_run(tmp_path, f"lr-small-s{seed}", seed, a)
        make_run(tmp_path, f"lr-big-s{seed}", seed, b, train={"learning_rate": 1e-3})
    # pooled, these four would read 66.50 +- 6.40 (4); apart: 61.0 (2) and 72.0 (2)
    assert rows_of(tmp_path) == [((("lr", "0.0005"),), 2, 61.0), ((("lr", "0.001"),), 2, 72.0)]
    report = build_report([tmp_path])
    assert report.tables[0].differs == ["train.learning_rate"]  # headed "lr"
    md = render_markdown(report)
    assert "| Method | # Params | b(T) | lr | RTE Acc |" in md
    assert "| AdaLoRA | 1.00K | 144 | 0.0005 | 61.00 ± 1.41 (2) |" in md
    assert "| AdaLoRA | 1.00K | 144 | 0.001 | **72.00** ± 2.83 (2) |" in md
    lines = render_csv(report).splitlines()
    assert lines[0].startswith("table,method,label,budget_level,size,lr,params,column")
    assert any(line.startswith("glue,adalora,AdaLoRA,144,r0=4,0.001,1000,rte:Acc,72.0000")
               for line in lines)


def test_runs_differing_only_in_steps_are_separate_rows(tmp_path):
    make_run(tmp_path, "short", 0, 0.50, train={"max_steps": 40})
    make_run(tmp_path, "long", 0, 0.80, train={"max_steps": 150})
    assert rows_of(tmp_path) == [((("steps", "40"),), 1, 50.0), ((("steps", "150"),), 1, 80.0)]


def test_runs_differing_only_in_model_are_separate_rows(tmp_path):
    make_run(tmp_path, "a", 0, 0.55, model="tiny-bert")
    make_run(tmp_path, "b", 0, 0.65, model="deberta")
    assert rows_of(tmp_path) == [((("model", "deberta"),), 1, 65.0),
                                 ((("model", "tiny-bert"),), 1, 55.0)]


def test_seeds_and_bookkeeping_do_pool(tmp_path):
    """What is not the experiment (seed, sweep name, device, trackers) never splits a row."""
    make_run(tmp_path, "a", 0, 0.60, sweep="first")
    make_run(tmp_path, "b", 1, 0.64, sweep="second", train={"device": "cpu"})
    assert rows_of(tmp_path) == [((), 2, 62.0)]
    assert build_report([tmp_path]).tables[0].differs == []


def test_a_learning_rate_tuned_per_method_is_shown_not_split(tmp_path):
    """The README's demo: LoRA and AdaLoRA each at its own lr. Nothing is pooled wrongly
    (they are different rows anyway), and the table shows the lr that each row used."""
    for seed, (ada, lora) in enumerate([(0.80, 0.81), (0.82, 0.83)]):
        make_run(tmp_path, f"ada-s{seed}", seed, ada, train={"learning_rate": 2e-3}, level=72)
        make_run(tmp_path, f"lora-s{seed}", seed, lora, method="lora", level=72)
    report = build_report([tmp_path])
    (table,) = report.tables
    assert [(r.method, r.variant, r.cells["rte:Acc"].n) for r in table.rows] == [
        ("lora", (), 2), ("adalora", (), 2)]
    assert table.differs == ["train.learning_rate"]
    md = render_markdown(report)
    assert "| LoRA r=8 | 1.00K | 72 | 0.0005 | **82.00** ± 1.41 (2) |" in md
    assert "| AdaLoRA | 1.00K | 72 | 0.002 | 81.00 ± 1.41 (2) |" in md
    # the comparison with LoRA still happens, and says which lr each side used
    assert "| AdaLoRA | 72 | 0.002 | LoRA r=8 | -1.00 (p 0.553) |" in md


def test_a_learning_rate_tuned_per_task_splits_nothing(tmp_path):
    make_run(tmp_path, "rte", 0, 0.60, train={"learning_rate": 1e-3})
    make_run(tmp_path, "mrpc", 0, 0.80, task="mrpc", train={"learning_rate": 5e-4})
    (table,) = build_report([tmp_path]).tables
    assert len(table.rows) == 1 and table.differs == []
    assert table.rows[0].cells["mrpc:Acc"].mean == pytest.approx(80.0)


def test_a_repeated_seed_is_kept_once_the_newest(tmp_path):
    old = make_run(tmp_path, "first", 0, 0.50)
    new = make_run(tmp_path / "again", "first", 0, 0.70)
    make_run(tmp_path, "other-seed", 1, 0.60)
    os.utime(old / "summary.json", (1_000_000, 1_000_000))
    os.utime(new / "summary.json", (2_000_000, 2_000_000))
    report = build_report([tmp_path])
    # averaging all three would give 60.0 (3); one per seed: (70 + 60) / 2 = 65.0 (2)
    assert rows_of(tmp_path) == [((), 2, 65.0)]
    (note,) = report.notes
    assert "seed 0 comes from 2 runs of one config" in note
    assert note.endswith(f"kept only the newest, {new}")
    assert sorted(r.path for r in report.runs) == sorted([new, tmp_path / "other-seed"])


def test_old_summaries_report_like_new_ones(tmp_path):
    """A summary without size, report columns and digest (written before they existed)
    shows exactly as one with them: they are derived from config.yaml."""
    make_run(tmp_path / "old", "r", 0, 0.60)
    make_run(tmp_path / "new", "r", 0, 0.60, summary_extra={
        "size": "r0=4", "config_digest": "recorded",
        "report": {"title": "RTE", "family": "glue", "columns": [
            {"label": "Acc", "splits": ["validation"], "metric": "accuracy", "scale": 100}]}})
    old, new = (build_report([tmp_path / d]) for d in ("old", "new"))
    assert render_markdown(old) == render_markdown(new)
    assert old.runs[0].size == "r0=4" and old.runs[0].report.title == "RTE"
    assert old.runs[0].digest == new.runs[0].digest  # recomputed from config.yaml for both


def test_a_task_unknown_to_the_report_shows_its_recorded_columns(tmp_path):
    make_run(tmp_path, "x", 0, 0.5, task="mytask", summary_extra={
        "metrics": {"test": {"score": 3.0}},
        "report": {"title": "My Task", "family": "other", "columns": [
            {"label": "S", "splits": ["test"], "metric": "score", "scale": 10}]}})
    (table,) = build_report([tmp_path]).tables
    assert table.family == "other" and [(c.title, c.label) for c in table.columns] == [
        ("My Task", "S")]
    assert table.rows[0].cells["mytask:S"].mean == pytest.approx(30.0)


def test_figures_use_the_same_grouping(tmp_path, monkeypatch):
    for lr, acc in ((5e-4, 0.6), (1e-3, 0.7)):
        path = make_run(tmp_path, f"lr{lr}", 0, acc, train={"learning_rate": lr})
        (path / "rank_pattern.json").write_text(json.dumps({"bert.layer.0.query": 2}))
        (path / "metrics.jsonl").write_text(json.dumps({"step": 1, "orth_reg": lr}) + "\n")
    legends = {}
    save = figures._save

    def keep_legend(fig, path):
        legend = fig.axes[0].get_legend()
        legends[path.name] = sorted(t.get_text() for t in legend.get_texts()) if legend else []
        return save(fig, path)

    monkeypatch.setattr(figures, "_save", keep_legend)
    paths, warnings = figures.write_figures(build_report([tmp_path]), tmp_path / "fig")
    assert warnings == []
    assert sorted(p.name for p in paths) == [
        "fig3_rank_rte-adalora-b144-lr=0.0005.png", "fig3_rank_rte-adalora-b144-lr=0.001.png",
        "fig4_budget_rte.png", "fig5_orth_rte.png"]
    # Figure 4: one line per learning rate, not one line through both
    assert legends["fig4_budget_rte.png"] == ["AdaLoRA lr=0.0005 (1 seed)",
                                              "AdaLoRA lr=0.001 (1 seed)"]
    assert legends["fig5_orth_rte.png"] == ["AdaLoRA b(T)=144 lr=0.0005 (1 seed)",
                                            "AdaLoRA b(T)=144 lr=0.001 (1 seed)"]


def test_min_seeds_leaves_out_the_unchosen_learning_rate(tmp_path):
    """After a learning-rate search on seed 0 only the chosen rate has three seeds: with
    --min-seeds 2 the other rate's single run is left out, with a note, and AdaLoRA is
    compared with the one LoRA row left at its level."""
    make_run(tmp_path, "ada-lr1-s0", 0, 0.60, train={"learning_rate": 1e-3})
    for seed, a in enumerate([0.70, 0.74, 0.72]):
        make_run(tmp_path, f"ada-lr2-s{seed}", seed, a, train={"learning_rate": 2e-3})
    make_run(tmp_path, "lora-lr2-s0", 0, 0.50, method="lora", train={"learning_rate": 2e-3})
    for seed, b in enumerate([0.66, 0.70, 0.65]):
        make_run(tmp_path, f"lora-lr1-s{seed}", seed, b, method="lora",
                 train={"learning_rate": 1e-3})
    assert len(build_report([tmp_path]).tables[0].rows) == 4
    report = build_report([tmp_path], min_seeds=2)
    (table,) = report.tables
    assert sorted((r.method, r.cells["rte:Acc"].n, round(r.cells["rte:Acc"].mean, 6))
                  for r in table.rows) == [("adalora", 3, 72.0), ("lora", 3, 67.0)]
    assert len(report.notes) == 2 and all("--min-seeds 2" in n for n in report.notes)
    assert any("ada-lr1-s0" in n for n in report.notes)
    (comparison,) = report.comparisons
    assert comparison.diff == pytest.approx(5.0)
    # Welch: squared standard errors 4 / 3 and 7 / 3 -> t = 5 / sqrt(11/3) = 2.6112, and
    # df = (11/3)^2 / ((4/3)^2 / 2 + (7/3)^2 / 2) = 3.7231; scipy's own test agrees
    from scipy.stats import ttest_ind
    expected = ttest_ind([70, 74, 72], [66, 70, 65], equal_var=False)
    assert round(float(expected.statistic), 4) == 2.6112
    assert comparison.p == pytest.approx(float(expected.pvalue), rel=1e-9)


def test_budget_figure_bands_are_mean_plus_minus_std(tmp_path, monkeypatch):
    for level, accs in ((72, [0.70, 0.74, 0.72]), (144, [0.80, 0.80, 0.83]), (576, [0.9])):
        for seed, a in enumerate(accs):
            make_run(tmp_path, f"b{level}-s{seed}", seed, a, level=level,
                     summary_extra={"adapter_params": 1000 * level})
    drawn = {}
    save = figures._save

    def keep_band(fig, path):
        ax = fig.axes[0]
        (band,) = ax.collections
        (line,) = ax.get_lines()
        fig.canvas.draw()  # so the tick labels exist
        drawn[path.name] = (list(line.get_xdata()), list(line.get_ydata()),
                            band.get_paths()[0].vertices, ax.get_xscale(),
                            [t.get_text() for t in ax.get_xticklabels() if t.get_text()],
                            [t.get_text() for t in ax.get_legend().get_texts()])
        return save(fig, path)

    monkeypatch.setattr(figures, "_save", keep_band)
    figures.write_figures(build_report([tmp_path]), tmp_path / "fig")
    x, y, vertices, scale, ticks, legend = drawn["fig4_budget_rte.png"]
    assert x == [72_000, 144_000, 576_000] and y == pytest.approx([72.0, 81.0, 90.0])
    # the levels span 8x: a log axis with short ticks; the legend counts the seeds
    assert scale == "log" and {"100K", "200K", "500K"} <= set(ticks)
    assert legend == ["AdaLoRA (1-3 seeds)"]
    assert [figures._short_params(v) for v in (720, 41_470, 1.5e6)] == ["720", "41.47K", "1.5M"]
    # sample std by hand: (70, 74, 72) -> 2.0; (80, 80, 83) -> sqrt(3) = 1.7321
    ys = {round(v, 4) for v in vertices[:, 1]}
    assert {70.0, 74.0, round(81 - 3 ** 0.5, 4), round(81 + 3 ** 0.5, 4)} <= ys


def test_figure_names_read_plainly_and_figure_5_ticks_are_numbers(tmp_path, monkeypatch):
    """A run outside a sweep is named by its size: b(T) reads bT, a task keeps its
    underscore (causal_lm, not causal-lm); Figure 5's log axis is labelled 0.2, 0.5, 1, 2
    rather than 2 x 10^-1."""
    path = make_run(tmp_path, "lm", 0, 0.5, task="causal_lm", level=None,
                    summary_extra={"metrics": {"validation": {"loss": 5.6}}})
    (path / "rank_pattern.json").write_text(json.dumps({"model.layers.0.self_attn.q_proj": 2}))
    (path / "metrics.jsonl").write_text("".join(
        json.dumps({"step": s, "orth_reg": r}) + "\n" for s, r in ((1, 2.0), (2, 0.7), (3, 0.2))))
    ticks = {}
    save = figures._save

    def keep_ticks(fig, path):
        fig.canvas.draw()
        ax = fig.axes[0]
        ticks[path.name] = [t.get_text() for t in ax.get_yticklabels(minor=False)
                            + ax.get_yticklabels(minor=True) if t.get_text()]
        return save(fig, path)

    monkeypatch.setattr(figures, "_save", keep_ticks)
    paths, _ = figures.write_figures(build_report([tmp_path]), tmp_path / "fig")
    assert sorted(p.name for p in paths) == [
        "fig3_rank_causal_lm-adalora-r0=4-bT=144.png", "fig4_budget_causal_lm.png",
        "fig5_orth_causal_lm.png"]
    labels = ticks["fig5_orth_causal_lm.png"]
    assert {"0.2", "1", "2"} <= set(labels) and not any("10^" in t or "times" in t
                                                        for t in labels), labels


def test_budget_figure_gives_each_method_its_own_colour(tmp_path, monkeypatch):
    """Eleven methods, one of them at two rates: matplotlib's 10-colour cycle would give the
    eleventh method the first one's colour. Each method keeps one colour for all its rates;
    its rates differ in line style and marker."""
    from matplotlib.colors import to_hex

    methods = ["lora", "rslora", "dora", "pissa", "loraplus", "sora", "increlora", "houlsby",
               "pfeiffer", "bitfit", "adalora"]
    for method in methods:
        make_run(tmp_path, f"{method}-s0", 0, 0.8, method=method)
    make_run(tmp_path, "rslora-fast-s0", 0, 0.6, method="rslora", train={"learning_rate": 1e-3})
    drawn = {}

    def keep_lines(fig, path):
        drawn[path.name] = [(line.get_label(), to_hex(line.get_color()), line.get_linestyle(),
                             line.get_marker()) for line in fig.axes[0].get_lines()]
        fig.clf()

    monkeypatch.setattr(figures, "_save", keep_lines)
    figures.write_figures(build_report([tmp_path]), tmp_path / "fig")
    lines = drawn["fig4_budget_rte.png"]
    assert len(lines) == 12
    colour = {}
    for label, hex_colour, _, _ in lines:
        colour.setdefault(label.split(" ")[0], set()).add(hex_colour)
    # one colour per method (rsLoRA's two lines share theirs), and no two methods alike
    assert all(len(c) == 1 for c in colour.values()) and len(colour) == 11
    assert len({c for cs in colour.values() for c in cs}) == 11
    rs = sorted((label, style, marker) for label, _, style, marker in lines
                if label.startswith("rsLoRA"))
    assert rs == [("rsLoRA lr=0.0005 (1 seed)", "-", "o"), ("rsLoRA lr=0.001 (1 seed)", "--", "s")]
