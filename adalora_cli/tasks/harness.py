"""lm-evaluation-harness (``lm-eval``, the ``harness`` extra) on a decoder in memory.

The harness scores a model object as it is (lm-eval's ``HFLM`` takes ``pretrained=`` a
model and its tokenizer), so a run's adapted model is scored in-process with its adapters
as trained, never through a merged or exported copy. Task names are lm-eval's (``gsm8k``,
``arc_easy``, ...; most download their data from the hub on first use) and the tasks that
ship with adalora in :data:`SHIPPED` (``bbc_topic_chat``: the LLM demo's validation chats,
offline), found through lm-eval's ``include_path``.

Under a chat template (by default whenever the tokenizer has one, as for an instruct model)
the harness renders each prompt with it and adds no BOS token of its own: the template
writes every special token, as the run's own evaluation encodes chats
(:mod:`.causal_lm_data`). Without one, lm-eval's plain-text prompts go through unchanged.
"""

from __future__ import annotations

import difflib
import math
from pathlib import Path
from typing import Any

from ..config import ConfigError, RunConfig

SHIPPED = Path(__file__).with_name("harness_tasks")
"""lm-eval task YAMLs that ship with adalora (``include_path``)."""
NOT_SCORES = ("alias", "sample_len", "sample_count")
"""Entries of lm-eval's results that are not scores."""
INSTALL = "pip install 'adalora[harness]'"


def check_decoder(cfg: RunConfig, what: str) -> None:
    """The harness generates and scores text with a decoder: a run of another task family
    (a classifier, SQuAD's span head, an encoder-decoder) is refused in one line."""
    from . import get_task

    model_class = get_task(cfg).model_class
    if model_class != "AutoModelForCausalLM":
        raise ConfigError(f"{what}: lm-evaluation-harness scores a decoder language model, "
                          f"and task {cfg.task.name} trains {model_class}, not a language "
                          "model head; use it with a causal_lm or bbc_topic_chat run (drop "
                          "eval.harness / --harness here)")


def task_manager(names: list[str]) -> Any:
    """lm-eval's ``TaskManager`` that knows every task in ``names``; an unknown name (or no
    lm-eval installed) is a one-line ConfigError. Only adalora's own tasks are indexed when
    they are all that is asked for: indexing lm-eval's ~15,000 takes seconds."""
    try:
        from lm_eval.tasks import TaskManager
    except ImportError:
        raise ConfigError(f"lm-evaluation-harness is not installed; `{INSTALL}` (or "
                          "`make install`) adds it") from None
    if not names:
        raise ConfigError("name at least one harness task, e.g. --harness bbc_topic_chat")
    ours = TaskManager(include_path=str(SHIPPED), include_defaults=False)
    if all(n in ours.all_tasks for n in names):
        return ours
    every = TaskManager(include_path=str(SHIPPED))
    for name in names:
        if name not in every.all_tasks:
            close = difflib.get_close_matches(name, every.all_tasks, n=1, cutoff=0.6)
            hint = f"did you mean {close[0]}? " if close else ""
            raise ConfigError(f"unknown harness task {name!r}; {hint}`lm-eval ls tasks` lists "
                              f"lm-evaluation-harness's tasks, and adalora ships "
                              f"{', '.join(ours.all_tasks)}")
    return every


def evaluate(model: Any, tokenizer: Any, names: list[str], manager: Any, *,
             limit: int | None, batch_size: int, max_length: int,
             chat_template: bool | None, autocast_dtype: Any = None,
             quiet: bool = False) -> dict[str, Any]:
    """Score ``model`` on the harness tasks ``names``: ``{"scores": {task: {metric: value}},
    "samples": {task: [{doc_id, prompt, response, target}]}, "chat_template": bool,
    "lm_eval": version}``. A prompt longer than ``max_length`` less the tokens to generate
    keeps its end (lm-eval's truncation), as ``adalora predict`` keeps it. Metric names keep
    lm-eval's filter (``exact_match,strict-match`` becomes ``exact_match (strict-match)``;
    the default ``none`` filter is dropped). ``quiet``: without lm-eval's progress bars."""
    import contextlib
    import io
    import logging
    from importlib import metadata

    from lm_eval import simple_evaluate
    from lm_eval.models.huggingface import HFLM

    # lm-eval warns that it was handed a model object, not a name (how a run scores its own
    # model) and how to pass task metadata: advice for its command line, not for a run
    logging.getLogger("lm_eval").setLevel(logging.ERROR)

    if tokenizer.pad_token_id is None:  # as causal_lm pads: with the end-of-sequence token
        tokenizer.pad_token = tokenizer.eos_token
    chat = bool(getattr(tokenizer, "chat_template", None)) if chat_template is None \
        else chat_template
    if chat and not getattr(tokenizer, "chat_template", None):
        raise ConfigError("eval.harness_chat_template=true, but the tokenizer has no chat "
                          "template; set it to false (or null: use one when there is one)")
    was_training = model.training
    model.eval()
    try:
        lm = HFLM(pretrained=model, tokenizer=tokenizer, batch_size=batch_size,
                  max_length=max_length,
                  add_bos_token=False if chat else None,
                  mixed_precision_dtype=autocast_dtype)
        # lm-eval's bars write to stderr as they are made: muted by catching that stream
        muted = contextlib.redirect_stderr(io.StringIO()) if quiet else contextlib.nullcontext()
        with muted:
            out = simple_evaluate(model=lm, tasks=list(names), task_manager=manager,
                                  limit=limit, apply_chat_template=chat, log_samples=True,
                                  bootstrap_iters=0, verbosity="ERROR")
    finally:
        model.train(was_training)
    return {"scores": {task: _metrics(values) for task, values in out["results"].items()},
            "samples": {task: [_sample(s) for s in rows]
                        for task, rows in (out.get("samples") or {}).items()},
            "chat_template": chat, "lm_eval": metadata.version("lm_eval")}


def _metrics(values: dict[str, Any]) -> dict[str, float | None]:
    out: dict[str, float | None] = {}
    for key, value in values.items():
        name, _, flt = key.partition(",")
        number = isinstance(value, (int, float)) and not isinstance(value, bool)
        if "_stderr" in name or name in NOT_SCORES or not number:
            continue  # the alias, row counts, and the bootstrap errors (off)
        shown = name if flt in ("", "none") else f"{name} ({flt})"
        out[shown] = float(value) if math.isfinite(value) else None
    return out


def _sample(row: dict[str, Any]) -> dict[str, Any]:
    """One scored row as lm-eval logs it: the prompt it sent, the reply after its filters,
    the target."""
    args = row.get("arguments") or [[None]]
    first = args[0] if isinstance(args, list) else next(iter(args.values()))
    prompt = first[0] if isinstance(first, (list, tuple)) else first
    responses = row.get("filtered_resps") or [None]
    response = responses[0]
    if isinstance(response, (list, tuple)):
        response = response[0] if response else None
    return {"doc_id": row.get("doc_id"), "prompt": prompt, "response": response,
            "target": row.get("target")}
