"""Raw split loading: every local format, folder discovery, the hub path, and the errors."""

import json

import datasets
import pandas as pd
import pytest

from adalora_cli.config import ConfigError, TaskConfig
from adalora_cli.tasks import data

ROWS = [{"text": 'he said "hi', "label": 1}, {"text": "null", "label": 0},
        {"text": "NA, really", "label": 1}]


def write(path, rows=ROWS):
    ext = path.suffix[1:]
    if ext == "tsv":
        path.write_text("text\tlabel\n" + "".join(f"{r['text']}\t{r['label']}\n" for r in rows))
    elif ext == "csv":
        pd.DataFrame(rows).to_csv(path, index=False)
    elif ext == "jsonl":
        path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    elif ext == "json":
        path.write_text(json.dumps(rows))
    elif ext == "parquet":
        pd.DataFrame(rows).to_parquet(path)
    return path


@pytest.mark.parametrize("ext", data.EXTENSIONS)
def test_every_format_reads_text_verbatim(tmp_path, ext):
    ds = data.read_table(write(tmp_path / f"train.{ext}"))
    # The stray quote must not swallow later rows, and "null"/"NA" are text, not missing.
    assert ds["text"] == [r["text"] for r in ROWS]
    assert ds["label"] == [1, 0, 1]


def test_json_lines_with_json_extension(tmp_path):
    path = tmp_path / "train.json"
    path.write_text("".join(json.dumps(r) + "\n" for r in ROWS))
    assert len(data.read_table(path)) == 3


def test_data_dir_discovers_split_files(tmp_path):
    write(tmp_path / "train.tsv")
    write(tmp_path / "validation.parquet")
    task = TaskConfig(name="sst2", data_dir=str(tmp_path))
    splits = data.load_splits(task, ["train", "validation"], dataset="nyu-mll/glue")
    assert {k: len(v) for k, v in splits.items()} == {"train": 3, "validation": 3}
    where = data.describe_source(task, "validation", dataset="nyu-mll/glue")
    assert where == str(tmp_path / "validation.parquet")


def test_data_files_override_data_dir(tmp_path):
    write(tmp_path / "mine.csv", ROWS[:2])
    task = TaskConfig(data_dir="/nonexistent", data_files={"train": str(tmp_path / "mine.csv")})
    assert len(data.load_splits(task, ["train"], dataset=None)["train"]) == 2


def test_missing_split_file_names_folder_and_fix(tmp_path):
    write(tmp_path / "train.csv")
    task = TaskConfig(data_dir=str(tmp_path))
    with pytest.raises(ConfigError, match=f"no validation.* in {tmp_path}.*data_files"):
        data.load_splits(task, ["train", "validation"], dataset=None)


def test_missing_data_dir(tmp_path):
    task = TaskConfig(data_dir=str(tmp_path / "nope"))
    with pytest.raises(ConfigError, match=f"{tmp_path / 'nope'} is not a folder"):
        data.load_splits(task, ["train"], dataset=None)


def test_missing_data_file_names_path(tmp_path):
    task = TaskConfig(data_files={"train": str(tmp_path / "gone.jsonl")})
    with pytest.raises(ConfigError, match=f"{tmp_path / 'gone.jsonl'} does not exist"):
        data.load_splits(task, ["train"], dataset=None)


def test_data_files_missing_split_entry(tmp_path):
    task = TaskConfig(data_files={"train": str(write(tmp_path / "t.csv"))})
    with pytest.raises(ConfigError, match="task.data_files.validation=PATH"):
        data.load_splits(task, ["train", "validation"], dataset=None)


def test_ambiguous_and_unsupported_files(tmp_path):
    write(tmp_path / "train.csv")
    write(tmp_path / "train.jsonl")
    with pytest.raises(ConfigError, match="several files for split train"):
        data.find_split_files(tmp_path, ["train"])
    (tmp_path / "x.xlsx").write_text("")
    with pytest.raises(ConfigError, match="unsupported file type .xlsx"):
        data.read_table(tmp_path / "x.xlsx")


def test_mixed_value_types_are_a_config_error(tmp_path):
    path = write(tmp_path / "train.jsonl", [{"text": "a", "label": "positive"},
                                            {"text": "b", "label": 0}])
    with pytest.raises(ConfigError, match="train.jsonl: a column mixes value types"):
        data.read_table(path)


def test_no_local_data_and_no_hub_source():
    with pytest.raises(ConfigError, match="needs local data"):
        data.load_splits(TaskConfig(name="rotten_tomatoes"), ["train"], dataset=None)


