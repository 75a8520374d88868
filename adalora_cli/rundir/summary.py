"""``summary.json`` as a typed record: the engine writes a :class:`Summary`, the report reads one.

Besides the numbers, a summary records what a reader would otherwise have to recompute from
the config and the code: the method's size in words (``r0=4``, ``r=8``, ``d=16``), the
task's report columns (which metric of which split, on what scale), and the digest of
everything but the seed that decides the run's numbers (runs with one digest are seeds of one
experiment). Summaries written before these fields existed read back with them as None;
the report then derives them from ``config.yaml`` (see ``adalora_cli.report.runs``).
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .layout import SUMMARY


@dataclass(frozen=True)
class ReportColumn:
    """One column of the report: ``metric`` of the first of ``splits`` present, x ``scale``."""

    label: str
    splits: tuple[str, ...]
    metric: str
    scale: float = 1.0
    lower_is_better: bool | None = False
    """True for a loss or a perplexity: the report bolds the lowest mean. None in summaries
    written before this field (the report then asks ``adalora_cli.tasks.columns``)."""


@dataclass(frozen=True)
class TaskReport:
    """How the report shows a task: its title, its table (family) and its columns."""

    title: str
    family: str
    """'glue', 'squad', 'summarization' or 'other': which of the paper's tables it joins."""
    columns: tuple[ReportColumn, ...]

    def to_dict(self) -> dict[str, Any]:
        return {"title": self.title, "family": self.family,
                "columns": [dataclasses.asdict(c) | {"splits": list(c.splits)}
                            for c in self.columns]}

    @classmethod
    def from_dict(cls, data: Any) -> TaskReport | None:
        """None for anything that is not a well-formed record (an old or damaged file)."""
        try:
            return cls(str(data["title"]), str(data["family"]), tuple(
                ReportColumn(str(c["label"]), tuple(map(str, c["splits"])), str(c["metric"]),
                             float(c.get("scale", 1.0)), _direction(c.get("lower_is_better")))
                for c in data["columns"]))
        except (TypeError, KeyError, ValueError, AttributeError):
            return None


def _direction(value: Any) -> bool | None:
    return value if isinstance(value, bool) else None


@dataclass(frozen=True)
class ExportFacts:
    """What an export needs to know about a run, recorded when it finishes (``export`` in
    ``summary.json``), so that an export never has to guess."""

    base_model: str | None = None
    revision: str | None = None
    """The hub commit the base came from (None for a local folder)."""
    model_class: str | None = None
    model_type: str | None = None
    target_modules: list[str] = field(default_factory=list)
    """Full module paths of the adapted matrices."""
    head_modules: list[str] = field(default_factory=list)
    """Top-level modules holding the task head (PEFT's ``modules_to_save``)."""
    hyperparameters: dict[str, Any] = field(default_factory=dict)
    """The method's config section."""
    base_gguf: dict[str, Any] | None = None
    """A GGUF base's ``file``, ``sha256`` and ``size`` (``adalora_cli.tasks.gguf``), since
    its path alone does not say which weights it holds, and where it came from when known
    (``repo``, ``revision``, ``filename`` of a hub file; ``package``, ``package_version``,
    ``package_file`` of a packaged one; its ``license``); None (not written) for any other."""

    def to_dict(self) -> dict[str, Any]:
        out = dataclasses.asdict(self)
        if out["base_gguf"] is None:
            del out["base_gguf"]
        return out

    @classmethod
    def from_dict(cls, data: Any) -> ExportFacts:
        """Missing keys keep their defaults; anything that is not a mapping reads as empty."""
        if not isinstance(data, dict):
            return cls()
        names = {f.name for f in dataclasses.fields(cls)}
        return cls(**{k: v for k, v in data.items() if k in names})


