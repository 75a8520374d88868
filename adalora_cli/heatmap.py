"""Rank heatmap (paper Figure 3): final rank per layer (x) and matrix type (y).

Module paths are parsed into (stack, layer index, matrix type), so one function serves
DeBERTa/BERT (``encoder.layer.3.attention.self.query_proj``) and BART
(``model.decoder.layers.3.encoder_attn.q_proj``, drawn with encoder and decoder layers
side by side and cross-attention as its own rows).
"""

from __future__ import annotations

import io
import re
from pathlib import Path
from typing import BinaryIO

# Paper-style labels for the matrix types; unknown suffixes are shown as they are.
_LABELS = {
    "query": "W_q", "query_proj": "W_q", "q_proj": "W_q",
    "key": "W_k", "key_proj": "W_k", "k_proj": "W_k",
    "value": "W_v", "value_proj": "W_v", "v_proj": "W_v",
    "attention.output.dense": "W_o", "out_proj": "W_o",
    "intermediate.dense": "W_f1", "fc1": "W_f1",
    "output.dense": "W_f2", "fc2": "W_f2",
}
_ORDER = ["W_q", "W_k", "W_v", "W_o", "W_f1", "W_f2"]
_LAYER = re.compile(r"(?:^|\.)(?:layer|layers|h|block|blocks)\.(\d+)\.(.+)$")


def parse_module_path(path: str) -> tuple[str, int, str]:
    """``(stack, layer, matrix label)``, e.g. ('dec', 3, 'cross W_q'). Stack is '' for
    encoder-only models."""
    match = _LAYER.search(path)
    if not match:
        return "", -1, path
    layer, rest = int(match.group(1)), match.group(2)
    stack = "dec" if ".decoder." in f".{path}" else ("enc" if ".encoder." in f".{path}" else "")
    prefix = ""
    if rest.startswith("encoder_attn."):
        prefix, rest = "cross ", rest[len("encoder_attn."):]
    elif rest.startswith("self_attn."):
        rest = rest[len("self_attn."):]
    elif rest.startswith("attention.self."):
        rest = rest[len("attention.self."):]
    return stack, layer, prefix + _LABELS.get(rest, rest)


def rank_grid(pattern: dict[str, int]) -> tuple[list[str], list[str], list[list[float]]]:
    """Rows (matrix types), columns (layers) and the grid of ranks (nan where absent)."""
    parsed = {path: parse_module_path(path) for path in pattern}
    is_seq2seq = any(stack == "dec" for stack, _, _ in parsed.values())
    col_keys = sorted({(stack != "dec", stack, layer) for stack, layer, _ in parsed.values()},
                      key=lambda k: (not k[0], k[2]))
    cols = [f"{s} {layer}" if is_seq2seq else str(layer) for _, s, layer in col_keys]

    def row_order(label: str) -> tuple[int, int, str]:
        base = label.removeprefix("cross ")
        return (label.startswith("cross "), _ORDER.index(base) if base in _ORDER else 99, label)

    rows = sorted({label for _, _, label in parsed.values()}, key=row_order)
    grid = [[float("nan")] * len(cols) for _ in rows]
    col_index = {(s, layer): i for i, (_, s, layer) in enumerate(col_keys)}
    for path, (stack, layer, label) in parsed.items():
        grid[rows.index(label)][col_index[(stack, layer)]] = float(pattern[path])
    return rows, cols, grid


def plot_rank_heatmap(pattern: dict[str, int], out: str | Path | BinaryIO,
                      title: str = "") -> Path | BinaryIO:
    """Write the heatmap PNG (to a path or a binary stream) and return where it went."""
    import matplotlib

    matplotlib.use("Agg")  # files only: never needs a display
    import matplotlib.pyplot as plt
    import numpy as np

    rows, cols, grid = rank_grid(pattern)
    data = np.array(grid, dtype=float)
    fig, ax = plt.subplots(figsize=(max(4.0, 0.45 * len(cols) + 2), 0.5 * len(rows) + 1.6))
    image = ax.imshow(data, cmap="YlGn", aspect="auto", vmin=0)
    ax.set_xticks(range(len(cols)), cols, rotation=90 if len(cols) > 14 else 0, fontsize=8)
    ax.set_yticks(range(len(rows)), rows, fontsize=8)
    ax.set_xlabel("layer")
    if len(cols) * len(rows) <= 400:  # numbers stay legible up to BART-large's 24 x 10
        for (r, c), value in np.ndenumerate(data):
            if not np.isnan(value):
                ax.text(c, r, str(int(value)), ha="center", va="center", fontsize=6)
    fig.colorbar(image, ax=ax, label="final rank")
    ax.set_title(title or f"final rank, total {int(np.nansum(data))}", fontsize=9)
    fig.tight_layout()
    out = out if hasattr(out, "write") else Path(out)
    fig.savefig(out, dpi=120, format="png")
    plt.close(fig)
    return out


def heatmap_png(pattern: dict[str, int], title: str = "") -> bytes:
    """The heatmap as PNG bytes, for trackers that take an image rather than a file."""
    buffer = io.BytesIO()
    plot_rank_heatmap(pattern, buffer, title=title)
    return buffer.getvalue()