def test_hub_path_calls_load_dataset(monkeypatch):
    calls = []
    fake = datasets.DatasetDict({"train": datasets.Dataset.from_dict({"x": [1]}),
                                 "validation": datasets.Dataset.from_dict({"x": [2]})})

    def load_dataset(*args):
        calls.append(args)
        return fake

    monkeypatch.setattr(datasets, "load_dataset", load_dataset)
    out = data.load_splits(TaskConfig(name="rte"), ["train", "validation"],
                           dataset="nyu-mll/glue", config_name="rte")
    assert calls == [("nyu-mll/glue", "rte")]
    assert out["validation"]["x"] == [2]
    with pytest.raises(ConfigError, match="has no split test"):
        data.load_splits(TaskConfig(), ["test"], dataset="nyu-mll/glue", config_name="rte")


def test_unreachable_hub_is_one_line_config_error(monkeypatch):
    def offline(*args):
        raise ConnectionError("Couldn't reach 'nyu-mll/glue' on the Hub (LocalEntryNotFound)\n"
                              "more detail")

    monkeypatch.setattr(datasets, "load_dataset", offline)
    with pytest.raises(ConfigError) as err:
        data.load_splits(TaskConfig(name="rte"), ["train"], dataset="nyu-mll/glue",
                         config_name="rte")
    assert "\n" not in str(err.value)
    assert "nyu-mll/glue (rte)" in str(err.value) and "task.data_dir" in str(err.value)


def test_take_and_require_columns():
    ds = datasets.Dataset.from_dict({"a": list(range(5))})
    assert data.take(ds, 2)["a"] == [0, 1]
    assert len(data.take(ds, None)) == len(data.take(ds, 50)) == 5
    with pytest.raises(ConfigError, match="f.csv lacks column 'b'"):
        data.require_columns(ds, ["a", "b"], "f.csv")


# --------------------------------------------------------------------------- hub revisions
# The real hub paths (XSum's script on main, the conversion branch, a cached second run)
# run against the local hub in tests/mirror/test_hub_data.py; these pin the decisions.

SCRIPT_REFUSAL = RuntimeError("Dataset scripts are no longer supported, but found xsum.py")


def fake_hub(monkeypatch, answers, script_on_hub=False):
    """``datasets.load_dataset`` answering from ``answers`` keyed by revision (an
    exception is raised); the calls it got, as (args, kwargs)."""
    calls = []

    def load_dataset(*args, **kwargs):
        calls.append((args, kwargs))
        answer = answers[kwargs.get("revision")]
        if isinstance(answer, Exception):
            raise answer
        return answer

    import huggingface_hub
    monkeypatch.setattr(datasets, "load_dataset", load_dataset)
    monkeypatch.setattr(huggingface_hub, "file_exists", lambda *a, **k: script_on_hub)
    monkeypatch.setattr(data, "_READ_FROM", {})
    return calls


def splits(n_train=2):
    return datasets.DatasetDict({"train": datasets.Dataset.from_dict({"x": list(range(n_train))}),
                                 "validation": datasets.Dataset.from_dict({"x": [9]})})


def test_refused_script_names_the_script_only_for_a_refusal():
    assert data.refused_script(SCRIPT_REFUSAL) == "xsum.py"
    assert data.refused_script(ValueError("... pass trust_remote_code=True ...")) is not None
    assert data.refused_script(RuntimeError("disk full")) is None
    assert data.refused_script(ValueError("Couldn't find cache for EdinburghNLP/xsum")) is None


def test_script_on_main_reads_the_conversion_with_one_note(monkeypatch, capsys):
    calls = fake_hub(monkeypatch, {None: SCRIPT_REFUSAL, data.CONVERSION: splits(3)})
    task = TaskConfig(name="xsum")
    out = data.load_splits(task, ["train", "validation"], dataset="EdinburghNLP/xsum")
    assert len(out["train"]) == 3
    assert calls == [(("EdinburghNLP/xsum", None), {}),
                     (("EdinburghNLP/xsum",), {"data_dir": "default",
                                               "revision": data.CONVERSION})]
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 1 and err[0].startswith("note: EdinburghNLP/xsum keeps a loading "
                                               "script (xsum.py) on its main branch")
    assert data.describe_source(task, "train", dataset="EdinburghNLP/xsum") == (
        "hub EdinburghNLP/xsum@refs/convert/parquet split train")


def test_a_config_is_the_conversion_folder_of_that_name(monkeypatch):
    calls = fake_hub(monkeypatch, {None: SCRIPT_REFUSAL, data.CONVERSION: splits()})
    data.load_splits(TaskConfig(name="cnn_dailymail"), ["train"],
                     dataset="abisee/cnn_dailymail", config_name="3.0.0")
    assert calls[1] == (("abisee/cnn_dailymail",), {"data_dir": "3.0.0",
                                                    "revision": data.CONVERSION})


