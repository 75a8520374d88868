"""Heatmap: module paths parse into (stack, layer, matrix type) for BERT, DeBERTa and BART."""

from __future__ import annotations

import math

import pytest

from adalora_cli.heatmap import parse_module_path, plot_rank_heatmap, rank_figure, rank_grid


@pytest.mark.parametrize("path, expected", [
    # every row: the paper's name, then the model's own module name
    ("deberta.encoder.layer.3.attention.self.query_proj", ("enc", 3, "W_q (query_proj)")),
    ("deberta.encoder.layer.11.attention.output.dense",
     ("enc", 11, "W_o (attention.output.dense)")),
    ("deberta.encoder.layer.0.intermediate.dense", ("enc", 0, "W_f1 (intermediate.dense)")),
    ("deberta.encoder.layer.0.output.dense", ("enc", 0, "W_f2 (output.dense)")),
    ("bert.encoder.layer.5.attention.self.value", ("enc", 5, "W_v (value)")),
    ("model.decoder.layers.2.encoder_attn.k_proj", ("dec", 2, "cross W_k (encoder_attn.k_proj)")),
    ("model.decoder.layers.2.self_attn.out_proj", ("dec", 2, "W_o (out_proj)")),
    ("model.encoder.layers.7.fc2", ("enc", 7, "W_f2 (fc2)")),
    # decoder-only families: the paper's names where the paper has the matrix, so Llama's
    # up_proj and down_proj say which is W_f1
    ("model.layers.3.self_attn.o_proj", ("", 3, "W_o (o_proj)")),
    ("model.layers.3.mlp.up_proj", ("", 3, "W_f1 (up_proj)")),
    ("model.layers.3.mlp.down_proj", ("", 3, "W_f2 (down_proj)")),
    ("model.layers.3.mlp.gate_proj", ("", 3, "gate_proj")),  # no paper name: its own
    ("transformer.h.1.attn.c_attn", ("", 1, "c_attn")),
    ("transformer.h.1.attn.c_proj", ("", 1, "W_o (attn.c_proj)")),
    ("transformer.h.1.mlp.c_fc", ("", 1, "W_f1 (c_fc)")),
    ("transformer.h.1.mlp.c_proj", ("", 1, "W_f2 (mlp.c_proj)")),
    ("gpt_neox.layers.0.attention.dense", ("", 0, "W_o (attention.dense)")),
    ("gpt_neox.layers.0.mlp.dense_4h_to_h", ("", 0, "W_f2 (dense_4h_to_h)")),
    ("model.layers.0.self_attn.dense", ("", 0, "W_o (self_attn.dense)")),  # phi
    # T5: sub-layers inside a block, cross-attention by its own name
    ("encoder.block.2.layer.0.SelfAttention.q", ("enc", 2, "W_q (SelfAttention.q)")),
    ("decoder.block.2.layer.1.EncDecAttention.o", ("dec", 2, "cross W_o (EncDecAttention.o)")),
    ("decoder.block.2.layer.2.DenseReluDense.wi", ("dec", 2, "W_f1 (DenseReluDense.wi)")),
])
def test_parse_module_path(path, expected):
    assert parse_module_path(path) == expected


def test_grid_places_every_rank_once():
    pattern = {"bert.encoder.layer.0.attention.self.query": 3,
               "bert.encoder.layer.1.attention.self.query": 1,
               "bert.encoder.layer.1.output.dense": 0}
    rows, cols, grid = rank_grid(pattern)
    assert rows == ["W_q (query)", "W_f2 (output.dense)"] and cols == ["0", "1"]
    assert grid[0] == [3.0, 1.0]
    assert math.isnan(grid[1][0]) and grid[1][1] == 0.0


