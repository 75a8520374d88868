"""Heatmap: module paths parse into (stack, layer, matrix type) for BERT, DeBERTa and BART."""

from __future__ import annotations

import math

import pytest

from adalora_cli.heatmap import parse_module_path, plot_rank_heatmap, rank_grid


@pytest.mark.parametrize("path, expected", [
    ("deberta.encoder.layer.3.attention.self.query_proj", ("enc", 3, "W_q")),
    ("deberta.encoder.layer.11.attention.output.dense", ("enc", 11, "W_o")),
    ("deberta.encoder.layer.0.intermediate.dense", ("enc", 0, "W_f1")),
    ("deberta.encoder.layer.0.output.dense", ("enc", 0, "W_f2")),
    ("bert.encoder.layer.5.attention.self.value", ("enc", 5, "W_v")),
    ("model.decoder.layers.2.encoder_attn.k_proj", ("dec", 2, "cross W_k")),
    ("model.decoder.layers.2.self_attn.out_proj", ("dec", 2, "W_o")),
    ("model.encoder.layers.7.fc2", ("enc", 7, "W_f2")),
])
def test_parse_module_path(path, expected):
    assert parse_module_path(path) == expected


def test_grid_places_every_rank_once():
    pattern = {"bert.encoder.layer.0.attention.self.query": 3,
               "bert.encoder.layer.1.attention.self.query": 1,
               "bert.encoder.layer.1.output.dense": 0}
    rows, cols, grid = rank_grid(pattern)
    assert rows == ["W_q", "W_f2"] and cols == ["0", "1"]
    assert grid[0] == [3.0, 1.0]
    assert math.isnan(grid[1][0]) and grid[1][1] == 0.0


def test_seq2seq_columns_encoder_then_decoder():
    pattern = {"model.decoder.layers.0.fc1": 2, "model.encoder.layers.1.fc1": 1,
               "model.encoder.layers.0.fc1": 4}
    rows, cols, grid = rank_grid(pattern)
    assert cols == ["enc 0", "enc 1", "dec 0"]
    assert grid == [[4.0, 1.0, 2.0]]


def test_plot_writes_png(tmp_path):
    out = plot_rank_heatmap({"bert.encoder.layer.0.attention.self.query": 2}, tmp_path / "h.png")
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
