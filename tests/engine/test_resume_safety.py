"""A resumed run is the same run, or it refuses: an edited config, a torn log and a damaged
checkpoint are each either handled exactly or refused in one line, never silently.

The smoke run killed after step 14 with ``save_every=3`` has checkpoints at 12 (and 9, 6
with ``keep_checkpoints=3``); resumed, it must end byte-identical to the uninterrupted run.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
import yaml
from typer.testing import CliRunner

from adalora_cli.cli import app
from adalora_cli.config import ConfigError, RunConfig, apply_overrides, from_dict, load_config
from adalora_cli.engine import checkpoint as ckpt
from adalora_cli.rundir.run import RunDir, read_metrics

from .conftest import ROOT, SMOKE, forked, same_outputs


def resume_args(out, *extra):
    return ["train", "--resume", str(out), *extra, "--quiet"]


def edit_config(out, **changes):
    """Edit the run's config.yaml as a user would: {"adalora.budget": 24}."""
    data = yaml.safe_load((out / "config.yaml").read_text())
    for key, value in changes.items():
        section, name = key.split(".")
        data[section][name] = value
    (out / "config.yaml").write_text(yaml.safe_dump(data, sort_keys=False))


@pytest.fixture()
def killed(smoke, tmp_path):
    """The smoke run SIGKILLed after step 14: checkpoints 6, 9 and 12 on disk."""
    out = tmp_path / "run"
    assert forked(smoke(out, "train.save_every=3", "train.keep_checkpoints=3"),
                  "kill@step=14") == -9
    assert [p.name for p in ckpt.checkpoints(out)] == [
        "step-0000006", "step-0000009", "step-0000012"]
    return out


# ------------------------------------------------------------------ 1. an edited config
def test_an_edited_config_is_refused_and_an_allowed_change_is_recorded(killed, baseline):
    out = killed
    before = (out / "status.json").read_text()
    for key, value in (("adalora.budget", 24), ("train.epochs", 8),
                       ("train.learning_rate", 0.05)):
        original = (out / "config.yaml").read_text()
        edit_config(out, **{key: value})
        assert forked(resume_args(out)) == 2, key  # refused, as a bad input
        assert (out / "status.json").read_text() == before  # nothing was claimed or written
        (out / "config.yaml").write_text(original)
    # a key that cannot change the maths: allowed, and the run directory says so
    edit_config(out, **{"train.save_every": 4})
    assert forked(resume_args(out, "train.keep_checkpoints=2")) == 0
    status = RunDir.read_status(out)
    assert status["status"] == "finished"
    assert status["resumes"] == [{"attempt": 2, "time": status["resumes"][0]["time"],
                                  "config_changes": {"train.keep_checkpoints": [3, 2],
                                                     "train.save_every": [3, 4]}}]
    assert same_outputs(out, baseline) == []


def _state(cfg: RunConfig) -> dict:
    return ckpt.config_record(cfg)


def test_check_config_names_every_changed_key(tmp_path, in_repo):
    cfg = load_config(SMOKE)
    path = tmp_path / "run" / "checkpoints" / "step-0000012"
    edited = load_config(SMOKE, ["adalora.budget=24", "train.epochs=8",
                                 "train.learning_rate=0.05"])
    with pytest.raises(ConfigError) as err:
        ckpt.check_config(path, _state(cfg), edited)
    message = str(err.value)
    assert "\n" not in message and "step-0000012" in message
    for text in ("adalora.budget 16 -> 24", "train.epochs 4.0 -> 8.0",
                 "train.learning_rate 0.005 -> 0.05"):
        assert text in message
    # allowed keys are returned for the record, not refused
    allowed = load_config(SMOKE, ["log.to=[tensorboard]", "train.eval_batch_size=7"])
    assert ckpt.check_config(path, _state(cfg), allowed) == {
        "log.to": [[], ["tensorboard"]], "train.eval_batch_size": [64, 7]}
    assert ckpt.check_config(path, _state(cfg), cfg) == {}


