"""What ``adalora report`` says about a tuned sweep (a sweep directory holding the
``tune.json`` that ``adalora tune`` writes): per cell the chosen values, the search space,
the trials run and pruned and the data the choice was made on, and the figure of the tuning
metric against the learning rate, one line per method (the learning-rate sensitivity curve).

The trials are ordinary run directories, but they are the search, not results: the tables
and their Welch tests count the seed runs of the chosen values only, and the trials appear
here. Reads ``tune.json`` only (no Optuna, no torch).
"""

from __future__ import annotations

import json
from collections import defaultdict
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
        return {(self.path / t["run"]).resolve() for c in self.data.get("cells", [])
                for t in c.get("trials", [])}

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


def lr_curves(tunes: list[Tune], out: Path) -> list[Path]:
    """Per tune and (config, budget level): the tuning metric of each trial against its
    learning rate, one line per method, log x; a pruned trial is drawn hollow at the last
    value it reported."""
    from .figures import _plt, _save, _slug

    plt = _plt()
    paths = []
    for tune in tunes:
        groups: dict[tuple, list[dict]] = defaultdict(list)
        for c in tune.data["cells"]:
            if any(LR in (t.get("params") or {}) for t in c.get("trials", [])):
                groups[(Path(c["config"]).stem, c.get("budget_level"))].append(c)
        for (stem, level), cells in groups.items():
            fig, ax = plt.subplots(figsize=(6.4, 4.0))
            metric = cells[0]["metric"]
            for c in cells:
                done = sorted((t["params"][LR], t["value"]) for t in c["trials"]
                              if t["state"] == "complete" and LR in t["params"])
                name = METHOD_NAMES.get(c["method"], c["method"])
                line = None
                if done:
                    line, = ax.plot(*zip(*done), marker="o", label=name)
                pruned = [(t["params"][LR], t["reported"][str(t["last_step"])])
                          for t in c["trials"] if t["state"] == "pruned"
                          and LR in t["params"] and t.get("last_step") is not None]
                if pruned:
                    ax.scatter(*zip(*pruned), facecolors="none",
                               edgecolors=line.get_color() if line else "grey",
                               label=f"{name} (pruned: last reported)")
            ax.set_xscale("log")
            ax.set_xlabel("learning rate (log scale)")
            split, _, name = metric.partition("/")
            ax.set_ylabel(f"{name} on {split} (fraction; "
                          f"{'lower' if cells[0]['direction'] == 'minimize' else 'higher'} "
                          "is better)")
            ax.grid(alpha=0.3)
            ax.legend(fontsize=7)
            level_words = f", b(T)={level}" if level is not None else ""
            ax.set_title(f"{stem}{level_words}: {metric} per trial (tuning seed "
                         f"{tune.data['seeds'][0]})", fontsize=10)
            slug = _slug(tune.data["name"], stem, f"b{level}" if level is not None else "")
            paths.append(_save(fig, out / f"tune_lr_{slug}.png"))
    return paths
