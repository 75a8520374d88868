"""Raw splits for any task: explicit local files, a local folder, or the hub.

Every task family (GLUE, SQuAD, summarization) starts from the same question: which table
holds each split? The answer comes from ``task.data_files`` (``{split: path}``), else from
``task.data_dir`` (one ``<split>.<ext>`` file per split), else from the hub via
``datasets.load_dataset(dataset_id, config_name)`` at ``task.revision`` (main when unset).
A hub repo whose main branch still holds a loading script (``EdinburghNLP/xsum``), which
``datasets`` 4+ refuses to run, is read from the hub's parquet conversion
(``refs/convert/parquet``) instead, with a one-line note. Local tables are read with pandas and
handed on as in-memory :class:`datasets.Dataset` objects, so the rest of a task never cares
where rows came from. Anything the user can fix (a missing file, folder, split or column,
an unreachable hub) is raised as a one-line :class:`ConfigError` naming the path and the fix.
"""

from __future__ import annotations

import csv
import hashlib
import json
import os
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import datasets
import pandas as pd
import pyarrow as pa

from ..config import ConfigError, TaskConfig
from ..errors import first_line, writing

EXTENSIONS = ("tsv", "csv", "json", "jsonl", "parquet")
"""File types a local split may have, in the order ``data_dir`` looks for them."""


def read_table(path: str | Path) -> datasets.Dataset:
    """One local file as an in-memory Dataset; the type comes from the file extension."""
    path = Path(path)
    ext = path.suffix.lower().lstrip(".")
    if ext not in EXTENSIONS:
        raise ConfigError(f"{path}: unsupported file type .{ext}; use one of "
                          f"{', '.join('.' + e for e in EXTENSIONS)}")
    if not path.is_file():
        raise ConfigError(f"data file {path} does not exist; fix the path in task.data_files "
                          "or task.data_dir")
    try:
        frame = _read_frame(path, ext)
    except (ValueError, OSError, pd.errors.ParserError) as err:
        where = bad_json_line(path) if ext in ("jsonl", "json") else None
        if where is not None:  # pandas says "position 1138": the line is what can be fixed
            raise ConfigError(where) from None
        first = first_line(err)
        raise ConfigError(f"could not read {path} as .{ext}: {first}") from None
    try:
        return datasets.Dataset.from_pandas(frame, preserve_index=False)
    except (pa.ArrowInvalid, pa.ArrowTypeError) as err:  # e.g. a column of ints and names
        first = first_line(err)[:200]
        raise ConfigError(f"{path}: a column mixes value types ({first}); write each "
                          "column with one type") from None


def _read_frame(path: Path, ext: str) -> pd.DataFrame:
    # na_filter=False: words like "null", "NA" or "nan" are real text in GLUE, not missing.
    if ext == "tsv":
        # GLUE text contains unbalanced quote characters; with CSV quoting on, one stray
        # quote silently merges the following rows into a single field.
        return pd.read_csv(path, sep="\t", quoting=csv.QUOTE_NONE, na_filter=False)
    if ext == "csv":
        return pd.read_csv(path, na_filter=False)
    if ext == "parquet":
        return pd.read_parquet(path)
    if ext == "jsonl":
        return pd.read_json(path, lines=True, dtype=False)
    # .json holds either an array of records or (as `Dataset.to_json` writes) JSON lines.
    with path.open(encoding="utf-8") as handle:
        head = handle.read(1024).lstrip()
    if head.startswith("["):
        return pd.DataFrame.from_records(json.loads(path.read_text(encoding="utf-8")))
    return pd.read_json(path, lines=True, dtype=False)