def test_the_digest_ignores_exactly_the_keys_that_may_change(in_repo):
    cfg = load_config(SMOKE)
    data = cfg.to_dict()
    same = from_dict(apply_overrides(data, ["train.save_every=5", "log.run_name=x",
                                            "train.device=cpu"]))
    assert ckpt.resume_digest(same) == ckpt.resume_digest(cfg)
    for change in ("train.seed=1", "lora.r=3", "task.max_length=16", "sweep.name=x"):
        other = from_dict(apply_overrides(cfg.to_dict(), [change]))
        assert ckpt.resume_digest(other) != ckpt.resume_digest(cfg), change


def test_a_key_added_since_the_checkpoint_unset_does_not_strand_it(in_repo, tmp_path):
    """A checkpoint written before a config key existed (here adalora.target_rank, added
    unset) resumes: the key is absent from its record and None now, which changes nothing.
    The same key set to a value is a change, and is refused by name."""
    cfg = load_config(SMOKE)
    old = {k: v for k, v in ckpt.flat_config(cfg).items() if k != "adalora.target_rank"}
    state = {"config": old, "config_digest": ckpt.resume_digest(old)}
    path = tmp_path / "checkpoints" / "step-0000012"
    assert ckpt.resume_digest(old) != ckpt.resume_digest(cfg)  # the digests do differ
    assert ckpt.check_config(path, state, cfg) == {}
    changed = load_config(SMOKE, ["adalora.budget=null", "adalora.target_rank=2"])
    with pytest.raises(ConfigError, match=r"adalora.target_rank '\(absent\)' -> 2.0"):
        ckpt.check_config(path, state, changed)



def test_a_key_added_since_the_checkpoint_at_its_default_does_not_strand_it(in_repo, tmp_path):
    """A key added with a default that keeps the old behaviour (task.format: auto, which
    reads the columns as before it existed) resumes a checkpoint that never recorded it;
    another value of it is a change, refused by name."""
    cfg = load_config(SMOKE)
    assert ckpt.flat_config(cfg)["task.format"] == "auto"
    old = {k: v for k, v in ckpt.flat_config(cfg).items() if k != "task.format"}
    state = {"config": old, "config_digest": ckpt.resume_digest(old)}
    path = tmp_path / "checkpoints" / "step-0000012"
    assert ckpt.check_config(path, state, cfg) == {}
    with pytest.raises(ConfigError, match=r"task.format '\(absent\)' -> 'alpaca'"):
        ckpt.check_config(path, state, load_config(SMOKE, ["task.format=alpaca"]))

# ------------------------------------------------------------------ 1b. changed data
def test_a_resume_on_changed_data_is_refused(smoke, tmp_path, baseline, in_repo):
    """Rows appended (T would change mid-run) or a label edited in place: refused like a
    config edit, nothing claimed; the data put back, the run ends as the uninterrupted one."""
    data = tmp_path / "sst2"
    shutil.copytree(ROOT / "tests/fixtures/glue/sst2", data)
    out = tmp_path / "run"
    assert forked(smoke(out, "train.save_every=3", f"task.data_dir={data}"),
                  "kill@step=14") == -9
    train = data / "train.jsonl"
    original = train.read_text()
    before = (out / "status.json").read_text()
    lines = original.splitlines(keepends=True)
    flipped = json.loads(lines[0])
    flipped["label"] = 1 - flipped["label"]
    for edited, change in ((original + "".join(lines[:3]), "train: 64 examples -> 67 examples"),
                           (json.dumps(flipped) + "\n" + "".join(lines[1:]),
                            "train: 64 examples as before, but their content differs")):
        train.write_text(edited)
        result = CliRunner().invoke(app, resume_args(out))
        assert result.exit_code == 2, result.output
        assert result.output.strip() == (
            f"error: the data of {out} changed since step-0000012 was saved ({change}); a "
            "resumed run must train on the same data: put the data back as it was, or start "
            "a new run")
        assert (out / "status.json").read_text() == before  # nothing was claimed or written
    train.write_text(original)
    assert forked(resume_args(out)) == 0
    assert same_outputs(out, baseline) == []


