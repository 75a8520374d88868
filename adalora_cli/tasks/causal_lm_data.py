"""Rows of your own data as token ids and labels for a decoder-only model.

Three row shapes, recognised by their columns (names configurable, see ``task.*_column``):

- ``messages``: a chat, ``[{role, content}, ...]`` ending with the assistant's reply,
  rendered with the tokenizer's chat template. The prompt is the conversation before the
  last reply with the template's generation prompt; the response is the rest of the rendered
  text (the reply and whatever the template closes it with, e.g. an end-of-turn token).
- ``prompt`` + ``response``: the prompt is tokenized as the tokenizer frames a text (Llama
  prepends ``<s>``, GPT-2 adds nothing), the response follows it and ends with EOS.
- ``text``: one plain text, then EOS; every token is a target.

Labels are the input ids with prompt positions set to -100 (ignored by cross-entropy), so the
loss covers response tokens only unless ``task.train_on_prompt``; the model shifts labels
itself. A row longer than ``task.max_length`` loses the end of its response; a prompt that
leaves no room for a single response token is refused with the row named. With
``task.packing`` short training rows are concatenated, in order, into rows of at most
``max_length`` tokens.

A row whose shape has nothing to learn (a missing, null or empty response or text, an empty
chat) is left out, and :func:`usable_rows` says in one line which rows and why; a file whose
rows come in two shapes (a text row among prompt/response rows) is refused, since training
one shape and dropping the other is never what was meant.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import torch

from ..config import ConfigError, TaskConfig

LABEL_PAD = -100
"""Label id that cross-entropy ignores (PyTorch's default ``ignore_index``)."""


@dataclass(frozen=True)
class Shape:
    """Which columns a split's rows use: ``kind`` is messages, pair or text."""

    kind: str
    columns: tuple[str, ...]


def row_shape(columns: list[str], task: TaskConfig, where: str) -> Shape:
    """The row shape of a table from its column names; neither shape is a one-line error."""
    if task.messages_column in columns:
        return Shape("messages", (task.messages_column,))
    if task.prompt_column in columns and task.response_column in columns:
        return Shape("pair", (task.prompt_column, task.response_column))
    if task.text_column in columns:
        return Shape("text", (task.text_column,))
    raise ConfigError(
        f"{where} has neither a {task.text_column!r} column nor {task.prompt_column!r} + "
        f"{task.response_column!r} (nor {task.messages_column!r}); it has "
        f"{', '.join(columns) or 'no columns'}; rename its columns or set task.text_column, "
        "task.prompt_column / task.response_column or task.messages_column")


SHAPE_WORDS = {"messages": "chat messages", "pair": "prompt + response", "text": "text"}


def _present(value: Any) -> bool:
    """A value a row really holds: not missing (pandas reads a missing key as NaN or None)
    and not empty (an empty string, a blank text, an empty chat)."""
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return False
    if isinstance(value, str):
        return bool(value.strip())
    try:
        return len(value) > 0
    except TypeError:
        return True


def lacks(kind: str, row: dict[str, Any], task: TaskConfig) -> str | None:
    """The column a row of shape ``kind`` has nothing in (None: the row is whole). An empty
    prompt is allowed (the response is then learned unconditioned); a null one is not."""
    if kind == "messages":
        return None if _present(row.get(task.messages_column)) else task.messages_column
    if kind == "pair":
        prompt = row.get(task.prompt_column)
        if prompt is None or (isinstance(prompt, float) and math.isnan(prompt)):
            return task.prompt_column
        return None if _present(row.get(task.response_column)) else task.response_column
    return None if _present(row.get(task.text_column)) else task.text_column


def _shape_of_values(row: dict[str, Any], task: TaskConfig) -> str | None:
    """The shape a single row's values have, whatever the file's columns say."""
    for kind in ("messages", "pair", "text"):
        if lacks(kind, row, task) is None:
            return kind
    return None


def usable_rows(rows: list[dict[str, Any]], shape: Shape, task: TaskConfig,
                where: str) -> tuple[list[int], str | None]:
    """The indices of the rows that have something to learn, and one line naming the rows
    left out and why (None when every row is kept).

    Rows of another shape than the file's (a ``text`` row in a prompt/response file) are
    refused; so is a split where no row is left."""
    kept, lacking, others = [], {}, []
    for i, row in enumerate(rows):
        column = lacks(shape.kind, row, task)
        if column is None:
            kept.append(i)
            continue
        other = _shape_of_values(row, task)
        if other is not None:
            others.append((i + 1, other))
        else:
            lacking.setdefault(column, []).append(i + 1)
    if others:
        first, kind = others[0]
        theirs = (f"row {first} is" if len(others) == 1
                  else f"{len(others)} rows (the first is row {first}) are")
        raise ConfigError(
            f"{where} mixes row shapes: its rows are {SHAPE_WORDS[shape.kind]}, "
            f"but {theirs} {SHAPE_WORDS[kind]}; keep one shape per file, or rewrite those "
            "rows in the file's shape")
    if not lacking:
        return kept, None
    why = "; ".join(f"row{'s' if len(numbers) > 1 else ''} {_numbers(numbers)} "
                    f"{'have' if len(numbers) > 1 else 'has'} no {column!r}"
                    for column, numbers in lacking.items()) + " (missing, null or empty)"
    if not kept:
        raise ConfigError(f"{where}: none of its {len(rows)} rows has anything to learn "
                          f"({why}); fill those values in")
    return kept, (f"left out {len(rows) - len(kept)} of the {len(rows)} rows of {where}: "
                  f"{why}; the run uses the other {len(kept)}")


def _numbers(numbers: list[int], shown: int = 5) -> str:
    more = len(numbers) - shown
    return ", ".join(map(str, numbers[:shown])) + (f" and {more} more" if more > 0 else "")


def _text(value: Any) -> str:
    return "" if value is None else str(value)


def _chat_parts(tokenizer: Any, messages: Any, where: str) -> tuple[str, str, str]:
    """(prompt text, response text, reply) of one chat rendered by the template."""
    if not getattr(tokenizer, "chat_template", None):
        raise ConfigError(f"{where} holds chat messages but the tokenizer has no chat "
                          "template; give prompt and response columns instead")
    messages = check_messages(messages, where)
    if messages[-1].get("role") != "assistant":
        raise ConfigError(f"{where}: a conversation must end with the assistant's reply "
                          "(role 'assistant'), which is what the model learns to write")
    prompt = tokenizer.apply_chat_template(messages[:-1], tokenize=False,
                                           add_generation_prompt=True)
    full = tokenizer.apply_chat_template(messages, tokenize=False)
    if not full.startswith(prompt):
        raise ConfigError(f"{where}: the chat template renders the conversation without its "
                          "generation prompt as a prefix; use prompt and response columns")
    return prompt, full[len(prompt):], _text(messages[-1].get("content"))


def check_messages(messages: Any, where: str) -> list[dict[str, Any]]:
    """A chat as a list of ``{role, content}`` dicts; anything else (a string, a list of
    strings) is a one-line error, not a crash deep in the template."""
    if isinstance(messages, (str, bytes)) or not hasattr(messages, "__iter__"):
        raise ConfigError(f"{where}: chat messages must be a list of {{\"role\": ..., "
                          f"\"content\": ...}} objects, got {type(messages).__name__} "
                          f"{str(messages)[:40]!r}; give a list, or use a prompt column")
    messages = list(messages)
    bad = next((m for m in messages if not isinstance(m, dict) or "role" not in m), None)
    if bad is not None or not messages:
        raise ConfigError(f"{where}: chat messages must be a non-empty list of "
                          f"{{\"role\": ..., \"content\": ...}} objects, got "
                          f"{str(bad if bad is not None else messages)[:40]!r}")
    return messages


def encode_row(tokenizer: Any, shape: Shape, row: dict[str, Any], task: TaskConfig,
               where: str) -> dict[str, Any]:
    """``input_ids``, ``labels`` and, for prompted rows, ``prompt_ids`` and ``reference``."""
    eos = [tokenizer.eos_token_id]
    def ids(text: str, special: bool) -> list[int]:
        return list(tokenizer(text, add_special_tokens=special)["input_ids"])
    reference = None
    if shape.kind == "text":
        prompt, response = [], ids(_text(row[shape.columns[0]]), True) + eos
    elif shape.kind == "pair":
        reference = _text(row[shape.columns[1]])
        prompt, response = ids(_text(row[shape.columns[0]]), True), ids(reference, False) + eos
    else:  # the template writes every special token itself
        p, r, reference = _chat_parts(tokenizer, row[shape.columns[0]], where)
        prompt, response = ids(p, False), ids(r, False)
    room = task.max_length - len(prompt)
    if room < 1:
        raise ConfigError(f"{where}: the prompt is {len(prompt)} tokens, which leaves no room "
                          f"for the response within task.max_length={task.max_length}; raise "
                          "task.max_length or shorten the prompt")
    response = response[:room]
    masked = prompt if task.train_on_prompt else [LABEL_PAD] * len(prompt)
    out: dict[str, Any] = {"input_ids": prompt + response, "labels": masked + response}
    if reference is not None:
        out.update(prompt_ids=prompt, reference=reference)
    return out


def pack(rows: list[dict[str, Any]], max_length: int) -> list[dict[str, Any]]:
    """Concatenate rows, in order, into rows of at most ``max_length`` tokens (a row is never
    split: one that does not fit starts the next packed row)."""
    packed: list[dict[str, Any]] = []
    ids: list[int] = []
    labels: list[int] = []
    for row in rows:
        if ids and len(ids) + len(row["input_ids"]) > max_length:
            packed.append({"input_ids": ids, "labels": labels})
            ids, labels = [], []
        ids, labels = ids + row["input_ids"], labels + row["labels"]
    if ids:
        packed.append({"input_ids": ids, "labels": labels})
    return packed


def pad_right(items: list[dict[str, Any]], pad_id: int) -> dict[str, torch.Tensor]:
    """Training and scoring batch: right-padded ids, attention mask, labels (-100 padded)."""
    width = max(len(i["input_ids"]) for i in items)
    def pad(row: list[int], value: int) -> list[int]:
        return list(row) + [value] * (width - len(row))
    return {"input_ids": torch.tensor([pad(i["input_ids"], pad_id) for i in items]),
            "attention_mask": torch.tensor([pad([1] * len(i["input_ids"]), 0) for i in items]),
            "labels": torch.tensor([pad(i["labels"], LABEL_PAD) for i in items])}


def pad_left(prompts: list[list[int]], pad_id: int) -> dict[str, torch.Tensor]:
    """Generation batch: prompts padded on the left, so every row continues at the end."""
    width = max(len(p) for p in prompts)
    return {"input_ids": torch.tensor([[pad_id] * (width - len(p)) + list(p) for p in prompts]),
            "attention_mask": torch.tensor([[0] * (width - len(p)) + [1] * len(p)
                                            for p in prompts])}