def bad_json_line(path: Path) -> str | None:
    """For a JSON-lines file, the first line that is not one JSON object, said as ``path
    line N: what is wrong; the fix`` (None when every line is, or the file is a JSON
    array, which has no rows per line)."""
    with path.open(encoding="utf-8", errors="replace") as handle:
        for number, line in enumerate(handle, 1):
            text = line.strip()
            if not text:
                continue
            if number == 1 and text.startswith("["):
                return None  # a JSON array: pandas' own words are all there is
            try:
                row = json.loads(text)
            except ValueError as err:
                why = getattr(err, "msg", None) or first_line(err)
                column = getattr(err, "colno", None)
                at = f" at column {column}" if column else ""
                return (f"{path} line {number} is not valid JSON ({why}{at}); fix that line "
                        "(each line holds one JSON object)")
            if not isinstance(row, dict):
                return (f"{path} line {number} holds a JSON {type(row).__name__}, not an "
                        'object; each line must be one {"column": value, ...} row')
    return None


def find_split_files(data_dir: str | Path, splits: Sequence[str]) -> dict[str, Path]:
    """``{split: <data_dir>/<split>.<ext>}`` for every requested split."""
    folder = Path(data_dir)
    if not folder.is_dir():
        raise ConfigError(f"task.data_dir {folder} is not a folder; point it at a folder "
                          f"holding {splits[0]}.tsv/.csv/.json/.jsonl/.parquet files")
    found: dict[str, Path] = {}
    for split in splits:
        matches = [folder / f"{split}.{ext}" for ext in EXTENSIONS
                   if (folder / f"{split}.{ext}").is_file()]
        if not matches:
            raise ConfigError(f"no {split}.{{{','.join(EXTENSIONS)}}} in {folder}; add that "
                              f"file or map the split with task.data_files.{split}=PATH")
        if len(matches) > 1:
            names = ", ".join(m.name for m in matches)
            raise ConfigError(f"{folder} has several files for split {split} ({names}); "
                              "keep one")
        found[split] = matches[0]
    return found


def load_splits(task: TaskConfig, splits: Sequence[str], *, dataset: str | None,
                config_name: str | None = None) -> dict[str, datasets.Dataset]:
    """The raw ``splits`` of a task, from local files if configured, else the hub.

    ``dataset``/``config_name`` name the hub source (``task.dataset`` should already have
    been applied by the caller); ``dataset=None`` means the task has no hub source, so
    local files are required.
    """
    if task.data_files:
        missing = [s for s in splits if s not in task.data_files]
        if missing:
            have = ", ".join(sorted(task.data_files)) or "nothing"
            raise ConfigError(f"task.data_files has no entry for split {missing[0]} (it maps "
                              f"{have}); add task.data_files.{missing[0]}=PATH")
        return {s: read_table(task.data_files[s]) for s in splits}
    if task.data_dir:
        return {s: read_table(p) for s, p in find_split_files(task.data_dir, splits).items()}
    if dataset is None:
        raise ConfigError(f"task {task.name} needs local data: set task.data_dir or "
                          "task.data_files")
    return _load_hub(task, dataset, config_name, splits)


CONVERSION = "refs/convert/parquet"
"""The hub's parquet conversion of a dataset repo: one ``<config>/<split>/NNNN.parquet``
tree per config, kept on this ref beside ``main`` (see docs/reproducing.md)."""

_READ_FROM: dict[str, str] = {}
"""Hub datasets this process read from the conversion because main held a script."""


def refused_script(err: BaseException) -> str | None:
    """The loading script named by ``datasets``' refusal to run one, else None.

    datasets 4+ raises ``RuntimeError("Dataset scripts are no longer supported, but found
    xsum.py")``; datasets 3 asks for ``trust_remote_code=True`` instead."""
    text = str(err)
    if isinstance(err, RuntimeError) and "scripts are no longer supported" in text:
        return text.rsplit(" ", 1)[-1].strip() or "a loading script"
    if isinstance(err, ValueError) and "trust_remote_code" in text:
        return "a loading script"
    return None


