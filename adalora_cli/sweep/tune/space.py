"""A tune's search space: which config keys a method is searched over, and how.

Each key of a manifest group's ``search:`` is a dotted config key with either a range or a
list::

    search:
      train.learning_rate: {low: 1.0e-4, high: 1.0e-2, log: true, points: 5}
      loraplus.lr_ratio: {values: [4, 16]}

A range is sampled as it says by TPE or random search, and laid out as ``points`` values
(evenly, or evenly in log space with ``log: true``; 3 significant digits) for the grid. A
key must be a config key the tune does not set itself, the method must read it (tuning LoRA
on ``sora.lambda`` would search nothing), and every value must be one the key accepts: all
refused in one line before anything runs. Torch-free and Optuna-free.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Any

from ...config import ConfigError, RunConfig, flatten
from ...errors import shown
from ...methods.registry import METHODS, method_spec

RESERVED = ("method.name", "train.seed", "sweep.", "tune.", "task.holdout")
"""Keys the tune sets itself on every trial."""


@dataclass(frozen=True)
class Space:
    """One searched key: a range (``low``..``high``, ``log``) or ``values``."""

    key: str
    low: float | None = None
    high: float | None = None
    log: bool = False
    points: int = 4
    """How many values the grid takes from a range."""
    values: tuple[Any, ...] | None = None
    integer: bool = False
    """An integer key (its range is sampled as integers)."""

    def grid(self) -> list[Any]:
        """The values a grid search tries, in order."""
        if self.values is not None:
            return list(self.values)
        assert self.low is not None and self.high is not None
        if self.points == 1:
            return [self.low]
        ends = (math.log(self.low), math.log(self.high)) if self.log else (self.low, self.high)
        out = []
        for i in range(self.points):
            x = ends[0] + (ends[1] - ends[0]) * i / (self.points - 1)
            x = math.exp(x) if self.log else x
            out.append(int(round(x)) if self.integer else float(f"{x:.3g}"))
        return list(dict.fromkeys(out))

    def words(self) -> str:
        """The space as a report says it: ``1e-4..1e-2 log`` or ``{4, 16}``."""
        if self.values is not None:
            return "{" + ", ".join(f"{v:g}" if isinstance(v, float) else str(v)
                                   for v in self.values) + "}"
        return f"{self.low:g}..{self.high:g}" + (" log" if self.log else "")

    def record(self) -> dict[str, Any]:
        return {k: v for k, v in dataclasses.asdict(self).items() if v is not None}


def parse_space(key: str, raw: Any, where: str) -> Space:
    """One ``search:`` entry, its shape checked (the key itself by :func:`check_key`)."""
    if isinstance(raw, list):
        raw = {"values": raw}
    if not isinstance(raw, dict):
        raise ConfigError(f"{where}: search.{key} must be {{low: .., high: ..}} or "
                          f"{{values: [..]}}, got {shown(raw)}")
    unknown = sorted(set(raw) - {"low", "high", "log", "points", "values"})
    if unknown:
        raise ConfigError(f"{where}: search.{key}: unknown key {unknown[0]}; valid keys: "
                          "low, high, log, points, values")
    if "values" in raw:
        values = raw["values"]
        if not isinstance(values, list) or not values:
            raise ConfigError(f"{where}: search.{key}.values is empty; list the values to "
                              "try, e.g. values: [4, 16]")
        return Space(key, values=tuple(dict.fromkeys(values)))
    if "low" not in raw or "high" not in raw:
        raise ConfigError(f"{where}: search.{key} needs low and high (or values)")
    try:
        low, high = float(raw["low"]), float(raw["high"])
    except (TypeError, ValueError):
        raise ConfigError(f"{where}: search.{key}: low and high must be numbers, got "
                          f"{shown(raw['low'])} and {shown(raw['high'])}") from None
    if not (math.isfinite(low) and math.isfinite(high)) or low >= high:
        what = "empty" if low == high else "inverted"
        raise ConfigError(f"{where}: search.{key} range {low:g}..{high:g} is {what}; "
                          "write low below high, e.g. {low: 1.0e-4, high: 1.0e-2, log: true}")
    log = bool(raw.get("log", False))
    if log and low <= 0:
        raise ConfigError(f"{where}: search.{key}: a log range needs low > 0, got {low:g}")
    points = raw.get("points", 4)
    if not isinstance(points, int) or isinstance(points, bool) or points < 1:
        raise ConfigError(f"{where}: search.{key}.points must be an integer >= 1, got "
                          f"{shown(points)}")
    integer = all(isinstance(raw[k], int) and not isinstance(raw[k], bool)
                  for k in ("low", "high"))
    return Space(key, low, high, log, points, integer=integer)


def check_key(space: Space, method: str, cfg: RunConfig, where: str) -> None:
    """Refuse a key that is not a config key, one the tune sets, or one ``method`` does not
    read; and any value of the space the key does not accept."""
    key = space.key
    if any(key == r or (r.endswith(".") and key.startswith(r)) for r in RESERVED):
        raise ConfigError(f"{where}: search.{key} is set by the tune itself; search other "
                          "keys (method and seeds are the manifest's methods and seeds, "
                          "the held-out slice is holdout:)")
    keys = flatten(cfg.to_dict())
    if key not in keys:
        close = [k for k in keys if k.split(".")[-1] == key.split(".")[-1]][:3]
        hint = f" (did you mean {', '.join(close)}?)" if close else ""
        raise ConfigError(f"{where}: search.{key} is not a config key{hint}; name a key as "
                          "adalora train takes it, e.g. train.learning_rate")
    section = key.split(".", 1)[0]
    sections = {s.section for s in METHODS.values() if s.section}
    reads = method_spec(method).reads(cfg)
    if section in sections and section not in reads:
        has = ", ".join(sorted(reads)) or "no method section"
        raise ConfigError(f"{where}: method {method} does not read {key} (it reads {has}); "
                          f"search {key} in a group of the methods that have it")
    ends = space.values if space.values is not None else (space.low, space.high)
    for value in ends:
        check_value(cfg, key, value, where)


def check_value(cfg: RunConfig, key: str, value: Any, where: str) -> None:
    """``key=value`` applied to ``cfg`` as an override would be, or a one-line refusal."""
    from ...config import from_dict

    data = _as_read(cfg, key)
    node = data
    parts = key.split(".")
    for part in parts[:-1]:
        node = node[part]
    node[parts[-1]] = value
    try:
        from_dict(data)
    except ConfigError as err:
        raise ConfigError(f"{where}: search.{key} value {shown(value)} is refused: "
                          f"{err}") from None


def _as_read(cfg: RunConfig, key: str) -> dict[str, Any]:
    """``cfg`` as nested sections that :func:`~adalora_cli.config.from_dict` reads back,
    with ``key`` about to be set. Of an exclusive pair (``adalora.budget`` /
    ``adalora.target_rank``) a config sets one, and the other keeps its default (budget 144
    beside a file's target_rank), which from_dict would refuse as both set: that default is
    dropped, and an override of one key drops the other, as ``load_config`` does."""
    data = cfg.to_dict()
    for name, node in data.items():
        section = getattr(cfg, name)
        pairs = getattr(type(section), "EXCLUSIVE", ())
        defaults = {f.name: f.default for f in dataclasses.fields(section)} if pairs else {}
        for pair in pairs:
            searched = [k for k in pair if key == f"{name}.{k}"]
            for k in pair:
                if searched and k != searched[0]:
                    node[k] = None
                elif not searched and all(node[o] is not None for o in pair) \
                        and node[k] == defaults[k]:
                    node[k] = None
                    break
    return data


def override(key: str, value: Any) -> str:
    """``key=value`` as ``adalora train`` reads it back exactly (floats by repr)."""
    return f"{key}={value!r}" if isinstance(value, float) else f"{key}={value}"
