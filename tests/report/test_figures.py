"""The report's figures as a reader sees them: the matplotlib objects each figure is saved
from, caught at ``figures._save`` and drawn, so tick labels and their places are real."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from adalora_cli.report import figures
from adalora_cli.report.tables import build_report
from tests.report.test_grouping import make_run


@pytest.fixture()
def drawn(monkeypatch):
    """File name -> the figure saved under it, drawn (so every label has its text and
    place) and kept open for the test to read."""
    caught = {}

    def keep(fig, path: Path):
        fig.tight_layout()
        fig.set_dpi(120)  # as _save writes it
        fig.canvas.draw()
        caught[path.name] = fig
        return path

    monkeypatch.setattr(figures, "_save", keep)
    yield caught
    import matplotlib.pyplot as plt

    for fig in caught.values():
        plt.close(fig)


def _orth_run(root: Path, name: str, values: list[float]) -> None:
    path = make_run(root, name, 0, 0.5)
    (path / "metrics.jsonl").write_text("".join(
        json.dumps({"step": s, "orth_reg": r}) + "\n" for s, r in enumerate(values, 1)))


def _y_labels(ax) -> list:
    """The y tick labels a reader sees: with text, at a tick inside the axis's range."""
    low, high = sorted(ax.get_ylim())
    return [t for t in ax.get_yticklabels() + ax.get_yticklabels(minor=True)
            if t.get_text() and low <= t.get_position()[1] <= high]


def test_figure_5_log_axis_labels_never_overlap(tmp_path, drawn):
    """R falling over two decades (2 to 0.02): every minor tick labelled printed 0.06, 0.07,
    0.08, 0.09 (and 0.6 ... 0.9) over one another. Now the decades keep their labels and
    the ticks at 2, 3 and 5 are labelled, no two labels sharing a pixel row."""
    _orth_run(tmp_path, "wide", [2.0, 0.7, 0.2, 0.07, 0.02])
    figures.write_figures(build_report([tmp_path]), tmp_path / "fig")
    ax = drawn["fig5_orth_rte.png"].axes[0]
    labels = _y_labels(ax)
    assert sorted(float(t.get_text()) for t in labels) == [
        0.02, 0.03, 0.05, 0.1, 0.2, 0.3, 0.5, 1, 2]
    boxes = sorted((t.get_window_extent() for t in labels), key=lambda b: b.y0)
    for lower, upper in zip(boxes, boxes[1:]):
        assert lower.y1 <= upper.y0, (lower, upper)


def test_figure_5_labels_a_narrow_range_between_decades(tmp_path, drawn):
    """R between 0.3 and 0.6 crosses no decade: the minor ticks are the only labels, and a
    third of a decade has room for each of them."""
    _orth_run(tmp_path, "narrow", [0.6, 0.45, 0.3])
    figures.write_figures(build_report([tmp_path]), tmp_path / "fig")
    labels = _y_labels(drawn["fig5_orth_rte.png"].axes[0])
    assert [t.get_text() for t in sorted(labels, key=lambda t: t.get_position()[1])] == [
        "0.3", "0.4", "0.5", "0.6"]


def test_figure_4_metric_axis_says_its_unit(tmp_path, drawn):
    """Accuracy is a percentage on the report's scale, the Matthews correlation x 100 is
    not one, and a loss has no unit to give."""
    make_run(tmp_path, "rte", 0, 0.7)
    make_run(tmp_path, "cola", 0, 0.0, task="cola",
             summary_extra={"metrics": {"validation": {"matthews": 0.41}}})
    make_run(tmp_path, "lm", 0, 0.0, task="causal_lm", level=None,
             summary_extra={"metrics": {"validation": {"loss": 5.6}}})
    figures.write_figures(build_report([tmp_path]), tmp_path / "fig")
    assert drawn["fig4_budget_rte.png"].axes[0].get_ylabel() == \
        "RTE Acc (%), higher is better"
    assert drawn["fig4_budget_cola.png"].axes[0].get_ylabel() == \
        "CoLA Mcc (× 100), higher is better"
    ylabels = [ax.get_ylabel() for ax in drawn["fig4_budget_causal_lm.png"].axes]
    assert ylabels == ["causal LM loss, lower is better"]


def test_figure_3_ticks_whole_ranks_and_names_llama_rows_both_ways(tmp_path, drawn):
    """Two seeds of a Llama's MLP ranks: the mean 1.5 prints with its decimal, the colour
    bar ticks 0, 1, 2 and 3 (not 0.5 steps), every row says its paper name and the
    module's own (W_f1 is up_proj), and the title stays inside the figure."""
    for seed, (up, down) in enumerate([(1, 3), (2, 3)]):
        path = make_run(tmp_path, f"lm-s{seed}", seed, 0.0, task="causal_lm", summary_extra={
            "metrics": {"validation": {"loss": 5.6}}})
        (path / "rank_pattern.json").write_text(json.dumps({
            "model.layers.0.mlp.gate_proj": 0, "model.layers.0.mlp.up_proj": up,
            "model.layers.0.mlp.down_proj": down}))
    figures.write_figures(build_report([tmp_path]), tmp_path / "fig")
    fig = drawn["fig3_rank_causal_lm-adalora-b144.png"]
    ax, bar_ax = fig.axes
    low, high = bar_ax.get_ylim()
    assert [t for t in ax.images[0].colorbar.get_ticks() if low <= t <= high] == [0, 1, 2, 3]
    assert [t.get_text() for t in ax.get_yticklabels()] == [
        "gate_proj", "W_f1 (up_proj)", "W_f2 (down_proj)"]
    assert [t.get_text() for t in ax.texts] == ["0.0", "1.5", "3.0"]
    title = ax.title.get_window_extent()
    assert title.x0 >= 0 and title.x1 <= fig.bbox.x1, (title, fig.bbox)
