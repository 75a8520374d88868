"""A tune manifest: a sweep manifest (name, seeds, overrides, groups of configs x methods x
budgets) whose groups also say what to search, plus how to search (docs/tuning.md)::

    name: tune_smoke
    seeds: [0, 1]              # the chosen value runs on these; trials train on the first
    select_on: heldout         # or validation (the AdaLoRA paper's protocol)
    holdout: 16                # training rows held out for select_on: heldout
    metric: accuracy           # default: the task's main metric
    sampler: {name: grid, seed: 0}          # or tpe / random with trials: N
    pruner: {name: median, startup_trials: 2}   # or halving, or none
    overrides: [train.eval_every=4]
    runs:
      - configs: [configs/smoke/glue.yaml]
        methods: [lora, adalora]
        budgets: [16]
        search:
          train.learning_rate: {low: 1.0e-3, high: 1.0e-1, log: true, points: 4}

Each (config, method, budget) of a group is one cell with its own study. Torch-free and
Optuna-free: a bad manifest is refused before anything heavy is imported.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ...config import ConfigError, read_yaml
from ...errors import shown
from ..plan import Group, _check_overrides, parse_int_list, parse_methods
from .space import Space, parse_space

SAMPLERS = ("grid", "tpe", "random")
PRUNERS = ("none", "median", "halving")
SELECT_ON = ("heldout", "validation")
_TOP = ("name", "description", "seeds", "overrides", "runs", "select_on", "holdout", "metric",
        "sampler", "pruner")
_GROUP = ("configs", "methods", "budgets", "overrides", "tag", "search", "holdout")
_NAME = re.compile(r"[A-Za-z0-9._-]+")
_PRUNER_KEYS = {"median": ("startup_trials", "warmup_steps"),
                "halving": ("min_resource", "reduction_factor"), "none": ()}


@dataclass(frozen=True)
class TuneGroup:
    group: Group
    """The configs x methods x budgets, as a sweep plans them (seeds: the manifest's)."""
    search: tuple[Space, ...]
    holdout: int | None = None
    """Training rows held out for these configs (select_on: heldout): the group's
    ``holdout:``, else the manifest's."""


@dataclass(frozen=True)
class TuneSpec:
    name: str
    source: Path
    seeds: list[int]
    groups: list[TuneGroup]
    select_on: str = "heldout"
    holdout: int | None = None
    metric: str | None = None
    sampler: dict[str, Any] = field(default_factory=lambda: {"name": "tpe"})
    pruner: dict[str, Any] = field(default_factory=lambda: {"name": "none"})

    @property
    def tuning_seed(self) -> int:
        """The seed every trial trains with (the first of the manifest's)."""
        return self.seeds[0]


def _mapping(data: dict, key: str, default: dict, where: Path) -> dict[str, Any]:
    raw = data.get(key, default)
    if isinstance(raw, str):
        raw = {"name": raw}
    if not isinstance(raw, dict) or "name" not in raw:
        raise ConfigError(f"{where}: {key}: must be a name or {{name: ..., ...}}, got "
                          f"{shown(raw)}")
    return dict(raw)


def _sampler(data: dict, path: Path) -> dict[str, Any]:
    sampler = _mapping(data, "sampler", {"name": "tpe"}, path)
    if sampler["name"] not in SAMPLERS:
        raise ConfigError(f"{path}: unknown sampler {shown(sampler['name'])}; choose from "
                          f"{', '.join(SAMPLERS)}")
    unknown = sorted(set(sampler) - {"name", "seed", "trials"})
    if unknown:
        raise ConfigError(f"{path}: sampler: unknown key {unknown[0]}; valid keys: name, "
                          "seed, trials")
    for key in ("seed", "trials"):
        value = sampler.get(key)
        if value is not None and (not isinstance(value, int) or isinstance(value, bool)
                                  or value < (0 if key == "seed" else 1)):
            raise ConfigError(f"{path}: sampler.{key} must be an integer >= "
                              f"{0 if key == 'seed' else 1}, got {shown(value)}")
    if sampler["name"] != "grid" and not sampler.get("trials"):
        raise ConfigError(f"{path}: sampler {sampler['name']} needs trials: N (trials per "
                          "cell); a grid tries each point once")
    sampler.setdefault("seed", 0)
    return sampler


def _pruner(data: dict, path: Path) -> dict[str, Any]:
    pruner = _mapping(data, "pruner", {"name": "none"}, path)
    name = pruner["name"]
    if name not in PRUNERS:
        raise ConfigError(f"{path}: unknown pruner {shown(name)}; choose from "
                          f"{', '.join(PRUNERS)}")
    unknown = sorted(set(pruner) - {"name", *_PRUNER_KEYS[name]})
    if unknown:
        valid = ", ".join(("name", *_PRUNER_KEYS[name]))
        raise ConfigError(f"{path}: pruner {name}: unknown key {unknown[0]}; valid keys: "
                          f"{valid}")
    return pruner


def _overrides(items: list[str], where: str) -> list[str]:
    """A sweep's checks, and the keys only the tune sets (trials' labels, the carve-out)."""
    for item in _check_overrides(items, where):
        key = item.partition("=")[0].strip()
        if key.startswith("tune.") or key == "task.holdout":
            raise ConfigError(f"{where}: {key} is set by the tune itself; use the manifest's "
                              "holdout: and select_on:")
    return items


def _holdout(value: Any, where: str) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise ConfigError(f"{where}: select_on: heldout needs holdout: N, the training rows "
                          f"held out to choose on (N >= 1), got {shown(value)}")
    return value


def _tune_group(raw: object, i: int, path: Path, seeds: list[int],
                shared: list[str], holdout: Any, select_on: str) -> TuneGroup:
    where = f"{path}: runs[{i}]"
    if not isinstance(raw, dict) or "configs" not in raw or "methods" not in raw:
        raise ConfigError(f"{where} must be a mapping with configs:, methods: and search:")
    unknown = sorted(set(raw) - set(_GROUP))
    if unknown:
        raise ConfigError(f"{where}: unknown key {unknown[0]}; valid keys: {', '.join(_GROUP)}")
    search = raw.get("search")
    if not isinstance(search, dict) or not search:
        raise ConfigError(f"{where}: search: names no key; give at least one, e.g. "
                          "search: {train.learning_rate: {low: 1.0e-4, high: 1.0e-2, log: "
                          "true}}")
    tag = str(raw.get("tag") or "")
    if tag and not _NAME.fullmatch(tag):
        raise ConfigError(f"{where}: tag {shown(tag)} must be letters, digits, '.', '_' or '-'")
    configs = raw["configs"] if isinstance(raw["configs"], list) else [raw["configs"]]
    budgets = ",".join(str(b) for b in raw["budgets"]) if raw.get("budgets") else None
    group = Group(configs=[Path(str(c)) for c in configs],
                  methods=parse_methods(raw["methods"]) or [],
                  budgets=parse_int_list(budgets, f"{where} budgets", 1), seeds=seeds,
                  overrides=shared + _overrides(
                      [str(o) for o in raw.get("overrides") or []], where), tag=tag)
    spaces = tuple(parse_space(str(k), v, where) for k, v in search.items())
    if select_on != "heldout":
        if "holdout" in raw:
            raise ConfigError(f"{where}: holdout: is for select_on: heldout; drop it")
        return TuneGroup(group, spaces)
    return TuneGroup(group, spaces, _holdout(raw.get("holdout", holdout), where))


def load_tune_manifest(path: Path, extra: list[str] | None = None) -> TuneSpec:
    """The manifest at ``path``, every shape checked; ``extra``: command-line overrides
    for every run. Config keys and the search's keys are checked by the planner."""
    data = read_yaml(path)
    unknown = sorted(set(data) - set(_TOP))
    if unknown:
        raise ConfigError(f"{path}: unknown tune manifest key {unknown[0]}; valid keys: "
                          f"{', '.join(_TOP)}")
    if not isinstance(data.get("runs"), list) or not data["runs"]:
        raise ConfigError(f"{path}: runs: must be a non-empty list of groups, each with "
                          "configs:, methods: and search:")
    seeds = parse_int_list(",".join(str(s) for s in data.get("seeds") or [0]),
                           f"{path}: seeds", 0) or [0]
    shared = _overrides([str(o) for o in data.get("overrides") or []], str(path))
    shared += _overrides(list(extra or []), "command line")
    select_on = str(data.get("select_on", "heldout"))
    if select_on not in SELECT_ON:
        raise ConfigError(f"{path}: select_on {shown(select_on)} must be heldout (rows held "
                          "out of the training split) or validation (the paper's protocol)")
    holdout = data.get("holdout")
    if select_on == "heldout" and holdout is not None:
        _holdout(holdout, str(path))
    elif holdout is not None:
        raise ConfigError(f"{path}: holdout: is for select_on: heldout; drop it (select_on: "
                          "validation chooses on the validation split)")
    name = str(data.get("name") or path.stem)
    if not _NAME.fullmatch(name) or not name.strip("."):
        raise ConfigError(f"{path}: name {shown(name)} must be letters, digits, '.', '_' or "
                          "'-' (it names the tune's folder, runs/<name>)")
    metric = data.get("metric")
    if metric is not None and (not isinstance(metric, str) or "/" in metric or not metric):
        raise ConfigError(f"{path}: metric {shown(metric)} must be a metric name such as "
                          "accuracy (the split is select_on's)")
    groups = [_tune_group(raw, i, path, seeds, shared, holdout, select_on)
              for i, raw in enumerate(data["runs"])]
    return TuneSpec(name, path, seeds, groups, select_on, holdout, metric,
                    _sampler(data, path), _pruner(data, path))