def test_a_cached_run_falls_back_when_the_hub_shows_the_script(monkeypatch, capsys):
    # once the conversion is cached, datasets answers main's script with a cache lookup
    cached = ValueError("Couldn't find cache for EdinburghNLP/xsum for config 'default'")
    fake_hub(monkeypatch, {None: cached, data.CONVERSION: splits()}, script_on_hub=True)
    data.load_splits(TaskConfig(name="xsum"), ["train"], dataset="EdinburghNLP/xsum")
    assert "reading the hub's parquet conversion" in capsys.readouterr().err
    fake_hub(monkeypatch, {None: cached, data.CONVERSION: splits()}, script_on_hub=False)
    with pytest.raises(ConfigError, match="could not load EdinburghNLP/xsum from the hub "
                                          r"\(ValueError: Couldn't find cache"):
        data.load_splits(TaskConfig(name="xsum"), ["train"], dataset="EdinburghNLP/xsum")


def test_neither_main_nor_the_conversion_names_both_and_data_files(monkeypatch):
    fake_hub(monkeypatch, {None: SCRIPT_REFUSAL,
                           data.CONVERSION: FileNotFoundError("no refs/convert/parquet")})
    with pytest.raises(ConfigError) as err:
        data.load_splits(TaskConfig(name="xsum"), ["train", "validation"],
                         dataset="EdinburghNLP/xsum")
    text = str(err.value)
    assert "\n" not in text
    assert "keeps a loading script (xsum.py) on its main branch" in text
    assert "its parquet conversion (refs/convert/parquet) did not load either" in text
    assert "task.data_files.train=PATH task.data_files.validation=PATH" in text


def test_revision_is_pinned_without_any_fallback(monkeypatch, capsys):
    calls = fake_hub(monkeypatch, {"abc123": splits(4)})
    task = TaskConfig(name="rte", revision="abc123")
    out = data.load_splits(task, ["train"], dataset="nyu-mll/glue", config_name="rte")
    assert len(out["train"]) == 4
    assert calls == [(("nyu-mll/glue", "rte"), {"revision": "abc123"})]
    assert data.describe_source(task, "train", dataset="nyu-mll/glue", config_name="rte") == (
        "hub nyu-mll/glue/rte@abc123 split train")
    fake_hub(monkeypatch, {"old": SCRIPT_REFUSAL, data.CONVERSION: splits()})
    with pytest.raises(ConfigError, match=r"at revision old holds a loading script \(xsum.py\)"
                                          r".*task.revision=refs/convert/parquet"):
        data.load_splits(TaskConfig(name="xsum", revision="old"), ["train"],
                         dataset="EdinburghNLP/xsum")
    assert capsys.readouterr().err == ""  # a pinned revision is never swapped for another


def test_a_pinned_script_is_refused_before_datasets_can_answer_from_its_cache(monkeypatch):
    # datasets meeting a script falls back to any cached copy of the dataset, which would
    # be another revision's rows: the hub is asked about the script first
    calls = fake_hub(monkeypatch, {"old": splits()}, script_on_hub=True)
    with pytest.raises(ConfigError, match=r"at revision old holds a loading script \(xsum.py\)"):
        data.load_splits(TaskConfig(name="xsum", revision="old"), ["train"],
                         dataset="EdinburghNLP/xsum")
    assert calls == []


@pytest.mark.parametrize("ext", ["jsonl", "json"])
def test_a_bad_json_line_is_located_by_its_line_number(tmp_path, ext):
    """pandas says "position 1138"; the user needs the line to open the file at."""
    rows = [json.dumps({"sentence": f"row {i}", "label": i % 2}) for i in range(30)]
    broken = list(rows)
    broken[16] = '{"sentence": "broken row, "label": 1}'  # a quote lost: line 17
    path = tmp_path / f"train.{ext}"
    path.write_text("\n".join(broken) + "\n")
    with pytest.raises(ConfigError) as err:
        data.read_table(path)
    assert str(err.value) == (f"{path} line 17 is not valid JSON (Expecting ',' delimiter at "
                              "column 28); fix that line (each line holds one JSON object)")
    listed = list(rows)
    listed.insert(20, "")  # blank lines are skipped but still counted
    listed[25] = '["row 24", 0]'
    path.write_text("\n".join(listed) + "\n")
    with pytest.raises(ConfigError) as err:
        data.read_table(path)
    assert str(err.value) == (f"{path} line 26 holds a JSON list, not an object; each line "
                              'must be one {"column": value, ...} row')
