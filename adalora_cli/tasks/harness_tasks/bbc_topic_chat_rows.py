"""The rows and the score of the ``bbc_topic_chat`` harness task (``bbc_topic_chat.yaml``
beside this file, which lm-eval loads with ``include_path``).

The rows are adalora's own: :func:`adalora_cli.tasks.bbc_topic_chat.load_chats` gives the
validation chats, whose user turn is the question and whose assistant turn is the topic, so
the harness asks exactly what a run's evaluation asks. The score is the run's exact match
(``CausalLMTask._generation_scores``): the reply and the topic equal once stripped, x 100.
"""

from __future__ import annotations

from typing import Any


def validation(**_metadata: Any):
    """``{"validation": rows}`` with ``id``, ``question`` and ``topic`` (lm-eval passes the
    task's metadata as keyword arguments; none is needed)."""
    import datasets

    from adalora_cli.tasks.bbc_topic_chat import load_chats

    chats = load_chats()["validation"]
    return datasets.DatasetDict({"validation": datasets.Dataset.from_dict({
        "id": list(chats["id"]),
        "question": [m[-2]["content"] for m in chats["messages"]],
        "topic": [m[-1]["content"] for m in chats["messages"]]})})


def exact_match(doc: dict[str, Any], results: list[str]) -> dict[str, float]:
    return {"exact_match": 100.0 * (results[0].strip() == doc["topic"].strip())}
