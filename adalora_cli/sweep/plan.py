"""Sweep planning: configs x methods x budget levels x seeds -> one ``adalora train`` each.

A budget level is AdaLoRA's final budget b(T). Every other method gets the matching size
its registry entry computes (``methods.registry``), from the number n of matrices the model
adapts (so the same
level means the same mean final rank rbar = b(T) / n on DeBERTa, BART or the smoke model).
A sweep comes from one config plus ``--budget/--methods/--seeds``, or from a manifest in
``experiments/`` (a YAML file with a ``runs:`` list of such groups). Running the plan lives
in :mod:`adalora_cli.sweep.local`; this module only decides what to run.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from fractions import Fraction
from pathlib import Path

from ..config import ConfigError, load_config, read_yaml
from ..errors import shown
from ..methods.registry import METHODS, init_rank_for, method_spec, round_half_up
from ..tracking import check_trackers

SIZED = tuple(name for name, spec in METHODS.items() if spec.sized)
"""Methods whose size follows the budget level (their registry entry has a ``match``)."""
# Keys the sweep sets itself: a user override of these would break the grid.
_RESERVED = ("method.name", "train.seed", "sweep.")
_TAG = re.compile(r"[A-Za-z0-9._-]+")
PLACEHOLDERS = ("{seed}", "{level}")
"""What an override's value may name to differ per run: the run's seed and budget level,
so that one group trains each seed of each level on, say, the AdaLoRA run of the same seed
and level (``lora.rank_pattern=runs/x/glue-adalora-b{level}-s{seed}``)."""


@dataclass(frozen=True)
class Sizes:
    """The matched size of every built-in sized method at one budget level
    (docs/maths.md#budget-levels)."""

    rbar: Fraction
    init_rank: int
    lora_r: int
    houlsby_dim: int
    pfeiffer_dim: int


def matched_sizes(budget: int, n: int) -> Sizes:
    """Sizes for final budget ``budget`` over ``n`` adapted matrices, as the registry's
    entries set them. A non-integer rbar (e.g. 8 / 12 on the smoke model) rounds to the
    nearest size, at least 1; r0 rounds up so that b0 = n * r0 >= b(T) always holds."""
    if budget < 1 or n < 1:
        raise ConfigError(f"budget {budget} over {n} adapted matrices: both must be >= 1")
    rbar = Fraction(budget, n)
    return Sizes(rbar, init_rank_for(rbar), round_half_up(rbar), round_half_up(4 * rbar),
                 round_half_up(8 * rbar))


def size_overrides(method: str, budget: int | None, n: int | None) -> list[str]:
    """The ``key=value`` overrides that put ``method`` at budget level ``budget``."""
    spec = method_spec(method)
    if budget is None or not spec.sized:
        return []
    return spec.size_overrides(budget, n or 0)


@dataclass(frozen=True)
class Group:
    """One block of a sweep: every config x method x budget x seed."""

    configs: list[Path]
    methods: list[str]
    budgets: list[int] | None
    """None: run each config at its own sizes, with no budget level recorded."""
    seeds: list[int]
    overrides: list[str] = field(default_factory=list)
    tag: str = ""
    """Put into the run directory names (``<config>-<method>-b<level>-<tag>-s<seed>``), so
    two groups that differ only in their overrides (say two learning rates) can share a
    sweep."""


@dataclass(frozen=True)
class SweepSpec:
    name: str
    groups: list[Group]
    source: Path
    """The config or manifest the sweep was read from."""


@dataclass(frozen=True)
class PlannedRun:
    name: str
    """Run directory name inside the sweep directory."""
    config: Path
    method: str
    budget_level: int | None
    seed: int
    overrides: tuple[str, ...]
    """Everything passed to ``adalora train`` after the config path."""
    size: str
    """The matched size in words, e.g. 'r0=4', 'r=2', 'd=8' ('' for BitFit and full)."""
    sharded: bool = False
    """``train.sharding=fsdp``: the run needs several processes (:func:`check_processes`)."""


# --------------------------------------------------------------------------- parsing


def parse_int_list(text: str | None, option: str, minimum: int) -> list[int] | None:
    """``"144,288"`` -> [144, 288]; a one-line ConfigError naming the option otherwise."""
    if text is None:
        return None
    try:
        values = [int(v) for v in text.split(",") if v.strip()]
    except ValueError:
        values = []
    if not values or any(v < minimum for v in values):
        example = "0,1,2" if "seed" in option else "144,288"
        raise ConfigError(f"{option} takes a comma-separated list of integers >= {minimum}, "
                          f"e.g. {option} {example}; got {text!r}")
    return list(dict.fromkeys(values))


def parse_methods(text: str | list[str] | None) -> list[str] | None:
    if text is None:
        return None
    items = text if isinstance(text, list) else text.split(",")
    methods = [str(m).strip() for m in items if str(m).strip()]
    bad = [m for m in methods if m not in METHODS]  # the registry's names
    if bad or not methods:
        raise ConfigError(f"unknown method {shown(bad[0] if bad else text)}; "
                          f"choose from {', '.join(METHODS)}")
    return list(dict.fromkeys(methods))


def _check_overrides(overrides: list[str], where: str) -> list[str]:
    for item in overrides:
        key = item.partition("=")[0].strip()
        if "=" not in item:
            raise ConfigError(f"{where}: override {item!r} is not key=value")
        if any(key == r or (r.endswith(".") and key.startswith(r)) for r in _RESERVED):
            raise ConfigError(f"{where}: {key} is set by the sweep itself; "
                              "use --methods / --seeds (or the manifest's methods / seeds)")
    return list(overrides)


def fill_placeholders(overrides: list[str], seed: int, level: int | None,
                      where: str) -> list[str]:
    """Each override with :data:`PLACEHOLDERS` replaced by the run's ``seed`` and budget
    ``level``; any other braces are left as written (a YAML value may hold some)."""
    filled = []
    for item in overrides:
        if "{level}" in item and level is None:
            raise ConfigError(f"{where}: override {item!r} names {{level}}, but this run "
                              "has no budget level; give its group budgets: (or write the "
                              "level out)")
        filled.append(item.replace("{seed}", str(seed)).replace("{level}", str(level)))
    return filled


def is_manifest(path: Path) -> bool:
    return "runs" in read_yaml(path)


def _group(raw: object, i: int, path: Path, seeds: list[int]) -> Group:
    where = f"{path}: runs[{i}]"
    if not isinstance(raw, dict) or "configs" not in raw or "methods" not in raw:
        raise ConfigError(f"{where} must be a mapping with configs: and methods: lists")
    unknown = sorted(set(raw) - {"configs", "methods", "budgets", "seeds", "overrides", "tag"})
    if unknown:
        raise ConfigError(f"{where}: unknown key {unknown[0]}; "
                          "valid keys: configs, methods, budgets, seeds, overrides, tag")
    tag = str(raw.get("tag") or "")
    if tag and not _TAG.fullmatch(tag):
        raise ConfigError(f"{where}: tag {shown(tag)} must be letters, digits, '.', '_' or '-' "
                          "(it becomes part of a directory name), e.g. tag: lr2e-3")
    configs = raw["configs"] if isinstance(raw["configs"], list) else [raw["configs"]]
    as_text = ",".join(str(b) for b in raw["budgets"]) if raw.get("budgets") else None
    group_seeds = raw.get("seeds")
    return Group(
        configs=[Path(str(c)) for c in configs],
        methods=parse_methods(raw["methods"]) or [],
        budgets=parse_int_list(as_text, f"{where} budgets", 1),
        seeds=[int(s) for s in group_seeds] if group_seeds is not None else seeds,
        overrides=_check_overrides([str(o) for o in raw.get("overrides") or []], where),
        tag=tag,
    )


def load_manifest(path: Path) -> SweepSpec:
    data = read_yaml(path)
    if any(isinstance(g, dict) and "search" in g for g in data.get("runs") or []):
        raise ConfigError(f"{path} is a tune manifest (its groups say what to search); run "
                          f"adalora tune {path}")
    unknown = sorted(set(data) - {"name", "description", "seeds", "overrides", "runs"})
    if unknown:
        raise ConfigError(f"{path}: unknown manifest key {unknown[0]}; "
                          "valid keys: name, description, seeds, overrides, runs")
    if not isinstance(data.get("runs"), list) or not data["runs"]:
        raise ConfigError(f"{path}: runs: must be a non-empty list of groups")
    seeds = [int(s) for s in data.get("seeds") or [0]]
    shared = _check_overrides([str(o) for o in data.get("overrides") or []], str(path))
    groups = [_group(raw, i, path, seeds) for i, raw in enumerate(data["runs"])]
    groups = [Group(g.configs, g.methods, g.budgets, g.seeds, shared + g.overrides, g.tag)
              for g in groups]
    name = str(data.get("name") or path.stem)
    # the name is a folder under runs/, as a tag is part of one: ../x or /x would put the
    # sweep's runs and logs outside it
    if not _TAG.fullmatch(name) or not name.strip("."):
        raise ConfigError(f"{path}: name {shown(name)} must be letters, digits, '.', '_' or "
                          "'-', not only dots (it names the sweep's folder, runs/<name>), "
                          "e.g. name: table1_glue; pick where the sweep goes with --sweep-dir")
    return SweepSpec(name, groups, path)


def build_spec(source: Path, budgets: str | None = None, methods: str | None = None,
               seeds: str | None = None, overrides: list[str] | None = None) -> SweepSpec:
    """A sweep from a config or a manifest. On a manifest, ``--budget`` and ``--seeds``
    replace its lists and ``--methods`` keeps only the methods named."""
    budget_list = parse_int_list(budgets, "--budget", 1)
    method_list = parse_methods(methods)
    seed_list = parse_int_list(seeds, "--seeds", 0)
    extra = _check_overrides(list(overrides or []), "command line")
    if is_manifest(source):
        spec = load_manifest(source)
        groups = []
        for g in spec.groups:
            kept = [m for m in g.methods if method_list is None or m in method_list]
            if kept:
                groups.append(Group(g.configs, kept,
                                    budget_list if budget_list and g.budgets else g.budgets,
                                    seed_list or g.seeds, g.overrides + extra, g.tag))
        if not groups:
            raise ConfigError(f"--methods {methods} matches no run in {source}")
        return SweepSpec(spec.name, groups, source)
    cfg = load_config(source, extra)  # one-line error for a missing or bad config
    group = Group([source], method_list or [cfg.method.name], budget_list,
                  seed_list or [cfg.train.seed], extra)
    return SweepSpec(f"{source.parent.name}-{source.stem}", [group], source)


# --------------------------------------------------------------------------- planning


def count_matrices(config: Path, overrides: list[str], cache: dict) -> int:
    """n: how many matrices AdaLoRA adapts in this config's model (cached). Read from the
    model's config.json alone (no weights), so planning, ``--status`` and a SLURM
    submission work where the weights are not (a login node, offline)."""
    from ..engine.build import resolve_resources  # heavy: only when a budget is matched
    from ..engine.skeleton import count_adapted, task_family

    cfg = load_config(config, [*overrides, "method.name=adalora"])
    # the family too: one checkpoint is a BERT under GLUE but a BART under summarization
    m = cfg.model  # a GGUF file inside a folder: both name the model
    model = m.name_or_path if m.gguf_file is None else (m.name_or_path, m.gguf_file)
    key = (task_family(cfg.task.name), model, tuple(cfg.method.target_modules or ()))
    if key not in cache:
        cache[key] = count_adapted(resolve_resources(cfg))
    return cache[key]


def _stems(configs: list[Path]) -> dict[Path, str]:
    """Short, unique names for configs: the stem, or parent-stem when stems collide."""
    stems = {}
    for c in configs:
        clash = any(o.stem == c.stem and o != c for o in configs)
        stems[c] = f"{c.parent.name}-{c.stem}" if clash else c.stem
    return stems


def plan(spec: SweepSpec, n_cache: dict | None = None) -> list[PlannedRun]:
    """Every run of the sweep, each config validated; duplicates (e.g. BitFit named in two
    groups) collapse into one run."""
    n_cache = {} if n_cache is None else n_cache
    configs = [c for g in spec.groups for c in g.configs]
    for c in configs:
        if not c.is_file():
            raise ConfigError(f"{spec.source}: config {c} does not exist; "
                              "fix the path (or write that config first)")
    stems = _stems(list(dict.fromkeys(configs)))
    runs: dict[str, PlannedRun] = {}
    for g in spec.groups:
        for config in g.configs:
            n = (count_matrices(config, g.overrides, n_cache)
                 if g.budgets and any(m in SIZED for m in g.methods) else None)
            for method in g.methods:
                levels = g.budgets if g.budgets and method in SIZED else [None]
                for level in levels:
                    # a config's adalora.target_rank gives way to the level's b(T): the
                    # budget override replaces it (config.load_config)
                    sized = size_overrides(method, level, n)
                    for seed in g.seeds:
                        run = _planned(spec, config, stems[config], method, level, seed,
                                       sized, g.overrides, g.tag)
                        _add(runs, run)
    return list(runs.values())


def _planned(spec: SweepSpec, config: Path, stem: str, method: str, level: int | None,
             seed: int, sized: list[str], extra: list[str], tag: str = "") -> PlannedRun:
    name = (f"{stem}-{method}" + (f"-b{level}" if level is not None else "")
            + (f"-{tag}" if tag else "") + f"-s{seed}")
    extra = fill_placeholders(list(extra), seed, level, str(spec.source))
    overrides = (f"method.name={method}", *sized, f"train.seed={seed}",
                 f"sweep.name={spec.name}",
                 f"sweep.budget_level={level if level is not None else 'null'}", *extra)
    cfg = load_config(config, list(overrides))  # every run's config is valid before any starts
    spec = method_spec(method)
    if sized and spec.own_size(cfg) is not None:
        # sized otherwise (LoRA on an AdaLoRA run's ranks): the level sets none of its keys,
        # the build checks the source's b(T) against it
        overrides = tuple(o for o in overrides if o not in sized)
        cfg = load_config(config, list(overrides))
    check_trackers(cfg)  # a missing tracker package stops the whole sweep
    # the size in words as the run's summary will record it; '' where no budget matched it
    size = spec.size_label(cfg, level) if sized else ""
    return PlannedRun(name, config, method, level, seed, overrides, size,
                      sharded=cfg.train.sharding == "fsdp")


def check_processes(runs: list[PlannedRun], processes: int, launcher: str) -> None:
    """Refuse, before any run starts, a sharded run (``train.sharding=fsdp``) where the
    launcher gives each run ``processes`` processes and that is one: every such run would
    fail at its start."""
    sharded = [r for r in runs if r.sharded]
    if not sharded or processes > 1:
        return
    which = (f"run {sharded[0].name} sets" if len(sharded) == 1 else
             f"{len(sharded)} runs ({sharded[0].name}, ...) set")
    how = ("a local sweep starts each run as one process" if launcher == "local" else
           "--slurm gpus_per_job gives each run one process")
    raise ConfigError(f"{which} train.sharding=fsdp, which needs several processes per run, "
                      f"but {how}; give each run its GPUs on SLURM (--launcher slurm --slurm "
                      "gpus_per_job=N, N >= 2), train it alone (adalora train CONFIG "
                      "--nproc N), or drop train.sharding=fsdp")


def _add(runs: dict[str, PlannedRun], run: PlannedRun) -> None:
    earlier = runs.get(run.name)
    if earlier is not None and earlier.overrides != run.overrides:
        raise ConfigError(f"two different runs would share the directory {run.name}; "
                          "give their configs different file names or their groups "
                          "different tags (tag: in the manifest)")
    runs[run.name] = run
