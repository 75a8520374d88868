"""Bad inputs through the CLI, as a user meets them: each is refused in one ``error:`` line
that names the problem and the fix, with exit code 2, no traceback, and nothing left behind
that looks like a run (or, where said, the input is left exactly as it was found).

Each case here was once accepted or refused badly: an infinite method setting trained NaNs,
an fp16 base failed at the first step on a CPU, a YAML alias bomb took minutes and printed
half a gigabyte, a refused ``--run-dir`` kept our lock file, links led a report, a resume
and a sweep outside where they belong, and ``predict`` answered rows that held nothing.
"""

from __future__ import annotations

import json
import os
import typing
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from adalora_cli.cli import app
from adalora_cli.config import ConfigError, RunConfig, load_config
from adalora_cli.engine import precision as precision_module
from tests.conftest import ROOT, copy_of

SMOKE = "configs/smoke/glue.yaml"
SMOKE_LM = "configs/smoke/causal_lm.yaml"
SHORT = ("method.name=lora", "train.max_steps=2")
"""The shared two-step LoRA runs other tests train too (tests/test_full_disk_names.py)."""


def cli(*args: str):
    """``adalora ARGS`` from the repository root (the smoke configs name their fixtures
    relative to it); the result and its output lines that are not blank."""
    with pytest.MonkeyPatch.context() as mp:
        mp.chdir(ROOT)
        result = CliRunner().invoke(app, [str(a) for a in args])
    return result, [line for line in result.output.splitlines() if line.strip()]


def refused(*args: str) -> str:
    """The one error line of a command refused as bad input (exit 2, no traceback)."""
    result, lines = cli(*args)
    assert result.exit_code == 2, result.output
    assert result.exception is None or isinstance(result.exception, SystemExit)
    assert "Traceback" not in result.output
    errors = [line for line in lines if line.startswith("error:")]
    assert len(errors) == 1, result.output
    return errors[0]


# ------------------------------------------------------------------ non-finite settings
@pytest.mark.parametrize("key, value", [("loraplus.lr_ratio", ".inf"), ("rslora.alpha", ".inf"),
                                        ("sora.l1", ".inf"), ("increlora.alpha", ".inf"),
                                        ("dora.alpha", ".nan"), ("sora.xi_max", "-.inf")])
def test_an_infinite_method_setting_is_refused_before_the_run(tmp_path, key, value):
    method = key.split(".")[0]
    line = refused("train", SMOKE, f"method.name={method}", f"{key}={value}",
                   "--run-dir", tmp_path / "run", "--quiet")
    number = {".inf": "inf", ".nan": "nan", "-.inf": "-inf"}[value]
    assert line == f"error: {key} must be a finite number, got {number}"
    assert not (tmp_path / "run").exists()


def float_keys() -> list[str]:
    """Every float key of every section, found from the dataclasses (``float`` or
    ``float | None``), so a section added later is covered without naming it here."""
    keys = []
    for section, hint in typing.get_type_hints(RunConfig).items():
        for name, field_hint in typing.get_type_hints(hint).items():
            if field_hint is float or float in typing.get_args(field_hint):
                keys.append(f"{section}.{name}")
    return keys


def test_every_float_key_of_every_section_refuses_inf_and_nan():
    keys = float_keys()
    # the four the checks found, and optional floats (None or a number) too
    assert {"loraplus.lr_ratio", "rslora.alpha", "sora.l1", "increlora.alpha",
            "train.learning_rate", "adalora.target_rank", "pissa.alpha"} <= set(keys)
    for key in keys:
        for value, shown in ((".inf", "inf"), (".nan", "nan"), ("-.inf", "-inf")):
            with pytest.raises(ConfigError) as err:
                load_config(ROOT / SMOKE, [f"{key}={value}"])
            assert str(err.value) == f"{key} must be a finite number, got {shown}", key


# ------------------------------------------------------------------ an fp16 base on a CPU
@pytest.mark.parametrize("precision, native", [("auto", True), ("bf16", True),
                                               ("bf16", False)])
