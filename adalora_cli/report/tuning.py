"""What ``adalora report`` says about a tuned sweep (a sweep directory holding the
``tune.json`` that ``adalora tune`` writes): per cell the chosen values, the search space,
the trials run and pruned and the data the choice was made on, and the figure of the tuning
metric against the learning rate, one line per method (the learning-rate sensitivity curve,
drawn by :func:`adalora_cli.report.figures.lr_curves` from these records).

The trials are ordinary run directories, but they are the search, not results: the tables
and their Welch tests count the seed runs of the chosen values only, and the trials appear
here. Reads ``tune.json`` only (no Optuna, no torch).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..methods.registry import METHODS

METHOD_NAMES = {name: spec.title for name, spec in METHODS.items()}

RECORD = "tune.json"
LR = "train.learning_rate"


@dataclass(frozen=True)
class Tune:
    path: Path
    """The tune's sweep directory."""
    data: dict[str, Any]

    def trial_dirs(self) -> set[Path]:
        """The trials' run directories: those the record lists, and those of trials not yet
        told to their study (``<cell>-t<number>``), which it lists once they are."""
        cells = self.data.get("cells", [])
        dirs = {(self.path / t["run"]).resolve() for c in cells for t in c.get("trials", [])}
        names = {c.get("name") for c in cells}
        for run in self.path.iterdir() if self.path.is_dir() else ():
            cell, _, number = run.name.rpartition("-t")
            if cell in names and number.isdigit() and run.is_dir():
                dirs.add(run.resolve())
        return dirs

    @property
    def chosen_on(self) -> str:
        """Which data the choice was made on, in words."""
        if self.data.get("select_on") == "validation":
            return "the validation split (the paper's protocol)"
        sizes = {c.get("holdout", self.data.get("holdout")) for c in self.data["cells"]}
        many = "rows" if len(sizes) > 1 else f"{sizes.pop()} rows"
        return (f"training {many} held out by row hash (not trained on; the validation "
                "split is untouched)")


def read_tunes(paths: list[Path]) -> tuple[list[Tune], list[str]]:
    """The tunes among ``paths`` (each a sweep directory with ``tune.json``), and a warning
    for each record that cannot be read."""
    tunes, warnings = [], []
    for path in paths:
        record = path / RECORD
        if not record.is_file():
            continue
        try:
            data = json.loads(record.read_text())
            if not isinstance(data, dict) or not isinstance(data.get("cells"), list):
                raise ValueError("no cells list")
        except (OSError, ValueError) as err:
            warnings.append(f"{record} cannot be read ({err}); its trials are reported as "
                            "runs")
            continue
        tunes.append(Tune(path, data))
    return tunes, warnings


def _value(v: Any) -> str:
    return f"{v:.3g}" if isinstance(v, float) else str(v)


def rows(tune: Tune) -> list[dict[str, str]]:
    """One row per cell: what the report prints."""
    out = []
    for c in tune.data["cells"]:
        trials = c.get("trials", [])
        chosen = c.get("chosen") or {}
        params = chosen.get("params") or {}
        ended = [t for t in trials if t["state"] != "running"]
        out.append({
            "Method": METHOD_NAMES.get(c["method"], c["method"]),
            "b(T)": str(c.get("budget_level") or ""),
            "Chosen": ", ".join(f"{k.split('.')[-1]}={_value(v)}" for k, v in params.items())
                      or "(none yet)",
            "Score": (f"{c['metric']} {chosen['value']:.4g}" if chosen else c["metric"]),
            "Search space": "; ".join(f"{k.split('.')[-1]} {v}" for k, v in c["space"].items()),
            "Trials": f"{len(ended)}/{c.get('trials_planned', len(trials))}",
            "Pruned": str(sum(t["state"] == "pruned" for t in trials)),
            "Chosen on": (f"{c.get('holdout', tune.data.get('holdout'))} held-out rows"
                          if tune.data.get("select_on") != "validation" else "validation"),
        })
    return out


def title(tune: Tune) -> str:
    s = tune.data.get("sampler", {})
    p = tune.data.get("pruner", {})
    return (f"Tuning ({tune.path}): {s.get('name')} sampler (seed {s.get('seed')}), pruner "
            f"{p.get('name')}; chosen on {tune.chosen_on}; then {len(tune.data.get('seeds', []))}"
            f" seeds each")


def markdown(tune: Tune) -> str:
    table = rows(tune)
    if not table:
        return ""
    headers = list(table[0])
    lines = [f"**{title(tune)}**", "", "| " + " | ".join(headers) + " |",
             "|" + "|".join("---" for _ in headers) + "|"]
    lines += ["| " + " | ".join(r[h] for h in headers) + " |" for r in table]
    return "\n".join(lines) + "\n"
