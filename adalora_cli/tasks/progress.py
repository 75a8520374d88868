"""Progress from inside a task's long loops to whoever shows it.

Scoring the demo LLM's 205 validation chats takes minutes, and so does dequantizing a GGUF
file; a task's loops are the only place that knows how far along they are. They report
through :func:`counted` (``"generating"``, 64 of 205 rows done) to the listener the caller
set with :func:`listening`: the training loop's bar or log lines, ``adalora eval``'s lines.
With no one listening (``--quiet``, ``adalora predict``, a test) a report costs one lookup.
A report never changes what is computed: it is made after a batch, between two of them.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterable, Iterator
from contextvars import ContextVar
from typing import TypeVar

T = TypeVar("T")

Listener = Callable[[str, int, int], None]
"""``listener(what, done, total)``: e.g. ("generating", 64, 205), ("dequantizing", 3, 272)."""

_LISTENER: ContextVar[Listener | None] = ContextVar("adalora_task_progress", default=None)


@contextlib.contextmanager
def listening(listener: Listener | None):
    """Inside: every report goes to ``listener`` (None: to no one)."""
    token = _LISTENER.set(listener)
    try:
        yield
    finally:
        _LISTENER.reset(token)


def counted(items: Iterable[T], what: str, total: int | None = None,
            size: Callable[[T], int] = len) -> Iterator[T]:
    """``items`` one by one; before the first and after each, the listener hears how many
    of ``total`` units (``size(item)`` each: the rows of a batch) are done. ``total``
    defaults to the sum of the sizes (``items`` must then be a sequence)."""
    listener = _LISTENER.get()
    if listener is None:
        yield from items
        return
    if total is None:
        total = sum(size(item) for item in items)  # type: ignore[union-attr]
    done = 0
    listener(what, done, total)
    for item in items:
        yield item
        done += size(item)
        listener(what, done, total)
