"""Rows of your own data as token ids and labels for a decoder-only model.

Five row shapes, recognised by their columns (``task.format: auto``, in this order) or named
by ``task.format`` (the first three's column names are configurable, see ``task.*_column``):

- ``messages``: a chat, ``[{role, content}, ...]`` ending with the assistant's reply,
  rendered with the tokenizer's chat template. The prompt is the conversation before the
  last reply with the template's generation prompt; the response is the rest of the rendered
  text (the reply and whatever the template closes it with, e.g. an end-of-turn token).
- sharegpt: ``conversations``, ``[{from, value}, ...]`` with ``from`` human, gpt or system
  (user and assistant also read), and an optional ``system`` column: the same chat as
  ``messages`` with the roles renamed, ending with a gpt turn.
- alpaca: ``instruction``, an optional ``input``, ``output``, and optional ``system`` and
  ``history`` (``[[instruction, output], ...]`` of earlier turns) columns, read as
  LLaMA-Factory reads them: the user turn is the instruction and the input joined by one
  newline (an empty input adds nothing), the assistant's reply is the output; then rendered
  as a chat. Stanford Alpaca's own "Below is an instruction ..." prompt is not added: the
  chat template frames the turn instead.
- ``prompt`` + ``response``: the prompt is tokenized as the tokenizer frames a text (Llama
  prepends ``<s>``, GPT-2 adds nothing), the response follows it and ends with EOS.
- ``text``: one plain text, then EOS; every token is a target.

Chats of every shape learn only their last reply, earlier turns being context, and
``task.system_prompt`` opens every chat that has no system turn of its own.

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
from collections import Counter
from dataclasses import dataclass
from typing import Any

import torch

from ..config import ConfigError, TaskConfig

LABEL_PAD = -100
"""Label id that cross-entropy ignores (PyTorch's default ``ignore_index``)."""


@dataclass(frozen=True)
class Shape:
    """Which columns a split's rows use: ``kind`` is messages, sharegpt, alpaca, pair or
    text; ``columns`` are those every row of the kind needs."""

    kind: str
    columns: tuple[str, ...]


KINDS = {"messages": "messages", "sharegpt": "sharegpt", "alpaca": "alpaca",
         "prompt_response": "pair", "text": "text"}
"""``task.format`` -> shape kind, in the order ``auto`` tries them."""
CHATS = ("messages", "sharegpt", "alpaca")
"""The kinds rendered with the tokenizer's chat template."""
SHAREGPT_ROLES = {"human": "user", "user": "user", "gpt": "assistant",
                  "assistant": "assistant", "system": "system"}
"""A sharegpt turn's ``from`` -> the chat role the template knows."""


def needed(kind: str, task: TaskConfig) -> tuple[str, ...]:
    """The columns every row of a kind needs."""
    return {"messages": (task.messages_column,), "sharegpt": ("conversations",),
            "alpaca": ("instruction", "output"),
            "pair": (task.prompt_column, task.response_column),
            "text": (task.text_column,)}[kind]


def row_shape(columns: list[str], task: TaskConfig, where: str) -> Shape:
    """The row shape of a table, named by ``task.format`` or told by its column names; a
    table without the columns of one is a one-line error."""
    have = f"it has {', '.join(columns) or 'no columns'}"
    if task.format != "auto":
        kind = KINDS[task.format]
        missing = [c for c in needed(kind, task) if c not in columns]
        if missing:
            raise ConfigError(
                f"{where} has no {missing[0]!r} column, which task.format={task.format} "
                f"reads ({' + '.join(needed(kind, task))}); {have}; rename its columns, or "
                "set task.format=auto to tell the format by the columns")
    else:
        kind = next((k for k in KINDS.values()
                     if all(c in columns for c in needed(k, task))), None)
        if kind is None and "instruction" in columns:
            raise ConfigError(
                f"{where} has an 'instruction' column but no 'output', the reply an alpaca "
                f"row teaches (instruction, optional input, output); {have}; add the "
                "replies as 'output'")
        if kind is None:
            raise ConfigError(
                f"{where} has neither a {task.text_column!r} column nor "
                f"{task.prompt_column!r} + {task.response_column!r} (nor "
                f"{task.messages_column!r}, sharegpt's 'conversations' or alpaca's "
                f"'instruction' + 'output'); {have}; rename its columns or set "
                "task.text_column, task.prompt_column / task.response_column or "
                "task.messages_column")
    if task.system_prompt and kind not in CHATS:
        raise ConfigError(
            f"{where} holds {SHAPE_WORDS[kind]} rows, which are used verbatim with no place "
            "for task.system_prompt; put the system text into the prompts (and drop "
            "task.system_prompt), or give the rows as chats (messages, alpaca or sharegpt)")
    return Shape(kind, needed(kind, task))


SHAPE_WORDS = {"messages": "chat messages", "sharegpt": "sharegpt conversations",
               "alpaca": "alpaca (instruction + output)", "pair": "prompt + response",
               "text": "text"}


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
    if kind in ("messages", "sharegpt"):
        (column,) = needed(kind, task)
        return None if _present(row.get(column)) else column
    if kind == "alpaca":  # LLaMA-Factory's two required columns
        return next((c for c in ("instruction", "output") if not _present(row.get(c))), None)
    if kind == "pair":
        prompt = row.get(task.prompt_column)
        if prompt is None or (isinstance(prompt, float) and math.isnan(prompt)):
            return task.prompt_column
        return None if _present(row.get(task.response_column)) else task.response_column
    return None if _present(row.get(task.text_column)) else task.text_column


def _shape_of_values(row: dict[str, Any], task: TaskConfig) -> str | None:
    """The shape a single row's values have, whatever the file's columns say."""
    for kind in KINDS.values():
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
        # the file's shape is what most rows hold: the columns alone name the first kind
        # present, which one sharegpt row among alpaca rows would make the file's
        kinds = dict.fromkeys(range(1, len(rows) + 1), shape.kind) | dict(others)
        counts = Counter(kinds.values())
        main = max(counts, key=lambda k: (counts[k], k == shape.kind))
        odd = [(i, kind) for i, kind in kinds.items() if kind != main]
        first, kind = odd[0]
        theirs = (f"row {first} is" if len(odd) == 1
                  else f"{len(odd)} rows (the first is row {first}) are")
        raise ConfigError(
            f"{where} mixes row shapes: its rows are {SHAPE_WORDS[main]}, "
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


def chat_of(kind: str, row: dict[str, Any], task: TaskConfig, where: str,
            reply: bool = True) -> list[dict[str, Any]]:
    """The conversation a chat-shaped row holds, as ``{role, content}`` turns, opened by
    task.system_prompt when it has no system turn of its own. ``reply=False`` (``adalora
    predict``) gives the turns the model is asked to answer: without a closing assistant
    (gpt) turn, and an alpaca row without its output, as evaluation asks a validation row."""
    if kind == "messages":
        turns = check_messages(row[task.messages_column], where)
    elif kind == "sharegpt":
        turns = _sharegpt_turns(row, where, reply)
    else:
        turns = _alpaca_turns(row, where, reply)
    if not reply:
        if turns[-1].get("role") == "assistant":
            turns = turns[:-1]  # the reference reply of a validation row: asked, not given
        if not any(t.get("role") == "user" for t in turns):
            raise ConfigError(f"{where}: a chat to answer needs a user turn (sharegpt: "
                              f"human), got {str(turns)[:60]!r}")
    return with_system(turns, task.system_prompt)


def with_system(turns: list[dict[str, Any]], system: str | None) -> list[dict[str, Any]]:
    """``turns`` opened by a system turn of ``system``, unless empty or it has one."""
    if not system or turns[0].get("role") == "system":
        return turns
    return [{"role": "system", "content": system}, *turns]


def _sharegpt_turns(row: dict[str, Any], where: str, reply: bool) -> list[dict[str, Any]]:
    conversation = row["conversations"]
    bad: Any = conversation
    if not isinstance(conversation, (str, bytes)) and hasattr(conversation, "__iter__"):
        bad = next((t for t in conversation if not isinstance(t, dict)
                    or t.get("from") is None or "value" not in t), None)
    if bad is not None:
        if isinstance(bad, dict):  # a table gives every turn every key any turn has
            bad = {k: v for k, v in bad.items() if v is not None}
        raise ConfigError(f"{where}: sharegpt conversations must be a list of {{\"from\": "
                          f"..., \"value\": ...}} objects, got {str(bad)[:40]!r}")
    turns = []
    for j, turn in enumerate(conversation, start=1):
        role = SHAREGPT_ROLES.get(str(turn["from"]))
        if role is None:
            raise ConfigError(f"{where}: turn {j} is from {str(turn['from'])!r}; sharegpt turns "
                              "are read from human, gpt or system (user and assistant too; "
                              "tool turns are not read); rewrite or drop the row")
        turns.append({"role": role, "content": _text(turn["value"])})
    if reply and turns[-1]["role"] != "assistant":
        raise ConfigError(f"{where}: a sharegpt conversation must end with a 'gpt' turn, the "
                          "reply the model learns to write")
    system = row.get("system")  # LLaMA-Factory's system column, when no turn is one
    return with_system(turns, str(system) if _present(system) else None)


def _alpaca_turns(row: dict[str, Any], where: str, reply: bool) -> list[dict[str, Any]]:
    turns = []
    if _present(row.get("system")):
        turns.append({"role": "system", "content": str(row["system"])})
    history = row.get("history")
    for pair in (history if _present(history) else []):
        if (isinstance(pair, (str, bytes)) or not hasattr(pair, "__len__") or len(pair) != 2
                or not all(isinstance(x, str) for x in pair)):
            raise ConfigError(f"{where}: alpaca history must be a list of [instruction, "
                              f"output] pairs of texts, got {str(pair)[:40]!r}")
        turns += [{"role": "user", "content": pair[0]},
                  {"role": "assistant", "content": pair[1]}]
    # LLaMA-Factory's join: "instruction\ninput", an empty input adding nothing
    query = "\n".join(str(row[c]) for c in ("instruction", "input") if _present(row.get(c)))
    turns.append({"role": "user", "content": query})
    return turns + ([{"role": "assistant", "content": str(row["output"])}] if reply else [])


def _chat_parts(tokenizer: Any, messages: list[dict[str, Any]],
                where: str) -> tuple[str, str, str]:
    """(prompt text, response text, reply) of one chat rendered by the template."""
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
    else:  # a chat: the template writes every special token itself
        if not getattr(tokenizer, "chat_template", None):
            raise ConfigError(f"{where} holds {SHAPE_WORDS[shape.kind]} but the tokenizer has "
                              "no chat template; give prompt and response columns instead")
        p, r, reference = _chat_parts(tokenizer, chat_of(shape.kind, row, task, where), where)
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
