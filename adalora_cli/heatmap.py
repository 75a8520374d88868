"""Rank heatmap (paper Figure 3): final rank per layer (x) and matrix type (y).

Module paths are parsed into (stack, layer index, matrix type), so one function serves
DeBERTa/BERT (``encoder.layer.3.attention.self.query_proj``), BART and T5
(``model.decoder.layers.3.encoder_attn.q_proj``, drawn with encoder and decoder layers
side by side and cross-attention as its own rows) and the decoder-only families. Every row
is named one way: the paper's name where the paper has the matrix (W_q, W_k, W_v, W_o, W_f1
the FFN's up-projection, W_f2 its down-projection), then the model's own module name in
brackets, so a reader of either knows which matrix a row is: ``W_f1 (up_proj)`` and
``W_f2 (down_proj)`` for Llama, ``W_o (attention.output.dense)`` for BERT. A matrix the
paper has no name for shows the model's name alone (Llama's ``gate_proj``, GPT-2's fused
``c_attn``). Rows read in the paper's order, W_q to W_f2, and every other matrix sits where
the model has it (the order of the pattern's paths, which is the order of the model's
modules): Llama's gate_proj after W_o; cross-attention after the rest.

Ranks are whole numbers, so the colour bar's ticks are too; a report's mean over seeds
colours between them and prints its cells with one decimal.
"""

from __future__ import annotations

import io
import re
import textwrap
from pathlib import Path
from typing import BinaryIO

# The paper's names by the end of a module path, longest first (so BERT's
# attention.output.dense is W_o before output.dense can make it W_f2); any other matrix is
# shown by the last part of its path.
_PAPER_NAMES = sorted({
    "query": "W_q", "query_proj": "W_q", "q_proj": "W_q", "q_lin": "W_q", "attn.q": "W_q",
    "SelfAttention.q": "W_q", "EncDecAttention.q": "W_q",
    "key": "W_k", "key_proj": "W_k", "k_proj": "W_k", "k_lin": "W_k", "attn.k": "W_k",
    "SelfAttention.k": "W_k", "EncDecAttention.k": "W_k",
    "value": "W_v", "value_proj": "W_v", "v_proj": "W_v", "v_lin": "W_v", "attn.v": "W_v",
    "SelfAttention.v": "W_v", "EncDecAttention.v": "W_v",
    "attention.output.dense": "W_o", "out_proj": "W_o", "o_proj": "W_o", "out_lin": "W_o",
    "attn.o": "W_o", "SelfAttention.o": "W_o", "EncDecAttention.o": "W_o",
    "attn.c_proj": "W_o", "self_attn.dense": "W_o", "attention.dense": "W_o",
    "intermediate.dense": "W_f1", "fc1": "W_f1", "up_proj": "W_f1", "lin1": "W_f1",
    "c_fc": "W_f1", "dense_h_to_4h": "W_f1", "DenseReluDense.wi": "W_f1", "ffn": "W_f1",
    "output.dense": "W_f2", "fc2": "W_f2", "down_proj": "W_f2", "lin2": "W_f2",
    "mlp.c_proj": "W_f2", "dense_4h_to_h": "W_f2", "DenseReluDense.wo": "W_f2",
    "ffn_output": "W_f2",
}.items(), key=lambda kv: -len(kv[0]))
_ORDER = ["W_q", "W_k", "W_v", "W_o", "W_f1", "W_f2"]
_CROSS = ("encoder_attn.", "EncDecAttention.", "crossattention.")
_LAYER = re.compile(r"(?:^|\.)(?:layer|layers|h|block|blocks)\.(\d+)\.(.+)$")


def matrix_name(rest: str) -> str:
    """The row label of the matrix at ``rest`` (its path inside a layer): the paper's name
    and the model's module name, ``W_f1 (up_proj)``, or the model's name alone where the
    paper has none; cross-attention matrices get a ``cross`` prefix and are named from the
    cross-attention module on (``cross W_q (encoder_attn.q_proj)``)."""
    marker = next((c for c in _CROSS if f".{c}" in f".{rest}"), None)
    suffix, paper = next(((suffix, paper) for suffix, paper in _PAPER_NAMES
                          if rest == suffix or rest.endswith("." + suffix)),
                         (rest.rsplit(".", 1)[-1], None))
    own = rest[rest.index(marker):] if marker else suffix
    name = f"{paper} ({own})" if paper else own
    return f"cross {name}" if marker else name


def parse_module_path(path: str) -> tuple[str, int, str]:
    """``(stack, layer, matrix label)``, e.g. ('dec', 3, 'cross W_q'). Stack is '' for
    encoder-only models."""
    match = _LAYER.search(path)
    if not match:
        return "", -1, path
    layer, rest = int(match.group(1)), match.group(2)
    stack = "dec" if ".decoder." in f".{path}" else ("enc" if ".encoder." in f".{path}" else "")
    return stack, layer, matrix_name(rest)