def test_a_checkpoint_without_a_data_record_resumes_with_a_note(killed, baseline):
    """Checkpoints written before the record existed cannot be checked: said, not refused."""
    out = killed
    for path in ckpt.checkpoints(out):
        state = torch.load(path / ckpt.STATE, weights_only=True)
        assert state["dataset"]["sizes"] == {"train": 64, "validation": 32}
        del state["dataset"]
        torch.save(state, path / ckpt.STATE)
    result = CliRunner().invoke(app, ["train", "--resume", str(out)])
    assert result.exit_code == 0, result.output
    assert ("note: step-0000012 was written before checkpoints recorded their data; "
            "resuming without checking that the data is the same") in result.output
    assert same_outputs(out, baseline) == []


def test_the_data_fingerprint_follows_content_and_order():
    import datasets

    from adalora_cli.engine.fingerprint import check_data, data_record, digest

    rows = [{"input_ids": [5, 6, 7], "labels": 0}, {"input_ids": [8], "labels": 1},
            {"input_ids": [9, 9], "labels": 1}]
    ds = datasets.Dataset.from_list(rows)
    assert digest(ds.select([0, 2])) == digest(datasets.Dataset.from_list([rows[0], rows[2]]))
    assert digest(ds) != digest(ds.select([1, 0, 2]))  # the order is part of the data
    edited = datasets.Dataset.from_list([rows[0], {**rows[1], "labels": 0}, rows[2]])
    assert digest(edited) != digest(ds)
    # a dataset that is not Arrow-backed (SQuAD's windows) is hashed item by item
    assert digest(rows) == digest([dict(r) for r in rows]) != digest(rows[::-1])
    record = data_record(ds, {"validation": ds.select([0])})
    assert record["sizes"] == {"train": 3, "validation": 1}
    check_data(Path("run/checkpoints/step-0000004"), record, record)  # the same: no error
    with pytest.raises(ConfigError) as err:
        check_data(Path("run/checkpoints/step-0000004"), record,
                   data_record(edited, {"validation": ds}))
    assert str(err.value).startswith(
        "the data of run changed since step-0000004 was saved (train: 3 examples as before, "
        "but their content differs; validation: 1 examples -> 3 examples); ")


# ------------------------------------------------------------------ 2. torn logs
def test_a_torn_log_is_cut_to_whole_rows_and_the_loss_is_said(killed, baseline):
    out = killed
    _, state = ckpt.load_checkpoint(ckpt.checkpoints(out)[-1])  # step 12
    streams = state["streams"]
    assert streams["rows"]["metrics.jsonl"] == 12  # one training row per step, no eval yet
    # a host crash: the log lost its last row and a half before the checkpoint's size
    data = (out / "metrics.jsonl").read_bytes()[:streams["metrics.jsonl"]]
    cut = data.rstrip(b"\n").rfind(b"\n")
    cut = data[:cut].rfind(b"\n") + 10  # mid-way into row 11
    (out / "metrics.jsonl").write_bytes(data[:cut])
    assert forked(resume_args(out)) == 0
    raw = (out / "metrics.jsonl").read_bytes()
    assert b"\0" not in raw
    rows = read_metrics(out)  # every line is JSON
    steps = [r["step"] for r in rows if "loss" in r]
    assert steps == list(range(1, 11)) + list(range(13, 33))  # 11 and 12 are gone, said so
    status = RunDir.read_status(out)
    assert status["resumes"][0]["log_rows_lost"] == (
        "metrics.jsonl lost 2 rows before the checkpoint")
    # the rows from the checkpoint on are the uninterrupted run's
    tail = [json.dumps(r) for r in rows if r["step"] >= 13]
    assert tail == [json.dumps(r) for r in read_metrics(baseline) if r["step"] >= 13]


def test_truncate_streams_cuts_a_torn_tail_and_never_pads(tmp_path):
    run = RunDir(tmp_path)
    for step in range(1, 6):
        run.log({"step": step, "loss": 0.5})
    run.log_ranks(2, {"a": 1})
    sizes = run.stream_sizes()
    assert sizes["rows"] == {"metrics.jsonl": 5, "rank_history.jsonl": 1}
    run.log({"step": 6, "loss": 0.5})  # written after the checkpoint: cut back
    run.close()
    full = (tmp_path / "metrics.jsonl").read_bytes()
    assert run.truncate_streams(sizes) is None
    assert (tmp_path / "metrics.jsonl").read_bytes() == full[:sizes["metrics.jsonl"]]
    # shorter than the checkpoint says, with half a row at the end
    (tmp_path / "metrics.jsonl").write_bytes(full[:sizes["metrics.jsonl"] - 30])
    (tmp_path / "rank_history.jsonl").unlink()
    lost = run.truncate_streams(sizes)
    assert lost == ("metrics.jsonl lost 2 rows before the checkpoint; "
                    "rank_history.jsonl is missing (1 rows)")
    assert (tmp_path / "metrics.jsonl").read_bytes() == b"".join(
        full.splitlines(keepends=True)[:3])
    run.log({"step": 4, "loss": 0.5})  # the row counts go on from the cut
    assert run.stream_sizes()["rows"]["metrics.jsonl"] == 4


