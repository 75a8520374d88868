"""lm-evaluation-harness scores of a finished decoder run: ``adalora eval RUN --harness
TASKS``, and ``eval.harness`` once ``adalora train`` has finished the run.

The run's model is rebuilt in memory as ``adalora eval`` rebuilds it (its precision as the
run scored, :mod:`.scoring`) and handed to lm-eval as a model object
(:mod:`adalora_cli.tasks.harness`). With ``base`` the pretrained model is scored first, on
the same loaded weights, and the run's method and trained tensors are then put on it, so the
base costs no second load (a GGUF file's dequantization takes minutes on a CPU).

Scores go to ``harness.json`` in the run directory: ``{"adapted": {task: {metric: value}},
"base": {...}, "how": {model: {task: {rows, limit, chat_template, lm_eval, precision,
evaluated}}}}``; a task scored again replaces its own entry and leaves the others. Each
task's scored rows (prompt, response, target) go to ``harness/<model>-<task>.jsonl``. The
training's own results are never touched.
"""

from __future__ import annotations

import json
import sys
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import torch

from ..config import ConfigError, RunConfig, load_config
from ..rundir.layout import CONFIG, HARNESS, HARNESS_SAMPLES
from ..rundir.run import write_json_atomic, write_text_atomic
from .export import check_run

MODELS = ("base", "adapted")


def check_config(cfg: RunConfig, what: str) -> Any:
    """Refuse, in one line, an ``eval.harness`` that could not run: no lm-eval, an unknown
    task, a run that is not a decoder's. Returns lm-eval's task manager (None: no tasks)."""
    from ..tasks.harness import check_decoder, task_manager

    if not cfg.eval.harness:
        return None
    check_decoder(cfg, what)
    return task_manager(cfg.eval.harness)


def base_as_trained(model: torch.nn.Module, cfg: Any) -> torch.nn.Module:
    """The base model as the run trained on it: a copy with its linears in NF4 for a
    ``model.quantize=nf4`` run (the method is applied to the unquantized base first, as the
    run's build applies it), else the model itself."""
    if cfg.model.quantize == "none":
        return model
    import copy

    from ..engine.quantize import quantize_base

    quantized = copy.deepcopy(model)
    for p in quantized.parameters():
        p.requires_grad_(False)  # the whole base is frozen: every backbone linear is NF4
    quantize_base(quantized)
    return quantized


def score_run(run_dir: str | Path, tasks: list[str] | None = None, *,
              limit: int | None = None, base: bool = False,
              chat_template: bool | None = None, quiet: bool = False) -> dict[str, Any]:
    """Score a finished run on harness ``tasks`` (default: its ``eval.harness``) and write
    the scores; returns ``{model: {task: {metric: value}}}`` of what was scored now."""
    from ..engine.build import pick_device, resolve_resources
    from ..methods.registry import method_spec
    from ..tasks.harness import check_decoder, evaluate, task_manager
    from .load import attach_trained, load_base, load_run
    from .scoring import choose

    run_dir = Path(run_dir)
    summary = check_run(run_dir)
    cfg = resolve_resources(load_config(run_dir / CONFIG))
    names = list(tasks or cfg.eval.harness)
    if chat_template is None:
        chat_template = cfg.eval.harness_chat_template
    check_decoder(cfg, f"run {run_dir}")
    manager = task_manager(names)
    scoring = choose(cfg, summary, pick_device(cfg.train.device), None,
                     lambda value: f"train.precision={value}")
    if not quiet:
        print(scoring.line, file=sys.stderr, flush=True)
    autocast = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(scoring.precision)

    def run(model: torch.nn.Module, tokenizer: Any, which: str) -> dict[str, Any]:
        if not quiet:
            print(f"lm-evaluation-harness: {', '.join(names)} on the {which} model",
                  file=sys.stderr, flush=True)
        return evaluate(model.to(scoring.device), tokenizer, names, manager, limit=limit,
                        batch_size=cfg.train.eval_batch_size, max_length=cfg.task.max_length,
                        chat_template=chat_template, autocast_dtype=autocast, quiet=quiet)

    results: dict[str, dict[str, Any]] = {}
    whole = method_spec(cfg.method.name).saves_whole_model
    if base or not whole:
        model, tokenizer, _ = load_base(run_dir, scoring.base_dtype)
        if base:
            rng = torch.random.get_rng_state()  # lm-eval seeds torch: the method's init
            results["base"] = run(base_as_trained(model, cfg), tokenizer, "base")
            torch.random.set_rng_state(rng)  # draws as load_run's would
            model.cpu()
        if not whole:
            attach_trained(model, cfg, run_dir, scoring.base_dtype)
    if whole:
        model, tokenizer, _ = load_run(run_dir, "cpu", scoring.base_dtype)
    results["adapted"] = run(model, tokenizer, "adapted")
    write_results(run_dir, results, limit, scoring.record())
    return {which: out["scores"] for which, out in results.items()}


def write_results(run_dir: Path, results: dict[str, dict[str, Any]], limit: int | None,
                  precision: dict[str, Any]) -> Path:
    """Merge ``results`` ({model: evaluate()'s output}) into ``harness.json`` and write each
    task's rows; returns the path of ``harness.json``."""
    path = run_dir / HARNESS
    record = read_results(run_dir) or {}
    when = datetime.now(timezone.utc).isoformat(timespec="seconds")
    folder = run_dir / HARNESS_SAMPLES
    folder.mkdir(exist_ok=True)
    for which, out in results.items():
        for task, scores in out["scores"].items():
            record.setdefault(which, {})[task] = scores
            rows = out["samples"].get(task, [])
            record.setdefault("how", {}).setdefault(which, {})[task] = {
                "rows": len(rows), "limit": limit, "chat_template": out["chat_template"],
                "lm_eval": out["lm_eval"], "precision": precision, "evaluated": when}
            write_text_atomic(folder / f"{which}-{task}.jsonl",
                              "".join(json.dumps(r) + "\n" for r in rows))
    write_json_atomic(path, record)
    return path


def read_results(run_dir: Path) -> dict[str, Any] | None:
    """``harness.json`` of a run, or None when it has none (or an unreadable one)."""
    try:
        record = json.loads((Path(run_dir) / HARNESS).read_text())
    except (OSError, ValueError):
        return None
    return record if isinstance(record, dict) else None


def lines(run_dir: Path, scored: dict[str, dict[str, dict[str, float | None]]]) -> list[str]:
    """What the CLI prints: each harness score, and beside it the run's own score of the
    same name when the harness task is the run's task (``bbc_topic_chat``), before training
    (base) and after (adapted)."""
    from ..rundir.summary import read_summary

    summary = read_summary(run_dir)
    own = {"base": summary.metrics_at_start or {}, "adapted": summary.metrics or {}}
    task = load_config(run_dir / CONFIG).task.name
    out = []
    for which in MODELS:
        for name, scores in scored.get(which, {}).items():
            mine = own[which].get("validation", {}) if name == task else {}
            parts = []
            for metric, value in scores.items():
                text = f"{metric} {'n/a' if value is None else f'{value:.4f}'}"
                if isinstance(mine.get(metric), (int, float)):
                    text += f" (the run's own {metric} {mine[metric]:.4f})"
                parts.append(text)
            out.append(f"harness {name}, {which} model: {'  '.join(parts)}")
    return out


def describe_failure(run_dir: Path, err: BaseException) -> ConfigError:
    """A harness that failed after training: the run itself is finished and kept."""
    return ConfigError(f"{err}; the run {run_dir} finished and is kept: score it with "
                       f"`adalora eval {run_dir} --harness TASKS`")
