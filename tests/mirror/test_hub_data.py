"""Datasets as the hub publishes them, through the local hub: XSum's loading script on
main (read from the parquet conversion, with one note), ``task.revision`` pinning a
revision, the one-line errors when neither works, and a gated model without a token."""

from __future__ import annotations

import json
import textwrap

import datasets
import pytest

from .conftest import read_jsonl

pytestmark = pytest.mark.mirror

CONVERSION = "refs/convert/parquet"
SHORT = ["train.max_steps=3", "train.warmup_steps=1", "adalora.t_init=1", "adalora.delta_t=1",
         "adalora.t_final=1", "train.eval_every=3", "train.batch_size=4", "task.max_length=64"]
STEPS = [*SHORT, "task.max_train_samples=8", "task.max_eval_samples=8"]
MAIN_ROWS = {"train": 48, "validation": 24}
FIRST_ROWS = {"train": 40, "validation": 20}
"""nyu-mll/glue's rte split sizes on main and at its first parquet commit, an older commit
with other rows (tests/fixtures/hub/dataset_repos.py): what a pinned revision must read."""


def first_parquet_commit(local_hub) -> str:
    """The id of nyu-mll/glue's "Convert dataset to Parquet", older than main's head."""
    reader = local_hub.server.hub.repos[("dataset", "nyu-mll/glue")].reader
    history = reader.commits(local_hub.commit("dataset", "nyu-mll/glue", "main"))
    return next(c["id"] for c in history if c["title"] == "Convert dataset to Parquet")


def load_splits(local_hub, home, **task) -> tuple[dict, str]:
    """``data.load_splits`` for the task in a fresh process: ({rows, source} or {error},
    its stderr). A ConfigError comes back as its message."""
    name, dataset, config = task.pop("name"), task.pop("dataset"), task.pop("config", None)
    code = textwrap.dedent(f"""
        import json
        from adalora_cli.config import ConfigError, TaskConfig
        from adalora_cli.tasks import data
        task = TaskConfig(name={name!r}, **{task!r})
        try:
            out = data.load_splits(task, ["train", "validation"], dataset={dataset!r},
                                   config_name={config!r})
        except ConfigError as err:
            print(json.dumps({{"error": str(err)}}))
        else:
            print(json.dumps({{"rows": {{k: len(v) for k, v in out.items()}},
                              "source": data.describe_source(task, "train",
                                  dataset={dataset!r}, config_name={config!r})}}))
    """)
    done = local_hub.python(code, home=home)
    assert done.returncode == 0, done.stderr[-2000:]
    return json.loads(done.stdout.strip().splitlines()[-1]), done.stderr


def notes(stderr: str) -> list[str]:
    return [line for line in stderr.splitlines() if line.startswith("note:")]


def test_xsum_is_read_from_the_conversion_with_one_note_every_time(local_hub, tmp_path):
    conversion = local_hub.commit("dataset", "EdinburghNLP/xsum", CONVERSION)
    # twice in one HF_HOME: once the conversion is cached, datasets answers main's script
    # with a failed cache lookup instead of naming it, and the fallback must still happen
    for _ in range(2):
        out, stderr = load_splits(local_hub, tmp_path, name="xsum",
                                     dataset="EdinburghNLP/xsum")
        assert out["rows"] == {"train": 48, "validation": 24}
        assert out["source"] == f"hub EdinburghNLP/xsum@{CONVERSION} split train"
        assert notes(stderr) == [
            "note: EdinburghNLP/xsum keeps a loading script (xsum.py) on its main branch, "
            f"which datasets {datasets.__version__} no longer runs; reading the hub's "
            f"parquet conversion ({CONVERSION}) instead"]
    assert local_hub.requested(f"/datasets/EdinburghNLP/xsum/resolve/{conversion}/"
                               "default/train/0000.parquet")


def test_revision_pins_a_commit_and_the_conversion(local_hub, tmp_path):
    first = first_parquet_commit(local_hub)
    assert first != local_hub.commit("dataset", "nyu-mll/glue", "main")
    for revision, path, rows in ((first, "rte/train-00000-of-00001.parquet", FIRST_ROWS),
                                 (CONVERSION, "rte/train/0000.parquet", MAIN_ROWS)):
        out, stderr = load_splits(local_hub, tmp_path, name="rte", dataset="nyu-mll/glue",
                                     config="rte", revision=revision)
        assert out["rows"] == rows  # main's are MAIN_ROWS: the pinned commit was read
        assert out["source"] == f"hub nyu-mll/glue/rte@{revision} split train"
        assert not notes(stderr)
        sha = local_hub.commit("dataset", "nyu-mll/glue", revision)
        assert local_hub.requested(f"/datasets/nyu-mll/glue/resolve/{sha}/{path}")


