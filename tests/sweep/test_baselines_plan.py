"""``adalora sweep --budget`` sizes today's baselines (docs/maths.md#budget-levels): the
quality bar's dry run lists all eight methods with their sizes and parameter counts."""

from __future__ import annotations

import re

from typer.testing import CliRunner

from adalora_cli.cli import app

METHODS = "adalora,lora,rslora,dora,pissa,loraplus,sora,increlora"


def test_the_dry_run_lists_all_eight_with_their_sizes(in_repo, tmp_path):
    result = CliRunner().invoke(
        app, ["sweep", "configs/smoke/glue.yaml", "--methods", METHODS, "--budget", "16",
              "--dry-run", "--sweep-dir", str(tmp_path / "sweep")], env={"COLUMNS": "250"})
    assert result.exit_code == 0, result.output
    rows = {}
    for line in result.stdout.splitlines():
        cells = [c.strip() for c in line.split("│")[1:-1]]
        if len(cells) == 8 and cells[0].startswith("glue-"):
            rows[cells[1]] = (cells[3], int(cells[5].replace(",", "")))
    # the smoke BERT: n = 12 matrices, 8 of 32 x 32 and 4 FFN ones of 32 x 37, so at
    # b(T) = 16 the mean final rank is 4/3: r = 1, r0 = 2 (docs/maths.md#budget-levels).
    # One rank costs d_in + d_out: 4 * 64 + 69 + 69 = 394 per layer, 788 in all.
    lora = 788
    assert rows == {
        "adalora": ("r0=2", 2 * (lora + 12)),  # + 1 per singular value
        "lora": ("r=1", lora), "rslora": ("r=1", lora), "pissa": ("r=1", lora),
        "loraplus": ("r=1", lora),
        "dora": ("r=1", lora + 2 * (4 * 32 + 37 + 32)),  # + one magnitude per output row
        "sora": ("r_max=2", 2 * (lora + 12)),  # starts at r0, one gate per rank
        "increlora": ("r_init=1", 2 * (lora + 12)),  # 1 rank + 1 reserve to start
    }
    assert re.search(r"8 runs planned, 8 would run", result.stdout)