def _script_in(dataset: str, revision: str | None = None) -> str | None:
    """``<name>.py`` when the repo holds that loading script at ``revision`` (main when
    None), else None.

    Asked only after a load failed for another reason: once this dataset has anything in
    the local cache, ``datasets`` answers a script with a cache lookup that fails
    ("Couldn't find cache for ...") instead of naming the script."""
    from huggingface_hub import file_exists

    script = dataset.rsplit("/", 1)[-1] + ".py"
    try:
        found = file_exists(dataset, script, repo_type="dataset", revision=revision)
    except Exception:  # noqa: BLE001 - offline or unreachable: the load's own error stands
        return None
    return script if found else None


def _hub_call(dataset: str, config_name: str | None, revision: str | None) -> Any:
    if revision is None:
        return datasets.load_dataset(dataset, config_name)
    if revision.startswith("refs/convert/"):
        # The conversion keeps each config in a folder of that name ("default" for a repo
        # without named configs) and no README to declare them: read the folder.
        return datasets.load_dataset(dataset, data_dir=config_name or "default",
                                     revision=revision)
    return datasets.load_dataset(dataset, config_name, revision=revision)


def _load_hub(task: TaskConfig, dataset: str, config_name: str | None,
              splits: Sequence[str]) -> dict[str, datasets.Dataset]:
    source = f"{dataset} ({config_name})" if config_name else dataset
    files_fix = (f"task.data_files.{splits[0]}=PATH"
                 + "".join(f" task.data_files.{s}=PATH" for s in splits[1:]))
    if task.revision:
        loaded = _load_pinned(dataset, config_name, task.revision, source, files_fix)
    else:
        try:
            loaded = _hub_call(dataset, config_name, None)
        except Exception as err:  # noqa: BLE001 - offline, missing repo, auth: all user-fixable
            script = refused_script(err) or _script_in(dataset)
            if script is None:
                raise ConfigError(
                    f"could not load {source} from the hub ({type(err).__name__}: "
                    f"{first_line(err)[:200]}); without internet set task.data_dir to a "
                    f"folder with {'/'.join(splits)} files") from None
            loaded = _load_conversion(dataset, config_name, script, source, files_fix)
    missing = [s for s in splits if s not in loaded]
    if missing:
        raise ConfigError(f"{source} has no split {missing[0]} (it has "
                          f"{', '.join(loaded)}); use local files for it via task.data_files")
    return {s: loaded[s] for s in splits}


def _load_conversion(dataset: str, config_name: str | None, script: str, source: str,
                     files_fix: str) -> Any:
    """Main holds a loading script this ``datasets`` will not run: read the conversion."""
    refusal = (f"{dataset} keeps a loading script ({script}) on its main branch, which "
               f"datasets {datasets.__version__} no longer runs")
    if os.environ.get("RANK", "0") == "0":  # once under torchrun, not once per rank
        print(f"note: {refusal}; reading the hub's parquet conversion ({CONVERSION}) "
              "instead", file=sys.stderr, flush=True)
    try:
        loaded = _hub_call(dataset, config_name, CONVERSION)
    except Exception as err:  # noqa: BLE001 - no conversion branch, or not this config
        raise ConfigError(
            f"could not load {source}: {refusal}, and its parquet conversion ({CONVERSION}) "
            f"did not load either ({type(err).__name__}: {first_line(err)[:160]}); download "
            f"the splits and set {files_fix}, or pin a revision that holds data files with "
            "task.revision=REV") from None
    _READ_FROM[dataset] = CONVERSION
    return loaded


def _load_pinned(dataset: str, config_name: str | None, revision: str, source: str,
                 files_fix: str) -> Any:
    """``task.revision``: exactly that revision, no fallback (the user chose it).

    A script at that revision is looked for first: when ``datasets`` meets one, it falls
    back to whatever it cached of the dataset, and would quietly hand over another
    revision's rows."""
    script = _script_in(dataset, revision)
    try:
        if script is None:
            return _hub_call(dataset, config_name, revision)
    except Exception as err:  # noqa: BLE001 - unknown revision, script, offline: user-fixable
        script = refused_script(err)
        if script is None:
            raise ConfigError(
                f"could not load {source} at revision {revision} from the hub "
                f"({type(err).__name__}: {first_line(err)[:200]}); task.revision takes a "
                f"branch, tag, commit id or {CONVERSION}, or set {files_fix}") from None
    raise ConfigError(
        f"{source} at revision {revision} holds a loading script ({script}), which "
        f"datasets {datasets.__version__} no longer runs; set task.revision={CONVERSION} "
        f"(the hub's parquet conversion), or download the splits and set {files_fix}")


