"""What a checkpoint records of the data it was trained on: every split's size and a sha256
of its encoded examples, so that a resume on other data (rows appended, which changes T
mid-run; a label edited in place) is refused as a config edit is.

The encoded examples are what training and evaluation consume, so the fingerprint covers the
rows, the tokenizer and every encoding setting at once. A :class:`datasets.Dataset` is hashed
through its Arrow columns (IPC-serialized into the hash, so no copy is held in memory and a
million rows take about a second); any other dataset (SQuAD's windows) item by item.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any

from ..config import ConfigError

KEY = "dataset"
"""The record's key in a checkpoint's ``state.pt``."""


class _Sink:
    """A write-only file that feeds everything written to it into a hash."""

    def __init__(self, digest: Any):
        self.digest, self.closed = digest, False

    def write(self, data: Any) -> int:
        self.digest.update(data)
        return len(data)

    def flush(self) -> None: ...

    def close(self) -> None:
        self.closed = True


def digest(data: Any) -> str:
    """sha256 of a split's encoded examples, in order."""
    h = hashlib.sha256()
    try:
        import datasets
        import pyarrow as pa
    except ImportError:  # pragma: no cover - both are dependencies
        datasets = None
    if datasets is not None and isinstance(data, datasets.Dataset):
        table = data.with_format("arrow")[:]  # applies a select()'s indices
        table = table.combine_chunks().replace_schema_metadata(None)
        with pa.ipc.new_stream(pa.PythonFile(_Sink(h), mode="w"), table.schema) as writer:
            writer.write_table(table)
        return h.hexdigest()
    for i in range(len(data)):
        h.update(json.dumps(data[i], sort_keys=True, default=str).encode())
        h.update(b"\n")
    return h.hexdigest()


def data_record(train: Any, eval_splits: dict[str, Any]) -> dict[str, Any]:
    """``{"sizes": {split: n}, "sha256": {split: hex}}`` of the training and eval splits."""
    splits = {"train": train, **eval_splits}
    return {"sizes": {k: len(v) for k, v in splits.items()},
            "sha256": {k: digest(v) for k, v in splits.items()}}


def check_data(path: Any, saved: dict[str, Any] | None, now: dict[str, Any]) -> None:
    """Refuse to resume checkpoint ``path`` on data other than it was trained on. A
    checkpoint written before this record existed (``saved`` None) cannot be checked."""
    if not saved or saved == now:
        return
    changed = []
    for split in sorted(set(saved["sizes"]) | set(now["sizes"])):
        before, after = saved["sizes"].get(split), now["sizes"].get(split)
        if before != after:
            changed.append(f"{split}: {_count(before)} -> {_count(after)}")
        elif saved["sha256"].get(split) != now["sha256"].get(split):
            changed.append(f"{split}: {before} examples as before, but their content "
                           "differs")
    raise ConfigError(
        f"the data of {path.parent.parent} changed since {path.name} was saved "
        f"({'; '.join(changed)}); a resumed run must train on the same data: put the "
        "data back as it was, or start a new run")


def _count(n: int | None) -> str:
    return "absent" if n is None else f"{n} examples"