@dataclass
class Summary:
    """What ``summary.json`` holds, all of it: written last, its presence means the run
    finished. The loop fills every field here; nothing is added beside the record."""

    task: str
    method: str
    model: str | None = None
    seed: int | None = None
    adapter_params: int | None = None
    """The adapter at the method's initial size, as the dry run counts it."""
    head_params: int | None = None
    n_matrices: int | None = None
    total_steps: int | None = None
    metrics: dict[str, dict[str, float]] = field(default_factory=dict)
    """{split: {metric: value}} as the task's evaluate returned them."""
    metrics_at_start: dict[str, dict[str, float]] | None = None
    """The same before the first step (``train.eval_at_start``), else None."""
    train_seconds: float | None = None
    peak_memory_bytes: int | None = None
    device: str = ""
    epochs: float | None = None
    budget_level: int | None = None
    attempts: int = 1
    size: str | None = None
    """The method's size in words, e.g. 'r0=4' (None in summaries older than this field)."""
    config_digest: str | None = None
    """sha256 of the config without the seed and bookkeeping
    (``adalora_cli.methods.registry.config_digest``)."""
    report: TaskReport | None = None
    """The task's report columns."""
    export: ExportFacts = field(default_factory=ExportFacts)
    final_adapter_params: int | None = None
    """AdaLoRA: the adapter parameters of the triplets kept at the end (the paper's # Params)."""
    final_budget: int | None = None
    """AdaLoRA: b(T), the ranks kept at the end (the sum of ``rank_pattern.json``); with
    ``train.select=best``, those of the chosen step's mask."""
    weights: dict[str, Any] | None = None
    """What was saved: ``file`` and ``tensors`` (or ``model_dir``), ``allocator_state``."""
    data: dict[str, Any] = field(default_factory=dict)
    """The task's facts about its data: split sizes and sources (what T was computed from)."""
    checkpoint_bytes: int | None = None
    """Size of the last checkpoint written (deleted when the run finished)."""
    trainable_params: int | None = None
    """Parameters the optimizer trained: adapter at its initial size plus the task head."""
    final_mean_rank: float | None = None
    """AdaLoRA: b(T) / n, the mean final rank of an adapted matrix."""
    precision: dict[str, Any] = field(default_factory=dict)
    """What ran: ``autocast`` (fp32/bf16/fp16), the frozen base's ``base_dtype``,
    ``loss_scaling`` and ``skipped_steps`` (steps the fp16 loss scaler skipped);
    ``base_quant`` (nf4) when the base's linears were 4-bit (``model.quantize``)."""
    selected: dict[str, Any] | None = None
    """With ``train.select=best``: the step whose weights and scores the run ends with
    (``step``, ``split``, ``metric``, ``value``; ``from``: ``best`` for an evaluation before
    the last one, ``last`` when the last one scored best), and ``stopped_early_at``, the
    step where early stopping ended training (None when it ran to the end)."""

    _OPTIONAL = ("final_adapter_params", "final_budget", "weights", "final_mean_rank",
                 "metrics_at_start", "selected")
    """Written only when set, as before these records were typed."""

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            if f.name in self._OPTIONAL and value is None:
                continue
            out[f.name] = value.to_dict() if hasattr(value, "to_dict") else value
        return out

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Summary:
        """A record from a parsed summary.json; raises ValueError if task, method or
        metrics are missing. Fields a summary lacks keep their defaults (None); keys this
        version does not know (a newer writer's) are not read."""
        if not isinstance(data, dict):
            raise ValueError("summary.json is not a JSON object")
        if not isinstance(data.get("metrics"), dict):
            raise ValueError("summary.json has no metrics mapping")
        if not isinstance(data.get("task"), str) or not isinstance(data.get("method"), str):
            raise ValueError("summary.json lacks task or method")
        names = {f.name for f in dataclasses.fields(cls)}
        known = {k: v for k, v in data.items() if k in names}
        known["report"] = TaskReport.from_dict(data.get("report"))
        known["export"] = ExportFacts.from_dict(data.get("export"))
        return cls(**known)


def read_summary(run_dir: Path) -> Summary:
    """The run's summary; OSError if it is missing, ValueError if it is malformed."""
    return Summary.from_dict(json.loads((Path(run_dir) / SUMMARY).read_text()))