def describe_source(task: TaskConfig, split: str, *, dataset: str | None,
                    config_name: str | None = None) -> str:
    """Where ``split`` comes from, for messages and the run summary."""
    if task.data_files and split in task.data_files:
        return str(task.data_files[split])
    if task.data_dir:
        try:
            return str(find_split_files(task.data_dir, [split])[split])
        except ConfigError:
            return f"{task.data_dir}/{split}.*"
    name = f"{dataset}/{config_name}" if config_name else str(dataset)
    revision = task.revision or _READ_FROM.get(str(dataset))
    return f"hub {name}{'@' + revision if revision else ''} split {split}"


def require_columns(ds: datasets.Dataset, columns: Sequence[str], where: str) -> None:
    """Fail early, naming the file or split, when a table lacks a column the task reads."""
    missing = [c for c in columns if c not in ds.column_names]
    if missing:
        raise ConfigError(f"{where} lacks column {missing[0]!r} (it has "
                          f"{', '.join(ds.column_names)}); the task needs "
                          f"{', '.join(columns)}")


HELDOUT = "heldout"
"""The evaluation split ``task.holdout`` carves out of the training split."""


def row_key(row: dict[str, Any]) -> str:
    """sha256 of a row's cells (as sorted JSON): where the row falls, whatever its place."""
    text = json.dumps(row, sort_keys=True, ensure_ascii=False, default=str)
    return hashlib.sha256(text.encode()).hexdigest()


def carve_holdout(raw: dict[str, datasets.Dataset], rows: int | None,
                  where: str) -> dict[str, datasets.Dataset]:
    """``task.holdout``: the ``rows`` training rows of lowest :func:`row_key` become the
    split ``heldout`` (after the evaluation splits) and leave ``train``; both keep the
    file's order. The same rows are held out however the file is ordered, and a row's fate
    does not depend on the others beyond their keys. ``raw`` unchanged when ``rows`` is
    None or the carve was made already."""
    if not rows or HELDOUT in raw:
        return raw
    train = raw["train"]
    if rows >= len(train):
        raise ConfigError(f"task.holdout={rows} holds out at least the whole training split "
                          f"({len(train)} rows in {where}); hold out fewer rows, e.g. "
                          f"task.holdout={max(1, len(train) // 10)}")
    held = lowest_keys(train, rows)
    chosen = set(held)
    kept = [i for i in range(len(train)) if i not in chosen]
    out = {name: (train.select(kept) if name == "train" else ds) for name, ds in raw.items()}
    out[HELDOUT] = train.select(held)
    return out


def lowest_keys(ds: datasets.Dataset, rows: int) -> list[int]:
    """The indices of the ``rows`` rows of ``ds`` with the lowest :func:`row_key` (ties,
    identical rows, by place), in the file's order: the rule every held-out slice follows."""
    keys = [row_key(row) for row in ds]
    return sorted(sorted(range(len(ds)), key=lambda i: (keys[i], i))[:rows])


def take(ds: datasets.Dataset, n: int | None) -> datasets.Dataset:
    """The first ``n`` rows (all of them when ``n`` is None or larger than the split)."""
    return ds if n is None or n >= len(ds) else ds.select(range(n))


def write_jsonl(path: Path, splits: dict[str, list[dict[str, Any]]]) -> list[Path]:
    """Every split's prediction rows into one JSON-lines file (``predictions.jsonl``)."""
    with writing(path), path.open("w", encoding="utf-8") as handle:
        for rows in splits.values():
            for row in rows:
                handle.write(json.dumps(row, ensure_ascii=False) + "\n")
    return [path]