def test_an_fp16_base_on_a_cpu_is_refused_before_the_run(tmp_path, monkeypatch, precision,
                                                         native):
    """``auto`` is bf16 on a CPU with native bf16 (made so here, whatever this CPU has), and
    the CPU's kernels refuse an fp16 weight beside bf16 activations."""
    monkeypatch.setattr(precision_module, "cpu_bf16_native", lambda: native)
    line = refused("train", SMOKE, *SHORT, "model.base_dtype=fp16",
                   f"train.precision={precision}", "train.device=cpu",
                   "--run-dir", tmp_path / "run", "--quiet")
    assert line == ("error: model.base_dtype=fp16 does not run on a CPU (device cpu): its one "
                    "half precision is bf16; use model.base_dtype=bf16 with "
                    "train.precision=bf16, or model.base_dtype=fp32 (or auto)")
    assert not (tmp_path / "run").exists()


# ------------------------------------------------------------------ huge YAML values
def alias_bomb(depth: int) -> str:
    """A YAML list of 10**depth leaves in a few hundred bytes: each list names the one
    before it ten times."""
    lists = ['&a0 ["x", "x", "x", "x", "x", "x", "x", "x", "x", "x"]']
    lists += [f"&a{i} [" + ", ".join([f"*a{i - 1}"] * 10) + "]" for i in range(1, depth)]
    return "[" + ", ".join(lists) + "]"


def smoke_with_seed(tmp_path: Path, seed: str) -> Path:
    text = (ROOT / SMOKE).read_text()
    assert "\n  seed: 0\n" in text
    path = tmp_path / "config.yaml"
    path.write_text(text.replace("\n  seed: 0\n", f"\n  seed: {seed}\n"))
    return path


@pytest.mark.parametrize("depth", [6, 9])
def test_a_yaml_alias_bomb_is_refused_in_one_short_line(tmp_path, depth):
    config = smoke_with_seed(tmp_path, alias_bomb(depth))
    assert config.stat().st_size < 2000
    line = refused("train", config, "--run-dir", tmp_path / "run", "--quiet")
    assert line == (f"error: {config} cannot be read: its aliases (*name) expand it to more "
                    "than 100,000 values; a config is far smaller, so write its values out "
                    "instead of repeating aliases")
    assert not (tmp_path / "run").exists()


def test_a_yaml_value_that_holds_itself_is_refused(tmp_path):
    line = refused("train", smoke_with_seed(tmp_path, "&me [1, *me]"), "--dry-run")
    assert "it holds itself through an alias" in line


@pytest.mark.parametrize("seed, start", [
    (alias_bomb(4), "error: train.seed must be an integer, got [['x', 'x', 'x', "),
    ('"' + "7x" * 500_000 + '"', "error: train.seed must be an integer, got '7x7x7x"),
])
def test_a_long_value_is_quoted_cut_short(tmp_path, seed, start):
    """10,000 leaves (under the alias limit) or a string of a million characters: the
    error line quotes the value's start, not all of it."""
    line = refused("train", smoke_with_seed(tmp_path, seed), "--dry-run")
    assert line.startswith(start) and "..." in line
    assert len(line) <= len("error: train.seed must be an integer, got ") + 120


# ------------------------------------------------------------------ --run-dir
@pytest.mark.parametrize("how", ["folder", "link"])
def test_a_refused_run_dir_is_left_exactly_as_found(tmp_path, how):
    folder = tmp_path / "notes"
    folder.mkdir()
    (folder / "notes.txt").write_text("mine\n")
    run_dir = folder
    if how == "link":
        run_dir = tmp_path / "link"
        run_dir.symlink_to(folder)
    line = refused("train", SMOKE, *SHORT, "--run-dir", run_dir, "--quiet")
    assert line == (f"error: run directory {run_dir} already exists and is not empty; choose "
                    "another --run-dir (runs are never overwritten)")
    assert sorted(os.listdir(folder)) == ["notes.txt"]  # no .lock, nothing else
    assert (folder / "notes.txt").read_text() == "mine\n"
    assert run_dir.is_symlink() is (how == "link")


@pytest.mark.parametrize("below", [False, True])
def test_a_run_dir_through_a_dangling_link_is_one_line(tmp_path, below):
    link = tmp_path / "link"
    link.symlink_to(tmp_path / "nowhere")
    run_dir = link / "run" if below else link
    line = refused("train", SMOKE, *SHORT, "--run-dir", run_dir, "--quiet")
    where = f" lies under {link}, which" if below else ""
    assert line == (f"error: run directory {run_dir}{where} is a symbolic link to "
                    f"{tmp_path / 'nowhere'}, which does not exist; create that folder "
                    "first, or choose another --run-dir")
    assert link.is_symlink() and not (tmp_path / "nowhere").exists()
    assert sorted(os.listdir(tmp_path)) == ["link"]


