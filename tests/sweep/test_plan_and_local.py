"""``adalora sweep``: budget matching (docs/maths.md#budget-levels), planning, manifests,
one-line errors,
and the smoke sweep end to end offline (run, skip, rerun an unfinished run, report)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from adalora_cli.cli import app
from adalora_cli.config import ConfigError, load_config
from adalora_cli.rundir.layout import SWEEP_LOG
from adalora_cli.rundir.run import is_finished
from adalora_cli.sweep.local import execute, gpu_slots, visible_gpus
from adalora_cli.sweep.plan import (
    PlannedRun,
    SweepSpec,
    build_spec,
    load_manifest,
    matched_sizes,
    plan,
    size_overrides,
)

ROOT = Path(__file__).resolve().parents[2]
SMOKE = "configs/smoke/glue.yaml"
# the n cache key: task family, model, target modules
DEBERTA = ("glue", "microsoft/deberta-v3-base", ())
runner = CliRunner()

# docs/maths.md#budget-levels, copied by hand: rbar -> (AdaLoRA r0, LoRA r, Houlsby d, Pfeiffer d)
SPEC_TABLE = {1: (2, 1, 4, 8), 2: (4, 2, 8, 16), 4: (6, 4, 16, 32), 8: (12, 8, 32, 64)}


@pytest.mark.parametrize("n", [72, 192, 12])  # DeBERTaV3-base, BART-large, the smoke model
@pytest.mark.parametrize("rbar", sorted(SPEC_TABLE))
def test_matched_sizes_follow_the_spec_table(n, rbar):
    s = matched_sizes(rbar * n, n)
    assert (s.init_rank, s.lora_r, s.houlsby_dim, s.pfeiffer_dim) == SPEC_TABLE[rbar]


def test_matched_sizes_outside_the_table():
    # rbar 16 (BART-large, Table 3's 2.20 %): r0 = ceil(1.5 * 16) = 24, r 16, d 64 / 128
    s = matched_sizes(3072, 192)
    assert (s.init_rank, s.lora_r, s.houlsby_dim, s.pfeiffer_dim) == (24, 16, 64, 128)
    # smoke model, b(T) 8: rbar 2/3 -> r0 ceil(1) = 1, r round(0.67) = 1, d 2.67 -> 3, 5.33 -> 5
    s = matched_sizes(8, 12)
    assert (s.init_rank, s.lora_r, s.houlsby_dim, s.pfeiffer_dim) == (1, 1, 3, 5)
    # b(T) 16: rbar 4/3 -> r0 ceil(2) = 2, r 1, d 5.33 -> 5, 10.67 -> 11
    s = matched_sizes(16, 12)
    assert (s.init_rank, s.lora_r, s.houlsby_dim, s.pfeiffer_dim) == (2, 1, 5, 11)
    for budget in range(1, 200):  # b0 = n * r0 never falls below b(T)
        assert matched_sizes(budget, 12).init_rank * 12 >= budget


def test_size_overrides_per_method():
    assert size_overrides("adalora", 144, 72) == ["adalora.budget=144", "adalora.init_rank=4"]
    assert size_overrides("lora", 576, 72) == ["lora.r=8"]
    assert size_overrides("houlsby", 288, 72) == ["adapter.dim=16"]
    assert size_overrides("pfeiffer", 288, 72) == ["adapter.dim=32"]
    assert size_overrides("bitfit", 144, 72) == size_overrides("full", 144, 72) == []
    assert size_overrides("lora", None, None) == []


def test_plan_from_a_config(in_repo):
    spec = build_spec(Path(SMOKE), "8,16", "adalora,lora,bitfit", "0,1")
    runs = plan(spec, n_cache={("glue", "tests/fixtures/tiny-bert", ()): 12})
    names = [r.name for r in runs]
    assert len(runs) == 2 * 2 * 2 + 2 and len(set(names)) == len(names)
    assert "glue-adalora-b8-s1" in names and "glue-bitfit-s0" in names
    run = next(r for r in runs if r.name == "glue-adalora-b16-s0")
    cfg = load_config(run.config, list(run.overrides))
    assert (cfg.adalora.budget, cfg.adalora.init_rank, cfg.train.seed) == (16, 2, 0)
    assert (cfg.sweep.budget_level, cfg.sweep.name) == (16, "smoke-glue")
    bitfit = load_config(SMOKE, list(next(r for r in runs if r.method == "bitfit").overrides))
    assert bitfit.sweep.budget_level is None


def test_table1_manifest_plan(in_repo):
    runs = plan(load_manifest(Path("experiments/table1_glue.yaml")), n_cache={DEBERTA: 72})
    # 8 tasks x (4 methods x 2 levels + 2 adapters x 1 level + bitfit + full) x 5 seeds
    assert len(runs) == 8 * 12 * 5
    sizes = {(r.method, r.budget_level, r.size) for r in runs}
    assert {("adalora", 576, "r0=12"), ("adalora", 144, "r0=4"), ("lora", 576, "r=8"),
            ("lora", 144, "r=2"), ("houlsby", 576, "d=32"), ("pfeiffer", 576, "d=64"),
            ("houlsby", 288, "d=16"), ("pfeiffer", 288, "d=32"), ("houlsby", 144, "d=8"),
            ("pfeiffer", 144, "d=16"), ("bitfit", None, ""), ("full", None, "")} == sizes
    full = next(r for r in runs if r.method == "full")
    assert load_config(full.config, list(full.overrides)).train.learning_rate == 2e-5


BART = ("summarization", "facebook/bart-large", ())
DEBERTA_QA = ("squad", "microsoft/deberta-v3-base", ())


@pytest.mark.parametrize("manifest, runs, sizes", [
    # Table 2 on DeBERTaV3-base (n 72): b(T) 72 / 576 are rbar 1 / 8
    ("table2_squad", 2 * 17 * 3, {("adalora", 72, "r0=2"), ("lora", 72, "r=1"),
                                  ("houlsby", 72, "d=4"), ("pfeiffer", 576, "d=64")}),
    # Table 3 on BART-large (n 192): b(T) 192 / 384 / 1536 / 3072 are rbar 1 / 2 / 8 / 16
    ("table3_summarization", 2 * 9 * 3, {("adalora", 192, "r0=2"), ("adalora", 384, "r0=4"),
                                         ("adalora", 3072, "r0=24"), ("lora", 1536, "r=8")}),
])
def test_squad_and_summarization_manifests(manifest, runs, sizes, in_repo):
    spec = load_manifest(Path(f"experiments/{manifest}.yaml"))
    if not all(c.is_file() for g in spec.groups for c in g.configs):
        pytest.skip("the task configs this manifest names are not in this checkout")
    planned = plan(spec, n_cache={DEBERTA_QA: 72, BART: 192})
    assert len(planned) == runs
    assert sizes <= {(r.method, r.budget_level, r.size) for r in planned}


def test_manifests_parse_and_name_missing_configs(in_repo, tmp_path):
    for path in sorted(Path("experiments").glob("*.yaml")):
        if path.name.startswith("tune_"):  # adalora tune's (tests/tune)
            with pytest.raises(ConfigError, match=f"{path} is a tune manifest"):
                load_manifest(path)
            continue
        spec = load_manifest(path)
        assert spec.groups and all(g.methods for g in spec.groups), path
    bad = tmp_path / "m.yaml"
    bad.write_text(yaml.safe_dump({"runs": [{"configs": ["configs/nope.yaml"],
                                             "methods": ["lora"]}]}))
    with pytest.raises(ConfigError, match=r"config configs/nope.yaml does not exist"):
        plan(load_manifest(bad))
    bad.write_text(yaml.safe_dump({"runs": [{"configs": [SMOKE], "method": ["lora"]}]}))
    with pytest.raises(ConfigError, match=r"runs\[0\]"):
        load_manifest(bad)


def test_smoke_manifest_plan(in_repo):
    runs = plan(load_manifest(Path("experiments/smoke.yaml")),
                n_cache={("glue", "tests/fixtures/tiny-bert", ()): 12})
    # b(T) 12 and 24 on 12 matrices: rbar 1 and 2, straight from the budget-levels table
    assert {(r.method, r.budget_level, r.size) for r in runs} == {
        ("adalora", 12, "r0=2"), ("adalora", 24, "r0=4"), ("lora", 12, "r=1"),
        ("lora", 24, "r=2")}


def test_gpu_slots():
    assert gpu_slots(2, ["0", "1"]) == ["0", "1"]
    assert gpu_slots(3, ["4", "7"]) == ["4", "7", "4"]
    assert gpu_slots(2, ["0"]) == [None, None]  # one GPU: leave the environment alone
    assert gpu_slots(1, []) == [None]


def test_visible_gpus_reads_the_environment(monkeypatch):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "2,3")
    assert visible_gpus() == ["2", "3"]


@pytest.mark.e2e
def test_failed_runs_are_recorded_and_the_others_go_on(tmp_path, in_repo):
    """Two runs that `adalora train` rejects (an unknown option fails fast, before the
    heavy imports): each fails in its own process, both at once (jobs=2), both logged."""
    runs = [PlannedRun(f"bad{i}", Path(SMOKE), "lora", None, 0, ("--no-such-option",), "")
            for i in range(2)]
    spec = SweepSpec("t", [], Path("x"))
    outcomes = execute(spec, runs, tmp_path, jobs=2, quiet=True)
    assert [o.status for o in outcomes] == ["failed", "failed"]
    assert all(o.error.startswith("exit 2:") for o in outcomes)
    assert "No such option" in (tmp_path / "logs" / "bad0.log").read_text()
    events = [json.loads(line) for line in (tmp_path / SWEEP_LOG).read_text().splitlines()]
    kinds = [(e["run"], e["event"]) for e in events]
    assert kinds[:2] == [("bad0", "started"), ("bad1", "started")]  # both ran at once
    assert sorted(kinds[2:]) == [("bad0", "failed"), ("bad1", "failed")]


@pytest.mark.e2e
def test_runs_join_as_others_end(tmp_path, in_repo):
    """``then`` is told every outcome as it comes, and the runs it returns join the queue
    (how a tune starts a cell's next trial without waiting for the others)."""
    def bad(i: int) -> PlannedRun:  # fails fast, before the heavy imports
        return PlannedRun(f"bad{i}", Path(SMOKE), "lora", None, 0, ("--no-such-option",), "")

    seen = []

    def then(o):
        seen.append(o.run.name)
        return [bad(2)] if o.run.name == "bad0" else []

    outcomes = execute(SweepSpec("t", [], Path("x")), [bad(0), bad(1)], tmp_path, jobs=2,
                       quiet=True, then=then)
    assert [o.run.name for o in outcomes] == ["bad0", "bad1", "bad2"]
    assert all(o.status == "failed" for o in outcomes) and sorted(seen) == ["bad0", "bad1",
                                                                             "bad2"]
    events = [json.loads(line) for line in (tmp_path / SWEEP_LOG).read_text().splitlines()]
    kinds = [(e["run"], e["event"]) for e in events]
    assert kinds.index(("bad2", "started")) > kinds.index(("bad0", "failed"))


def test_a_long_child_error_is_kept_whole(tmp_path):
    """A child's one-line error (a deep path makes it long) reaches the sweep's summary and
    ``--status`` whole: the fix is at its end (cut at 300 characters it lost "or upgrade
    transformers if the architecture is newer")."""
    from adalora_cli.sweep.runs import last_error
    from adalora_cli.sweep.status import _directory_state

    path = "/clusters/" + "deep-folder-name/" * 16 + "bert/config.json"
    line = (f"error: {path} has model_type 'brt', which transformers 5.24.0 does not know; "
            "did you mean 'bert'? fix it, or upgrade transformers if the architecture is newer")
    assert len(line) > 400
    log = tmp_path / "run.log"
    log.write_text(f"$ python -m adalora_cli train ...\n{line}\n")
    assert last_error(log) == line
    run = tmp_path / "run"
    run.mkdir()
    (run / "config.yaml").write_text("task: {}\n")
    (run / "status.json").write_text(json.dumps({"status": "failed", "error": line[7:]}))
    assert _directory_state(run) == ("failed", line[7:])


@pytest.mark.parametrize("args, fragment", [
    (["configs/nope.yaml"], "does not exist"),
    ([SMOKE, "--budget", "8,x"], "--budget takes a comma-separated list"),
    ([SMOKE, "--methods", "lora,vera"], "unknown method 'vera'"),
    ([SMOKE, "--seeds", "-1"], "--seeds takes"),
    ([SMOKE, "train.seed=3"], "set by the sweep itself"),
    ([SMOKE, "--jobs", "0"], "--jobs must be >= 1"),
])
def test_bad_input_one_line(args, fragment, in_repo, tmp_path):
    result = runner.invoke(app, ["sweep", *args, "--sweep-dir", str(tmp_path / "s")])
    assert result.exit_code == 2, result.output
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error:") and fragment in lines[0]
    assert not (tmp_path / "s").exists()


# --------------------------------------------------------------------------- end to end

SMOKE_ARGS = ["sweep", SMOKE, "--budget", "8,16", "--methods", "adalora,lora", "--seeds", "0,1"]
NAMES = sorted(f"glue-{m}-b{b}-s{s}" for m in ("adalora", "lora") for b in (8, 16)
               for s in (0, 1))


@pytest.fixture(scope="module")
def smoke_sweep(tmp_path_factory):
    """The issue's offline smoke sweep: 8 runs of the tiny model, one process each, two
    at a time (the same CPU time as one at a time on one core, half the wall on two)."""
    os.chdir(ROOT)
    where = tmp_path_factory.mktemp("sweep") / "smoke"
    result = runner.invoke(app, [*SMOKE_ARGS, "--sweep-dir", str(where), "--quiet",
                                 "--jobs", "2"])
    assert result.exit_code == 0, result.output
    return where


@pytest.mark.e2e
def test_smoke_sweep_runs_every_combination(smoke_sweep):
    assert sorted(p.name for p in smoke_sweep.iterdir() if (p / "status.json").exists()) == NAMES
    for name in NAMES:
        run = smoke_sweep / name
        assert is_finished(run)
        cfg = load_config(run / "config.yaml")
        summary = json.loads((run / "summary.json").read_text())
        level = 8 if "-b8-" in name else 16
        assert cfg.sweep.budget_level == summary["budget_level"] == level
        assert summary["epochs"] == 4  # the smoke config: 4 epochs of 8 steps
        if cfg.method.name == "adalora":  # r0 1 (b(T) 8) or 2 (16); the budget is kept
            assert cfg.adalora.init_rank == level // 8
            assert summary["final_budget"] == level
            # AdaLoRA's count: r0 * sum(d_in + d_out + 1) over the 12 tiny-BERT matrices
            per_rank = 2 * (4 * (32 + 32 + 1) + 2 * (32 + 37 + 1))
            assert summary["adapter_params"] == cfg.adalora.init_rank * per_rank
        else:
            assert cfg.lora.r == 1  # rbar 0.67 and 1.33 both round to 1
    assert (smoke_sweep / "sweep.yaml").is_file()
    assert len(list((smoke_sweep / "logs").glob("*.log"))) == 8
    for log in (smoke_sweep / "logs").glob("*.log"):  # the runs' progress, while they run
        assert any(line.startswith("step 32/32 (100%)  loss ")
                   for line in log.read_text().splitlines()), log
    events = [json.loads(line) for line in (smoke_sweep / SWEEP_LOG).read_text().splitlines()]
    assert sorted(e["run"] for e in events if e["event"] == "finished") == NAMES


@pytest.mark.e2e
def test_rerun_skips_finished_and_resumes_unfinished(smoke_sweep):
    broken = smoke_sweep / "glue-lora-b8-s1"
    (broken / "summary.json").unlink()  # as if the process had been killed mid-run
    (broken / "status.json").write_text(json.dumps({"status": "running", "pid": 999999999}))
    before = (smoke_sweep / "glue-adalora-b8-s0" / "summary.json").stat().st_mtime_ns
    result = runner.invoke(app, [*SMOKE_ARGS, "--sweep-dir", str(smoke_sweep), "--quiet"])
    assert result.exit_code == 0, result.output
    assert "1 finished now, 7 finished earlier (skipped)" in result.stdout
    assert is_finished(broken)
    assert (smoke_sweep / "glue-adalora-b8-s0" / "summary.json").stat().st_mtime_ns == before
    run_dirs = [p for p in smoke_sweep.iterdir() if (p / "status.json").exists()]
    assert len(run_dirs) == 8  # the unfinished one was continued in place, not duplicated
    events = [json.loads(line) for line in (smoke_sweep / SWEEP_LOG).read_text().splitlines()]
    resumed = [e for e in events if e["event"] == "resumed"]
    assert [(e["run"], e["previous_status"]) for e in resumed] == [(broken.name, "running")]
    # it had no checkpoint left (a finished run deletes them), so it started over, once
    assert json.loads((broken / "summary.json").read_text())["attempts"] == 2
    log = (smoke_sweep / "logs" / f"{broken.name}.log").read_text().splitlines()
    commands = [line for line in log if line.startswith("$ ")]  # the log keeps both attempts
    assert len(commands) == 2 and "--resume" in commands[1] and "--resume" not in commands[0]


@pytest.mark.e2e
def test_dry_run_lists_parameter_counts(smoke_sweep):
    result = runner.invoke(app, [*SMOKE_ARGS, "--sweep-dir", str(smoke_sweep), "--dry-run",
                                 "--methods", "adalora,lora,houlsby"], env={"COLUMNS": "200"})
    assert result.exit_code == 0, result.output
    text = result.stdout
    assert "12 runs planned, 4 would run" in text  # the houlsby runs; the rest finished
    # LoRA r = 1: r * sum(d_in + d_out) = 2 * (4 * 64 + 69 + 69) = 788 adapter parameters
    assert "788" in text and "skip (finished)" in text


@pytest.mark.e2e
def test_report_of_the_smoke_sweep(smoke_sweep, tmp_path):
    out = tmp_path / "report"
    result = runner.invoke(app, ["report", str(smoke_sweep.parent), "--format", "markdown",
                                 "--out", str(out)])
    assert result.exit_code == 0, result.output
    md = (out / "report.md").read_text()
    for line in ("| LoRA r=1 | 788 | 16 |", "| LoRA r=1 | 788 | 8 |", "| AdaLoRA |"):
        assert line in md
    assert md.count(" (2) |") == 4  # four rows, two seeds each
    figures = sorted(p.name for p in (out / "figures").glob("*.png"))
    assert figures == ["fig3_rank_sst2-adalora-b16.png", "fig3_rank_sst2-adalora-b8.png",
                       "fig4_budget_sst2.png", "fig5_orth_sst2.png"]
    result = runner.invoke(app, ["report", str(smoke_sweep), "--format", "all",
                                 "--out", str(tmp_path / "all"), "--no-figures"])
    assert result.exit_code == 0, result.output
    assert {p.name for p in (tmp_path / "all").iterdir()} == {
        "report.md", "report.tex", "results.csv", "training_cost.csv"}


def test_group_tags_name_runs_and_are_checked(in_repo, tmp_path):
    manifest = tmp_path / "m.yaml"
    group = {"configs": [SMOKE], "methods": ["lora"], "budgets": [12]}
    manifest.write_text(yaml.safe_dump({"name": "lrs", "runs": [
        {**group, "overrides": ["train.learning_rate=0.001"], "tag": "lr1e-3"},
        {**group, "overrides": ["train.learning_rate=0.002"], "tag": "lr2e-3"}]}))
    runs = plan(load_manifest(manifest), n_cache={("glue", "tests/fixtures/tiny-bert", ()): 12})
    lrs = {r.name: load_config(r.config, list(r.overrides)).train.learning_rate for r in runs}
    assert lrs == {"glue-lora-b12-lr1e-3-s0": 0.001, "glue-lora-b12-lr2e-3-s0": 0.002}
    # without the tags the two groups would write one directory: refused, naming the fix
    manifest.write_text(yaml.safe_dump({"runs": [
        {**group, "overrides": ["train.learning_rate=0.001"]},
        {**group, "overrides": ["train.learning_rate=0.002"]}]}))
    with pytest.raises(ConfigError, match=r"share the directory glue-lora-b12-s0; .*tag"):
        plan(load_manifest(manifest), n_cache={("glue", "tests/fixtures/tiny-bert", ()): 12})
    manifest.write_text(yaml.safe_dump({"runs": [{**group, "tag": "lr/2"}]}))
    with pytest.raises(ConfigError, match=r"runs\[0\]: tag 'lr/2' must be letters"):
        load_manifest(manifest)



@pytest.mark.parametrize("task", ["rotten_tomatoes", "bbc_topic"])
def test_budget_curve_manifest_matches_budgets_and_pools_seeds(task, in_repo):
    """experiments/budget_curve_<task>.yaml: AdaLoRA at b(T) for mean final rank 1/2/4/8 on
    the demo model's 36 matrices (counted from its config.json) against LoRA r = 1/2/4/8,
    two learning rates on seed 0, then seeds 1 and 2 at one of them; sizes worked out by
    hand from docs/maths.md#budget-levels (r0 = ceil(1.5 rbar), LoRA r = rbar)."""
    runs = plan(load_manifest(Path(f"experiments/budget_curve_{task}.yaml")))
    assert {r.config for r in runs} == {Path(f"configs/demo/{task}.yaml")}
    expected_size = {("adalora", 36): "r0=2", ("adalora", 72): "r0=4",
                     ("adalora", 144): "r0=6", ("adalora", 288): "r0=12",
                     ("lora", 36): "r=1", ("lora", 72): "r=2", ("lora", 144): "r=4",
                     ("lora", 288): "r=8"}
    assert {(r.method, r.budget_level): r.size for r in runs} == expected_size
    assert len(runs) == 8 * 2 + 8 * 2  # seed 0 at both rates, seeds 1 and 2 at the chosen
    configs = {r.name: load_config(r.config, list(r.overrides)) for r in runs}
    for cfg in configs.values():
        if cfg.method.name == "adalora":  # b(T) is the level; b0 = 36 r0 >= b(T)
            assert cfg.adalora.budget == cfg.sweep.budget_level <= 36 * cfg.adalora.init_rank
    for method, level in expected_size:
        mine = [r for r in runs if (r.method, r.budget_level) == (method, level)]
        seed0 = {configs[r.name].train.learning_rate for r in mine if r.seed == 0}
        later = {configs[r.name].train.learning_rate for r in mine if r.seed != 0}
        assert seed0 == {0.001, 0.002} and len(later) == 1 and later <= seed0
        assert sorted(r.seed for r in mine) == [0, 0, 1, 2]
        # the chosen rate's seed-0 run is the same experiment as seeds 1 and 2 (they pool)
        chosen = [configs[r.name] for r in mine if configs[r.name].train.learning_rate
                  in later]
        bare = [{**c.to_dict(), "train": {**c.to_dict()["train"], "seed": 0}} for c in chosen]
        assert all(b == bare[0] for b in bare)
