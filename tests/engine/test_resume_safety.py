"""A resumed run is the same run, or it refuses: an edited config, a torn log and a damaged
checkpoint are each either handled exactly or refused in one line, never silently.

The smoke run killed after step 14 with ``save_every=3`` has checkpoints at 12 (and 9, 6
with ``keep_checkpoints=3``); resumed, it must end byte-identical to the uninterrupted run.
"""

from __future__ import annotations

import json

import pytest
import torch
import yaml

from adalora_cli.config import ConfigError, RunConfig, apply_overrides, from_dict, load_config
from adalora_cli.engine import checkpoint as ckpt
from adalora_cli.rundir.run import RunDir, read_metrics

from .conftest import SMOKE, forked, same_outputs


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