# ------------------------------------------------------------------ links around runs
def test_report_says_which_link_it_did_not_follow(smoke_runs, tmp_path):
    run = smoke_runs(SMOKE, *SHORT)
    runs = tmp_path / "runs"
    runs.mkdir()
    (runs / "best").symlink_to(run)
    result, lines = cli("report", runs, "--format", "markdown")
    assert result.exit_code == 2, result.output
    assert lines == [
        f"warning: skipped {runs / 'best'}: a symbolic link to {run.resolve()}, not followed "
        f"(a run reached through a link could be counted twice); pass {run.resolve()} itself "
        "to report it",
        f"error: no finished runs under {runs}"]
    # the link named itself is read: it is the run the user asked for
    result, lines = cli("report", runs / "best", "--format", "markdown")
    assert result.exit_code == 0, result.output
    assert any("LoRA" in line for line in lines)


@pytest.fixture(scope="module")
def stopped_run(tmp_path_factory):
    """An AdaLoRA smoke run SIGKILLed at step 11 with a checkpoint at step 9 (in a forked
    process, as the resume tests stop theirs): both its streams hold rows."""
    from tests.engine.conftest import forked, smoke_args

    out = tmp_path_factory.mktemp("stopped") / "run"
    with pytest.MonkeyPatch.context() as mp:
        mp.chdir(ROOT)
        assert forked(smoke_args(out, "train.save_every=3"), "kill@step=11") == -9
    assert (out / "checkpoints" / "step-0000009").is_dir()
    return out


@pytest.mark.parametrize("stream", ["metrics.jsonl", "rank_history.jsonl"])
def test_a_resume_never_writes_through_a_linked_stream(stopped_run, tmp_path, stream):
    run = copy_of(stopped_run, tmp_path / "run")
    outside = tmp_path / f"elsewhere-{stream}"
    (run / stream).rename(outside)
    (run / stream).symlink_to(outside)
    before = outside.read_bytes()
    assert before.count(b"\n") >= 2  # rows after the checkpoint: a resume would cut them
    line = refused("train", "--resume", run, "--quiet")
    assert line == (f"error: run {run} cannot be resumed: its {stream} is a symbolic link to "
                    f"{outside}, and resuming would write through it; replace the link with "
                    "a copy of what it points to, then resume")
    assert outside.read_bytes() == before
    assert (run / stream).is_symlink()
    assert json.loads((run / "status.json").read_text())["status"] == "running"  # as found


# ------------------------------------------------------------------ names that are paths
def write_manifest(path: Path, **fields) -> Path:
    path.write_text(yaml.safe_dump({**fields, "runs": [
        {"configs": [str(ROOT / SMOKE)], "methods": ["lora"],
         "overrides": ["train.max_steps=2"]}]}))
    return path


@pytest.mark.parametrize("name", ["../../escaped", "ABSOLUTE", "..", "a/b"])
def test_a_manifest_name_that_is_a_path_is_refused(tmp_path, name):
    if name == "ABSOLUTE":
        name = str(tmp_path / "escaped")
    manifest = write_manifest(tmp_path / "m.yaml", name=name)
    line = refused("sweep", manifest, "--dry-run")
    assert line == (f"error: {manifest}: name {name!r} must be letters, digits, '.', '_' or "
                    "'-', not only dots (it names the sweep's folder, runs/<name>), e.g. "
                    "name: table1_glue; pick where the sweep goes with --sweep-dir")
    assert not (tmp_path / "escaped").exists()


@pytest.mark.parametrize("name", ["../x", "/tmp/x", "..", "a\\b"])
def test_a_tracker_run_name_that_is_a_path_is_refused(tmp_path, name):
    line = refused("train", SMOKE, *SHORT, f"log.run_name={name}",
                   f"log.tensorboard_dir={tmp_path / 'tb'}", "--run-dir", tmp_path / "run")
    assert line == (f"error: log.run_name {name!r} is a path, not a name (TensorBoard writes "
                    "into a folder of that name under log.tensorboard_dir); give a plain name "
                    "without / or \\, e.g. log.run_name=rte-lora-lr2e-3")
    assert sorted(os.listdir(tmp_path)) == []