def test_rows_read_in_the_papers_order_with_other_matrices_where_the_model_has_them():
    # Llama 2 layers, in the model's module order: gate_proj sits between W_o and W_f1
    llama = {f"model.layers.{i}.{m}": 1 for i in range(2) for m in (
        "self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj",
        "mlp.gate_proj", "mlp.up_proj", "mlp.down_proj")}
    assert rank_grid(llama)[0] == ["W_q (q_proj)", "W_k (k_proj)", "W_v (v_proj)",
                                   "W_o (o_proj)", "gate_proj", "W_f1 (up_proj)",
                                   "W_f2 (down_proj)"]
    # BART declares k before q; the rows still read W_q, W_k, W_v, cross-attention last
    bart = {f"model.decoder.layers.0.{m}": 1 for m in (
        "self_attn.k_proj", "self_attn.v_proj", "self_attn.q_proj", "self_attn.out_proj",
        "encoder_attn.k_proj", "encoder_attn.v_proj", "encoder_attn.q_proj",
        "encoder_attn.out_proj", "fc1", "fc2")}
    assert rank_grid(bart)[0] == [
        "W_q (q_proj)", "W_k (k_proj)", "W_v (v_proj)", "W_o (out_proj)", "W_f1 (fc1)",
        "W_f2 (fc2)", "cross W_q (encoder_attn.q_proj)", "cross W_k (encoder_attn.k_proj)",
        "cross W_v (encoder_attn.v_proj)", "cross W_o (encoder_attn.out_proj)"]
    gpt2 = {f"transformer.h.0.{m}": 1 for m in ("attn.c_attn", "attn.c_proj", "mlp.c_fc",
                                                 "mlp.c_proj")}
    assert rank_grid(gpt2)[0] == ["c_attn", "W_o (attn.c_proj)", "W_f1 (c_fc)",
                                  "W_f2 (mlp.c_proj)"]


def test_seq2seq_columns_encoder_then_decoder():
    pattern = {"model.decoder.layers.0.fc1": 2, "model.encoder.layers.1.fc1": 1,
               "model.encoder.layers.0.fc1": 4}
    rows, cols, grid = rank_grid(pattern)
    assert cols == ["enc 0", "enc 1", "dec 0"]
    assert grid == [[4.0, 1.0, 2.0]]


def test_plot_writes_png(tmp_path):
    out = plot_rank_heatmap({"bert.encoder.layer.0.attention.self.query": 2}, tmp_path / "h.png")
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def _drawn(fig) -> tuple[list[float], list[str], list[str]]:
    """The colour bar's ticks inside its range, the row labels and the cells' numbers."""
    fig.canvas.draw()
    ax, bar_ax = fig.axes
    low, high = bar_ax.get_ylim()
    ticks = [t for t in ax.images[0].colorbar.get_ticks() if low <= t <= high]
    return (ticks, [t.get_text() for t in ax.get_yticklabels()],
            [t.get_text() for t in ax.texts])


def test_colour_bar_ticks_whole_ranks_and_cells_print_integers():
    """Ranks are whole numbers: a colour bar from 0 to 3 ticks 0, 1, 2, 3 (matplotlib's own
    locator ticked 0, 0.5, ... 3.0), and the cells print 3, not 3.0."""
    import matplotlib.pyplot as plt

    llama = {"model.layers.0.mlp.gate_proj": 3, "model.layers.0.mlp.up_proj": 1,
             "model.layers.0.mlp.down_proj": 0, "model.layers.1.mlp.up_proj": 2}
    fig = rank_figure(llama, "ranks")
    try:
        ticks, rows, cells = _drawn(fig)
    finally:
        plt.close(fig)
    assert ticks == [0, 1, 2, 3]
    assert rows == ["gate_proj", "W_f1 (up_proj)", "W_f2 (down_proj)"]
    assert sorted(cells) == ["0", "1", "2", "3"]


def test_mean_ranks_print_one_decimal_under_whole_rank_ticks():
    """A report's mean over seeds (1.5) colours between whole ranks and prints one decimal;
    the colour bar still ticks whole ranks only."""
    import matplotlib.pyplot as plt

    fig = rank_figure({"bert.encoder.layer.0.attention.self.query": 1.5,
                       "bert.encoder.layer.1.attention.self.query": 4.0}, "mean ranks")
    try:
        ticks, rows, cells = _drawn(fig)
    finally:
        plt.close(fig)
    assert ticks == [0, 1, 2, 3, 4] and rows == ["W_q (query)"]
    assert sorted(cells) == ["1.5", "4.0"]
