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