# ------------------------------------------------------------------ predict
@pytest.mark.parametrize("config, column, value, what", [
    (SMOKE_LM, "prompt", None, "null"),
    (SMOKE, "sentence", "", "empty"),
    (SMOKE, "sentence", None, "null"),
    (SMOKE, "sentence", "   ", "empty"),
])
def test_predict_refuses_a_row_with_nothing_to_predict_from(smoke_runs, tmp_path, config,
                                                            column, value, what):
    run = smoke_runs(config, *SHORT)
    rows = tmp_path / "rows.jsonl"
    rows.write_text("".join(json.dumps({"id": f"r{i}", column: v}) + "\n" for i, v in
                            enumerate(["a question we can answer ?", value, "fine ."])))
    out = tmp_path / "out.jsonl"
    line = refused("predict", run, "--input", rows, "--output", out, "--quiet")
    assert line == (f"error: --input {rows}: row 2 (id 'r1') has {what} {column!r}; every row "
                    "needs one to predict from: fill it in or drop the row")
    assert sorted(os.listdir(tmp_path)) == ["rows.jsonl"]


# ------------------------------------------------------------------ keys that mean nothing
def test_a_revision_of_local_files_is_refused(tmp_path):
    line = refused("train", SMOKE, *SHORT, "task.revision=junk", "--run-dir", tmp_path / "run")
    assert line == ("error: task.revision 'junk' pins a revision of a hub dataset, but "
                    "task.data_dir reads local files, which have none; drop one of them "
                    "(task.data_dir=null reads the hub at that revision, task.revision=null "
                    "the local files)")
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize("override, line", [
    ("task.packing=true", "error: task.packing cannot change in eval: it packs training rows, "
                          "and eval trains nothing"),
    ("task.revision=junk", "error: task.revision 'junk' pins a revision of a hub dataset, but "
                           "task.data_dir reads local files, which have none; drop one of "
                           "them (task.data_dir=null reads the hub at that revision, "
                           "task.revision=null the local files)"),
])
def test_eval_refuses_what_it_would_ignore(smoke_runs, override, line):
    run = smoke_runs(SMOKE, *SHORT)  # refused before anything is written (the fixture checks)
    assert refused("eval", run, override) == line
    assert not (run / "eval").exists()


def test_eval_of_a_pinned_hub_run_on_local_files_drops_the_revision(smoke_runs, tmp_path):
    """A run trained on a hub revision, scored again on local files: the revision does not
    apply to them, and is not refused as if the user had set both."""
    from adalora_cli.artifacts.rescore import eval_config

    run = copy_of(smoke_runs(SMOKE, *SHORT), tmp_path / "run")
    config = yaml.safe_load((run / "config.yaml").read_text())
    config["task"].update(data_dir=None, revision="abc123")
    (run / "config.yaml").write_text(yaml.safe_dump(config))
    with pytest.MonkeyPatch.context() as mp:
        mp.chdir(ROOT)
        cfg = eval_config(run, ["task.data_dir=tests/fixtures/glue/sst2"])
    assert cfg.task.revision is None and cfg.task.data_dir.endswith("tests/fixtures/glue/sst2")


# ------------------------------------------------------------------ a sharded sweep
@pytest.mark.parametrize("source", ["manifest", "config"])
def test_a_sharded_sweep_on_one_process_per_run_is_refused_at_planning(tmp_path, source):
    if source == "manifest":
        args = [write_manifest(tmp_path / "m.yaml", name="sharded"), "train.sharding=fsdp"]
    else:
        args = [SMOKE, "train.max_steps=2", "train.sharding=fsdp", "--methods", "lora,adalora"]
    line = refused("sweep", *args, "--sweep-dir", tmp_path / "sweep", "--dry-run")
    which = ("run glue-lora-s0 sets" if source == "manifest" else
             "2 runs (glue-lora-s0, ...) set")
    assert line == (f"error: {which} train.sharding=fsdp, which needs several processes per "
                    "run, but a local sweep starts each run as one process; give each run its "
                    "GPUs on SLURM (--launcher slurm --slurm gpus_per_job=N, N >= 2), train "
                    "it alone (adalora train CONFIG --nproc N), or drop train.sharding=fsdp")
    assert not (tmp_path / "sweep").exists()
    # where each run gets two processes (a SLURM job of two GPUs), the plan stands
    result, _ = cli("sweep", *args, "--sweep-dir", tmp_path / "sweep", "--dry-run",
                    "--launcher", "slurm", "--slurm", "gpus_per_job=2,time=1:00:00")
    assert result.exit_code == 0, result.output