def test_revision_through_the_cli_is_recorded_in_the_run(local_hub, tmp_path):
    first = first_parquet_commit(local_hub)
    run = tmp_path / "run"
    # every row (no max_*_samples): the run's split sizes say which commit it trained on
    done = local_hub.run("train", "configs/glue/rte.yaml", f"task.revision={first}", *SHORT,
                         "--run-dir", str(run), "--quiet")
    assert done.returncode == 0, done.stderr[-2000:]
    data = json.loads((run / "summary.json").read_text())["data"]
    assert (data["train_examples"], data["validation_examples"]) == (
        FIRST_ROWS["train"], FIRST_ROWS["validation"])
    assert data["validation_source"] == f"hub nyu-mll/glue/rte@{first} split validation"
    assert [r for r in read_jsonl(run / "metrics.jsonl") if r.get("split") == "validation"]


def test_a_pinned_revision_holding_a_script_is_a_one_line_error(local_hub, tmp_path):
    old = local_hub.server.hub.repos[("dataset", "nyu-mll/glue")].reader.commits(
        local_hub.commit("dataset", "nyu-mll/glue", "main"))[-1]["id"]  # "Upload glue.py"
    # main's rte already cached: datasets, meeting the old script, would answer from it
    out, _ = load_splits(local_hub, tmp_path, name="rte", dataset="nyu-mll/glue", config="rte")
    assert out["rows"] == MAIN_ROWS
    run = tmp_path / "run"
    done = local_hub.run("train", "configs/glue/rte.yaml", f"task.revision={old}", *STEPS,
                         "--run-dir", str(run), "--quiet", home=tmp_path)
    assert done.returncode == 2
    error = done.stderr.strip().splitlines()
    assert len(error) == 1 and error[0].startswith("error: "), done.stderr
    assert f"nyu-mll/glue (rte) at revision {old} holds a loading script (glue.py)" in error[0]
    assert f"task.revision={CONVERSION}" in error[0]
    assert "task.data_files.train=PATH task.data_files.validation=PATH" in error[0]
    assert not (run / "summary.json").exists()


def test_a_script_without_a_conversion_names_both_and_the_files_way(local_hub, tmp_path):
    out, stderr = load_splits(local_hub, tmp_path, name="xsum",
                                 dataset="adalora-tests/script-only")
    error = out["error"]
    assert "\n" not in error
    assert error.startswith("could not load adalora-tests/script-only: adalora-tests/"
                            "script-only keeps a loading script (script-only.py) on its main "
                            "branch")
    assert f"its parquet conversion ({CONVERSION}) did not load either" in error
    assert "task.data_files.train=PATH task.data_files.validation=PATH" in error
    assert len(notes(stderr)) == 1  # it said what it was trying before it failed


@pytest.mark.parametrize("token", [None, "hf_someoneWithoutAccess"], ids=["no-token", "no-access"])
def test_a_gated_model_says_to_accept_the_licence_and_log_in(local_hub, tmp_path, token):
    # a fresh cache: once downloaded with access, huggingface_hub serves the cached files
    # to later runs on that machine, token or not
    done = local_hub.run("train", "configs/causal_lm/llama.yaml",
                         "task.data_dir=tests/fixtures/causal_lm/qa", "--dry-run", token=token,
                         home=tmp_path)
    assert done.returncode == 2
    error = done.stderr.strip().splitlines()
    assert len(error) == 1, done.stderr
    assert "'meta-llama/Llama-3.2-1B': it is a gated repo" in error[0]
    assert "https://huggingface.co/meta-llama/Llama-3.2-1B" in error[0]
    assert "hf auth login" in error[0] and "HF_TOKEN" in error[0]


def test_a_gated_model_loads_with_a_token_that_has_access(local_hub, access_token):
    done = local_hub.run("train", "configs/causal_lm/llama.yaml",
                         "task.data_dir=tests/fixtures/causal_lm/qa", "--dry-run",
                         token=access_token)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "matrices: 112" in done.stdout