def rank_grid(pattern: dict[str, int]) -> tuple[list[str], list[str], list[list[float]]]:
    """Rows (matrix types: see the module's docstring for their order), columns (layers)
    and the grid of ranks (nan where absent)."""
    parsed = {path: parse_module_path(path) for path in pattern}
    is_seq2seq = any(stack == "dec" for stack, _, _ in parsed.values())
    col_keys = sorted({(stack != "dec", stack, layer) for stack, layer, _ in parsed.values()},
                      key=lambda k: (not k[0], k[2]))
    cols = [f"{s} {layer}" if is_seq2seq else str(layer) for _, s, layer in col_keys]

    rows = _row_order(list(dict.fromkeys(label for _, _, label in parsed.values())))
    grid = [[float("nan")] * len(cols) for _ in rows]
    col_index = {(s, layer): i for i, (_, s, layer) in enumerate(col_keys)}
    for path, (stack, layer, label) in parsed.items():
        grid[rows.index(label)][col_index[(stack, layer)]] = float(pattern[path])
    return rows, cols, grid


def _row_order(seen: list[str]) -> list[str]:
    """The paper's names in the paper's order; any other name right after the paper name
    the model has before it (``seen``: labels in the model's order)."""
    keys, last = {}, -1
    for i, label in enumerate(seen):
        cross = label.startswith("cross ")
        paper = label.removeprefix("cross ").split(" (", 1)[0]
        if paper in _ORDER:
            last = _ORDER.index(paper)
            keys[label] = (cross, last, 0, i)
        else:
            keys[label] = (cross, last, 1, i)
    return sorted(seen, key=keys.__getitem__)


def rank_figure(pattern: dict[str, float], title: str, colorbar_label: str = "final rank"):
    """The heatmap of ``pattern`` (module path -> rank, or a mean rank over seeds) as a
    matplotlib Figure: cells print whole ranks as integers and means with one decimal; the
    colour bar ticks whole ranks only. The caller saves and closes it."""
    import matplotlib

    matplotlib.use("Agg")  # files only: never needs a display
    import matplotlib.pyplot as plt
    import numpy as np
    from matplotlib.ticker import MaxNLocator

    rows, cols, grid = rank_grid(pattern)
    data = np.array(grid, dtype=float)
    width = max(4.0, 0.45 * len(cols) + 2 + 0.06 * max(map(len, rows)))
    fig, ax = plt.subplots(figsize=(width, 0.5 * len(rows) + 1.6))
    # vmax at least 1: an all-zero pattern still gets a colour bar from 0 to 1
    image = ax.imshow(data, cmap="YlGn", aspect="auto", vmin=0,
                      vmax=max(1.0, float(np.nanmax(data, initial=0.0))))
    ax.set_xticks(range(len(cols)), cols, rotation=90 if len(cols) > 14 else 0, fontsize=8)
    ax.set_yticks(range(len(rows)), rows, fontsize=8)
    ax.set_xlabel("layer")
    whole = all(float(v).is_integer() for v in data[~np.isnan(data)])
    if len(cols) * len(rows) <= 400:  # numbers stay legible up to BART-large's 24 x 10
        for (r, c), value in np.ndenumerate(data):
            if not np.isnan(value):
                ax.text(c, r, f"{value:.0f}" if whole else f"{value:.1f}", ha="center",
                        va="center", fontsize=6)
    bar = fig.colorbar(image, ax=ax, label=colorbar_label)
    # a rank is a whole number: 0, 1, 2, ... never 0.5 (MaxNLocator thins them on a wide range)
    bar.locator = MaxNLocator(integer=True)
    bar.update_ticks()
    # wrap a long title (a run's setting and variants) rather than cut it at the figure's edge
    ax.set_title(textwrap.fill(title, width=int(width * 11)), fontsize=9)
    fig.tight_layout()
    return fig


def plot_rank_heatmap(pattern: dict[str, int], out: str | Path | BinaryIO,
                      title: str = "") -> Path | BinaryIO:
    """Write the heatmap PNG (to a path or a binary stream) and return where it went."""
    import matplotlib.pyplot as plt

    fig = rank_figure(pattern, title or f"final rank, total {sum(pattern.values())}")
    out = out if hasattr(out, "write") else Path(out)
    try:
        fig.savefig(out, dpi=120, format="png")
    finally:
        plt.close(fig)
    return out


def heatmap_png(pattern: dict[str, int], title: str = "") -> bytes:
    """The heatmap as PNG bytes, for trackers that take an image rather than a file."""
    buffer = io.BytesIO()
    plot_rank_heatmap(pattern, buffer, title=title)
    return buffer.getvalue()