# ------------------------------------------------------------------ 6. a damaged checkpoint
def test_a_corrupt_latest_checkpoint_falls_back_to_the_previous_one(killed, baseline):
    out = killed
    (ckpt.checkpoints(out)[-1] / ckpt.STATE).write_bytes(b"not a checkpoint")
    assert forked(resume_args(out)) == 0  # from step 9: the same run, three steps longer
    assert same_outputs(out, baseline) == []


def test_newest_readable_names_what_it_skipped(tmp_path):
    tensors = {"w": torch.zeros(2)}
    cfg = RunConfig()
    for step in (3, 6):
        ckpt.save_checkpoint(tmp_path, step, tensors, {"rng": [], **_state(cfg)}, keep=3)
    newest = ckpt.checkpoints(tmp_path)[-1]
    (newest / ckpt.TENSORS).write_bytes(b"\0" * 10)
    notes: list[str] = []
    path, state = ckpt.newest_readable(tmp_path, notes.append)
    assert path.name == "step-0000003" and state["step"] == 3
    assert len(notes) == 1 and str(newest) in notes[0] and "step-0000003" in notes[0]
    (path / ckpt.STATE).write_bytes(b"")
    with pytest.raises(ConfigError, match="no checkpoint of .* can be read"):
        ckpt.newest_readable(tmp_path)
    assert ckpt.newest_readable(tmp_path / "nothing") is None


def test_a_checkpoint_without_its_state_is_named_not_passed_over(tmp_path):
    """A step folder that lost state.pt used to be invisible: the resume fell back to an
    older checkpoint, or started the run over from step 0, without a word."""
    cfg = RunConfig()
    for step in (3, 6):
        ckpt.save_checkpoint(tmp_path, step, {"w": torch.zeros(2)},
                             {"rng": [], **_state(cfg)}, keep=3)
    (tmp_path / "checkpoints" / "step-0000006" / ckpt.STATE).unlink()
    notes: list[str] = []
    path, state = ckpt.newest_readable(tmp_path, notes.append)
    assert path.name == "step-0000003" and state["step"] == 3
    assert notes == [f"skipped unreadable checkpoint(s) {tmp_path}/checkpoints/step-0000006: "
                     f"no state.pt; resuming from step-0000003, the newest one that loads"]
    (path / ckpt.STATE).unlink()
    with pytest.raises(ConfigError) as err:  # not "no checkpoint yet: start over"
        ckpt.newest_readable(tmp_path)
    assert str(err.value) == (f"no checkpoint of {tmp_path} can be read ({tmp_path}/checkpoints/"
                              f"step-0000006: no state.pt); delete {tmp_path}/checkpoints to "
                              "start the run over")


def test_a_truncated_checkpoint_file_is_named(tmp_path):
    cfg = RunConfig()
    for step in (3, 6):
        ckpt.save_checkpoint(tmp_path, step, {"w": torch.zeros(64)},
                             {"rng": [], **_state(cfg)}, keep=3)
    tensors = tmp_path / "checkpoints" / "step-0000006" / ckpt.TENSORS
    tensors.write_bytes(tensors.read_bytes()[:-16])
    notes: list[str] = []
    path, _ = ckpt.newest_readable(tmp_path, notes.append)
    assert path.name == "step-0000003"
    assert notes == [f"skipped unreadable checkpoint(s) {tensors.parent}: ValueError: "
                     f"{ckpt.TENSORS} cannot be read (Error while deserializing "
                     "header: incomplete metadata, file not fully covered); resuming from "
                     "step-0000003, the newest one that loads"]
